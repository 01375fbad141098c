"""The query's process tree: the driver, its JVM, and the pyspark daemons in their own groups.

pyspark's daemons call `setpgid(0, 0)`, so a SIGKILL of the driver's process group alone would
leave them (and the commit worker, where the driver's failpoints fire) running. These helpers
walk /proc instead.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from pathlib import Path

TASK_WORKER_DAEMON = "pyspark.daemon pyspark.worker"


def children_by_parent() -> dict[int, list[int]]:
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        parent = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(parent, []).append(int(entry.name))
    return children


def descendants(root: int) -> list[int]:
    """Every live process below `root`, parents before children."""
    children = children_by_parent()
    found: list[int] = []
    pending = [root]
    while pending:
        for child in children.get(pending.pop(0), []):
            found.append(child)
            pending.append(child)
    return found


def command_line(pid: int) -> str:
    try:
        return (Path("/proc") / str(pid) / "cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def parent_of(pid: int) -> int | None:
    try:
        stat = (Path("/proc") / str(pid) / "stat").read_text()
    except OSError:
        return None
    return int(stat.rsplit(")", 1)[1].split()[1])


def task_workers(root: int) -> list[int]:
    """Python workers that run Spark tasks: children the task daemon forked under `root`."""
    daemons = {p for p in descendants(root) if TASK_WORKER_DAEMON in command_line(p)}
    return sorted(p for p in descendants(root) if parent_of(p) in daemons)


def alive(pid: int) -> bool:
    """True while `pid` exists and is not a zombie."""
    try:
        stat = (Path("/proc") / str(pid) / "stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def wait_gone(pids: list[int], timeout_s: float) -> list[int]:
    """Wait until none of `pids` is alive; returns those still alive at the deadline."""
    deadline = time.monotonic() + timeout_s
    left = [p for p in pids if alive(p)]
    while left and time.monotonic() < deadline:
        time.sleep(0.1)
        left = [p for p in left if alive(p)]
    return left


def kill_tree(process: subprocess.Popen[bytes], timeout_s: float = 30) -> list[int]:
    """SIGKILL the query: its process group and every descendant in other groups.

    The group is frozen first (SIGSTOP), so the JVM cannot start a new Python worker between
    the listing and the kill. Returns the pids killed (the group leader first)."""
    if process.poll() is not None:
        return []
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGSTOP)
    pids = [process.pid, *descendants(process.pid)]
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
    process.wait(timeout=timeout_s)
    left = wait_gone(pids, timeout_s)
    if left:
        raise RuntimeError(f"processes {left} of the query survived SIGKILL")
    return pids


def kill_worker(pid: int, timeout_s: float = 30) -> None:
    os.kill(pid, signal.SIGKILL)
    if wait_gone([pid], timeout_s):
        raise RuntimeError(f"python worker {pid} survived SIGKILL")


def freeze_tree(root: int) -> list[int]:
    """SIGSTOP `root` and every descendant (the pyspark daemons are in other groups); the
    pids frozen, none when `root` has ended."""
    if not alive(root):
        return []
    frozen = []
    for pid in [root, *descendants(root)]:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGSTOP)
            frozen.append(pid)
    return frozen


def thaw(pids: list[int]) -> None:
    """SIGCONT every pid of `pids` that still exists."""
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGCONT)
