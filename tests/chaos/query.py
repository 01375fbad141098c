"""The suite's one streaming query, run as examples/pipeline.py in a process tree the suite
can hold at a failpoint, release, kill, and start again from the same checkpoint."""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kafka_txn_sink import failpoints
from tests.chaos import procs

ROOT = Path(__file__).resolve().parents[2]
PIPELINE = ROOT / "examples" / "pipeline.py"
FAILED = 3  # examples/pipeline.py's exit status when the query failed
REACH_S = 300.0  # a restart, a re-run batch and the fresh one, on a busy 2-core machine
EXIT_S = 420.0  # the query drains its backlog after a fault it survives
_EXCEPTION = re.compile(r"(\w+(?:Error|Exception)): ([^\n]*)")
_WRAPPERS = {"StreamingQueryException", "SparkException", "PythonException", "Py4JJavaError"}

_LIVE: dict[int, Running] = {}


class FaultNotFired(AssertionError):
    """The planned fault did not strike: the failpoint was not reached, or no process found."""


@dataclass(frozen=True)
class QuerySpec:
    """What examples/pipeline.py needs to run the sink; the same on every restart."""

    bootstrap: str
    input: str
    output: str
    sink_id: str
    commit_log: str
    checkpoint: Path
    jars: str
    max_offsets: int
    options: dict[str, str] = field(default_factory=dict)
    select: tuple[str, ...] = ()
    master: str = "local[2,4]"

    def args(self) -> list[str]:
        args = [
            sys.executable, str(PIPELINE), "--bootstrap", self.bootstrap, "--input", self.input,
            "--output", self.output, "--sink-id", self.sink_id, "--commit-log", self.commit_log,
            "--checkpoint", str(self.checkpoint), "--max-offsets", str(self.max_offsets),
            "--master", self.master, "--jars", self.jars,
        ]  # fmt: skip
        for key, value in self.options.items():
            args += ["--option", f"{key}={value}"]
        for expression in self.select:
            args += ["--select", expression]
        return args


@dataclass
class Running:
    """One run of the query; its output, Spark's log and the failpoint signals in `directory`."""

    process: subprocess.Popen[bytes]
    directory: Path
    notes: dict[str, Any] = field(default_factory=dict)  # what a strike did, even if it failed

    @property
    def signals(self) -> Path:
        return self.directory / "failpoints"

    def hits(self, point: str) -> list[dict[str, Any]]:
        path = self.signals / f"{point}.reached"
        if not path.exists():
            return []
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]

    def wait_reached(self, point: str, timeout_s: float) -> dict[str, Any]:
        """The first hit of `point`; FaultNotFired when the query ends or times out first."""
        self.wait_for(lambda: bool(self.hits(point)), point, timeout_s)
        return self.hits(point)[0]

    def wait_for(self, done: Callable[[], bool], what: str, timeout_s: float) -> None:
        """Until `done()`; FaultNotFired when the query ends or times out before `what`."""
        deadline = time.monotonic() + timeout_s
        while not done():
            if self.process.poll() is not None:
                raise FaultNotFired(
                    f"the query ended (exit {self.process.returncode}) before {what}: "
                    f"{self.error()}"
                )
            if time.monotonic() > deadline:
                raise FaultNotFired(f"{what} was not reached within {timeout_s:.0f} s")
            time.sleep(0.1)

    def release(self, point: str) -> None:
        failpoints.release(self.signals, point)

    def wait_exit(self, timeout_s: float) -> int | None:
        """The exit status, or None when the query was still running at the deadline (then
        it is killed)."""
        try:
            return self.process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.kill()
            return None

    def kill(self) -> list[int]:
        _LIVE.pop(self.process.pid, None)
        return procs.kill_tree(self.process)

    def result(self) -> dict[str, Any]:
        """The JSON line examples/pipeline.py printed last, if any."""
        path = self.directory / "pipeline.out"
        lines = [x for x in path.read_text().splitlines() if x.startswith("{")]
        body: dict[str, Any] = json.loads(lines[-1]) if lines else {}
        return body

    def error(self) -> str:
        """The query's error in one line: the innermost exception Spark's wrappers carry (or
        the tail of Spark's log), at most 300 characters."""
        message = str(self.result().get("error", ""))
        log = (self.directory / "spark.log").read_text(errors="replace").strip()
        if not message:
            return " | ".join(log.splitlines()[-3:])[:300]
        # Spark's message may carry only its wrappers ("Writing job failed"): the cause is
        # then the last exception of the Python traceback in Spark's log.
        causes = [m for m in _EXCEPTION.findall(message) if m[0] not in _WRAPPERS]
        causes = causes or [m for m in _EXCEPTION.findall(log) if m[0] not in _WRAPPERS][-1:]
        return (f"{causes[0][0]}: {causes[0][1]}" if causes else message.splitlines()[0])[:300]


def finish(running: Running, timeout_s: float = EXIT_S) -> dict[str, Any]:
    """How the query ended after a fault it may survive."""
    code = running.wait_exit(timeout_s)
    if code is None:
        return {"outcome": f"hung: killed after {timeout_s:.0f} s"}
    if code == 0:
        return {"outcome": "drained"}
    return {"outcome": f"failed: {running.error()}"}


def start(spec: QuerySpec, directory: Path, failpoint_spec: str = "") -> Running:
    """Start the query in a new session; it dies with this process if the suite is killed."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "failpoints").mkdir(exist_ok=True)
    env = {
        **os.environ,
        "PYSPARK_PYTHON": sys.executable,
        "PYSPARK_DRIVER_PYTHON": sys.executable,
        "SPARK_LOCAL_IP": "127.0.0.1",
        # Past a task's first 10 records, proof by acknowledged counts and produce() from C
        # (kafka/quiet.py): the suite's small batches would otherwise never reach them.
        "KAFKA_TXN_SINK_REPORTED_RECORDS": "10",
        **failpoints.environment(failpoint_spec, directory / "failpoints", max_s=300),
    }
    with (
        (directory / "pipeline.out").open("wb") as out,
        (directory / "spark.log").open("wb") as err,
    ):
        process = subprocess.Popen(
            spec.args(), env=env, stdout=out, stderr=err, stdin=subprocess.DEVNULL,
            start_new_session=True, cwd=ROOT, preexec_fn=_die_with_parent,
        )  # fmt: skip
    running = Running(process, directory)
    _LIVE[process.pid] = running
    return running


def kill_all() -> None:
    """Kill every query this process started and that still runs (at exit, on Ctrl-C)."""
    for running in list(_LIVE.values()):
        with contextlib.suppress(Exception):
            running.kill()


atexit.register(kill_all)


def _die_with_parent() -> None:
    """SIGKILL the driver when the suite dies; the JVM exits when its stdin (the driver) goes."""
    pr_set_pdeathsig = 1
    ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGKILL)


def fresh_batch(checkpoint: Path) -> int:
    """The first batch id the query has never planned: one past the last in offsets/."""
    offsets = checkpoint / "offsets"
    planned = (
        [int(p.name) for p in offsets.glob("*") if p.name.isdigit()] if offsets.is_dir() else []
    )
    return max(planned, default=-1) + 1
