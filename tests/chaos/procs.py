"""The query's process tree: the driver, its JVM, and the pyspark daemons in their own groups.

pyspark's daemons call `setpgid(0, 0)`, so a SIGKILL of the driver's process group alone would
leave them (and the commit worker, where the driver's failpoints fire) running. These helpers
walk /proc instead (the tree itself and `kill_tree`: the test kit's kafka_txn_sink.testing.
processes).
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from pathlib import Path

from kafka_txn_sink.testing.processes import descendants
from kafka_txn_sink.testing.processes import kill_tree as kill_tree  # query.py's
from kafka_txn_sink.testing.processes import parent_pid as parent_of
from kafka_txn_sink.testing.processes import running as alive

TASK_WORKER_DAEMON = "pyspark.daemon pyspark.worker"


def command_line(pid: int) -> str:
    try:
        return (Path("/proc") / str(pid) / "cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def task_workers(root: int) -> list[int]:
    """Python workers that run Spark tasks: children the task daemon forked under `root`."""
    daemons = {p for p in descendants(root) if TASK_WORKER_DAEMON in command_line(p)}
    return sorted(p for p in descendants(root) if parent_of(p) in daemons)


def wait_gone(pids: list[int], timeout_s: float) -> list[int]:
    """Wait until none of `pids` is alive; returns those still alive at the deadline."""
    deadline = time.monotonic() + timeout_s
    left = [p for p in pids if alive(p)]
    while left and time.monotonic() < deadline:
        time.sleep(0.1)
        left = [p for p in left if alive(p)]
    return left


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
