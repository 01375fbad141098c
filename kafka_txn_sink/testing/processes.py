"""Processes of the test bed: spawn, terminate, and wait for them within bounds.

Every process spawned here without ``detached`` is ended at exit and, on Linux, dies with the
thread that started it, so a test run that is itself killed leaves no broker behind.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TypeVar

from kafka_txn_sink.testing.errors import TestbedError

LOOPBACK = "127.0.0.1"

T = TypeVar("T")


# --------------------------------------------------------------------------------------------
# Bounded waiting
# --------------------------------------------------------------------------------------------


def wait_for(
    probe: Callable[[], T | None],
    timeout: float,
    what: str,
    interval: float = 0.5,
    on_timeout: Callable[[], str] = lambda: "",
) -> T:
    """Call ``probe`` until it returns something other than None, or raise after ``timeout``.

    Exceptions from ``probe`` count as "not yet"; the last one is reported on timeout.
    """
    deadline = time.monotonic() + timeout
    last_error = ""  # a repr only: a kept exception would keep the probe's clients alive
    while True:
        try:
            result = probe()
        except TestbedError:
            raise
        except Exception as exc:
            last_error, result = repr(exc), None
        if result is not None:
            return result
        if time.monotonic() >= deadline:
            detail = f"; last error: {last_error}" if last_error else ""
            raise TestbedError(
                f"timed out after {timeout:.0f}s waiting for {what}{detail}\n" + on_timeout()
            )
        time.sleep(interval)


_LENT_PORTS: set[int] = set()
_LOWEST_PORT = 10000
SPARK_CONNECT_DEFAULT_PORT = 15002
"""Never lent: `spark-pipelines run` (local) always serves Spark Connect there."""


def free_port() -> int:
    """A currently free TCP port on the loopback address, below the kernel's ephemeral range.

    A port of ``bind(0)`` is ephemeral: a client's outgoing connection can take it between this
    call and the server's own bind. Ports are drawn at random so that parallel test processes
    rarely try the same one, and never twice in one process.
    """
    ephemeral_low = _ephemeral_low()
    for _ in range(200):
        port = random.randrange(_LOWEST_PORT, ephemeral_low)
        if port not in _LENT_PORTS and port != SPARK_CONNECT_DEFAULT_PORT and bindable(port):
            _LENT_PORTS.add(port)
            return port
    raise TestbedError(f"no free loopback port found in {_LOWEST_PORT}-{ephemeral_low - 1}")


def _ephemeral_low() -> int:
    try:
        low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32768  # Linux's default; other systems start theirs at 49152 or above
    return max(low, _LOWEST_PORT + 1000)


def bindable(port: int) -> bool:
    """Whether `port` on the loopback address can be bound now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((LOOPBACK, port))
        except OSError:
            return False
    return True


def tail(path: Path, lines: int = 50) -> str:
    """The last ``lines`` lines of a text file, or a note that it does not exist."""
    if not path.exists():
        return f"({path} does not exist)"
    text = path.read_text(errors="replace").splitlines()[-lines:]
    return f"--- last {len(text)} lines of {path} ---\n" + "\n".join(text)


# --------------------------------------------------------------------------------------------
# The tools the test bed runs
# --------------------------------------------------------------------------------------------


def java_executable(needed_for: str) -> str:
    """``java`` on PATH, else ``$JAVA_HOME/bin/java``; a TestbedError saying what needs it."""
    found = shutil.which("java")
    java_home = os.environ.get("JAVA_HOME")
    if found is None and java_home and (Path(java_home) / "bin" / "java").is_file():
        found = str(Path(java_home) / "bin" / "java")
    if found is None:
        raise TestbedError(
            f"Java (java) is not on PATH nor in $JAVA_HOME: {needed_for}; install a JDK 17 or 21"
        )
    return found


def javac_executable(needed_for: str) -> str:
    """``javac`` beside the ``java`` the test bed runs (so both are one JDK), else
    ``$JAVA_HOME/bin/javac``, else on PATH; a TestbedError naming javac and what needs it."""
    java = Path(java_executable(needed_for)).resolve()
    java_home = os.environ.get("JAVA_HOME")
    beside = [java.parent / "javac", *([Path(java_home) / "bin" / "javac"] if java_home else [])]
    found = next((str(path) for path in beside if path.is_file()), None) or shutil.which("javac")
    if found is None:
        raise TestbedError(
            f"the Java compiler (javac) is neither beside {java}, in $JAVA_HOME nor on PATH: "
            f"{needed_for}; install a JDK 17 or 21, not only a JRE"
        )
    return found


def maven_executable() -> str:
    """``mvn`` on PATH; a TestbedError saying what needs it."""
    found = shutil.which("mvn")
    if found is None:
        raise TestbedError(
            "Maven (mvn) is not on PATH: it resolves the test bed's jars (Apache "
            "Kafka's broker, Spark's Kafka connector, the Schema Registry) from "
            "Maven Central; install Maven 3"
        )
    return found


# --------------------------------------------------------------------------------------------
# Spawning and ending
# --------------------------------------------------------------------------------------------

_LIVE: dict[int, subprocess.Popen[bytes]] = {}


def _cleanup_all() -> None:
    for proc in list(_LIVE.values()):
        terminate(proc, timeout=10.0)


atexit.register(_cleanup_all)


def _die_with_parent() -> None:
    """In the child before exec: SIGKILL it when the thread that started it dies (Linux), so a
    test run that is itself killed leaves no broker behind."""
    import ctypes

    pr_set_pdeathsig = 1
    ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGKILL)


def spawn(
    cmd: list[str], log_path: Path, cwd: Path, detached: bool, env: Mapping[str, str] | None = None
) -> subprocess.Popen[bytes]:
    """Start ``cmd`` in its own process group, output appended to ``log_path``.

    Unless ``detached``, it is ended at exit and dies with the thread that started it."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    tie = not detached and sys.platform.startswith("linux")
    with log_path.open("ab") as log:
        proc = subprocess.Popen(
            cmd,
            cwd=cwd,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env=dict(env) if env is not None else None,
            preexec_fn=_die_with_parent if tie else None,
        )
    if not detached:
        _LIVE[proc.pid] = proc
    return proc


def signal_group(pid: int, sig: signal.Signals) -> None:
    """Send ``sig`` to the process group ``pid``; a group that is gone is not an error."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)


def terminate(
    proc: subprocess.Popen[bytes], timeout: float, sig: signal.Signals = signal.SIGTERM
) -> None:
    """Signal the process group, wait up to ``timeout``, then SIGKILL it."""
    _LIVE.pop(proc.pid, None)
    if proc.poll() is None:
        signal_group(proc.pid, signal.SIGCONT)  # a paused process cannot handle SIGTERM
        signal_group(proc.pid, sig)
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            signal_group(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
    signal_group(proc.pid, signal.SIGKILL)  # leftovers of the group, if any


def pid_alive(pid: int) -> bool:
    """Whether a process ``pid`` exists (possibly another user's)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def terminate_pid(pid: int, timeout: float = 30.0) -> None:
    """Stop a process group started by another run of this module (``down``)."""
    signal_group(pid, signal.SIGCONT)
    signal_group(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while pid_alive(pid) and time.monotonic() < deadline:
        time.sleep(0.2)
    signal_group(pid, signal.SIGKILL)


# --------------------------------------------------------------------------------------------
# Process trees
# --------------------------------------------------------------------------------------------


def pids() -> list[int]:
    """Every process id in /proc now."""
    return [int(p.name) for p in Path("/proc").iterdir() if p.name.isdigit()]


def _stat(pid: int) -> list[str]:
    """The fields of /proc/<pid>/stat after the name (state, parent, ...); [] when gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return []
    return stat.rsplit(")", 1)[1].split()  # the name in parentheses may hold spaces


def parent_pid(pid: int) -> int | None:
    """The parent of ``pid``, or None when it is gone."""
    fields = _stat(pid)
    return int(fields[1]) if fields else None


def running(pid: int) -> bool:
    """Whether ``pid`` exists and is not a zombie (dead, waiting to be reaped)."""
    fields = _stat(pid)
    return bool(fields) and fields[0] != "Z"


def descendants(pid: int) -> list[int]:
    """Every process below ``pid`` now, whatever its process group, parents before children."""
    children: dict[int, list[int]] = {}
    for each in pids():
        children.setdefault(parent_pid(each) or 0, []).append(each)
    found: list[int] = []
    pending = [pid]
    while pending:
        below = children.get(pending.pop(0), [])
        found += below
        pending += below
    return found


def kill_tree(
    proc: subprocess.Popen[bytes], timeout: float = 30.0, grace: float = 0.0
) -> list[int]:
    """SIGKILL ``proc``, its process group and every process below it, as a machine's crash
    would (after SIGTERM to the group and up to ``grace`` seconds, if given). PySpark's
    daemons put themselves in groups of their own, so the group alone would leave them (and
    the driver's Python workers) running; the group is frozen first (SIGSTOP), so that its
    JVM starts no new worker between the listing and the kill.

    Returns:
        The pids killed, ``proc`` first; none when it had ended.
    Raises:
        TestbedError: one of them outlived ``timeout``.
    """
    _LIVE.pop(proc.pid, None)
    if proc.poll() is not None:
        return []
    before = descendants(proc.pid) if grace > 0 else []
    if grace > 0:
        signal_group(proc.pid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=grace)
    signal_group(proc.pid, signal.SIGSTOP)
    tree = list(dict.fromkeys([proc.pid, *descendants(proc.pid), *before]))
    for pid in tree:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
    signal_group(proc.pid, signal.SIGKILL)
    proc.wait(timeout=timeout)
    deadline = time.monotonic() + timeout
    while any(running(pid) for pid in tree):
        if time.monotonic() > deadline:
            left = [pid for pid in tree if running(pid)]
            raise TestbedError(f"processes {left} of {proc.pid} outlived SIGKILL")
        time.sleep(0.1)
    return tree
