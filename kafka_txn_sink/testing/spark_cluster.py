"""A Spark standalone cluster on the loopback address, for tests whose executors live in JVMs of
their own: one master and N workers started from an installed PySpark (``bin/spark-class``; the
pip package has no ``sbin`` scripts), each in its own process group.

Executors run the Python given to the cluster; ``wheel_venv`` makes one where the package is
installed from its wheel, as a user has it. Tests find the executor JVM that holds a task and
SIGKILL it (``executor_of``, ``kill_executor``).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

from kafka_txn_sink.testing.errors import TestbedError
from kafka_txn_sink.testing.processes import (
    LOOPBACK,
    free_port,
    java_executable,
    spawn,
    tail,
    terminate,
    wait_for,
)
from kafka_txn_sink.testing.processes import parent_pid as _parent
from kafka_txn_sink.testing.processes import pids as _pids

START_TIMEOUT_S = 120.0
EXECUTOR_MAIN = "org.apache.spark.executor.CoarseGrainedExecutorBackend"
_ANCESTRY_LIMIT = 64  # parents walked up from a process to its executor JVM


@dataclass(frozen=True)
class Executor:
    """An executor JVM of a running application: the worker that started it and its pid."""

    worker: int
    pid: int


class SparkCluster:
    """A standalone master and ``workers`` workers (one core, 1 GiB each) under ``workdir``.

    Use as a context manager, or call ``start`` and ``stop``. ``python`` is the interpreter
    whose PySpark runs the cluster and which the executors' Python workers run.
    """

    def __init__(self, workdir: Path, workers: int = 2, python: str = sys.executable) -> None:
        self.workdir = workdir
        self.python = python
        self.worker_count = workers
        self.port = free_port()
        self.webui_port = free_port()
        self._master: subprocess.Popen[bytes] | None = None
        self._workers: list[subprocess.Popen[bytes]] = []

    @property
    def master_url(self) -> str:
        """What ``--master`` / ``SparkSession.builder.master`` takes."""
        return f"spark://{LOOPBACK}:{self.port}"

    def start(self) -> SparkCluster:
        """Start the master, then the workers; return once the master has them all ALIVE.

        Raises:
            TestbedError: Java is missing, or the cluster did not come up in time.
        """
        java_executable("Spark's standalone master and workers run on it")
        spark_class = spark_home(self.python) / "bin" / "spark-class"
        env = self._environment()
        self._master = spawn(
            [
                str(spark_class),
                "org.apache.spark.deploy.master.Master",
                "--host",
                LOOPBACK,
                "--port",
                str(self.port),
                "--webui-port",
                str(self.webui_port),
            ],
            self.workdir / "master.log",
            self.workdir,
            detached=False,
            env=env,
        )
        for index in range(self.worker_count):
            work_dir = self.worker_dir(index)
            work_dir.mkdir(parents=True, exist_ok=True)
            self._workers.append(
                spawn(
                    [
                        str(spark_class),
                        "org.apache.spark.deploy.worker.Worker",
                        self.master_url,
                        "--host",
                        LOOPBACK,
                        "--port",
                        str(free_port()),
                        "--webui-port",
                        str(free_port()),
                        "--cores",
                        "1",
                        "--memory",
                        "1g",
                        "--work-dir",
                        str(work_dir),
                    ],
                    self.workdir / f"worker-{index}.log",
                    self.workdir,
                    detached=False,
                    env=env,
                )
            )
        wait_for(
            self._all_workers_alive,
            START_TIMEOUT_S,
            f"{self.worker_count} ALIVE workers at {self.master_url}",
            on_timeout=self._logs,
        )
        return self

    def stop(self) -> None:
        """End the workers (and with them their executors), then the master."""
        for proc in self._workers:
            terminate(proc, timeout=20.0)
        if self._master is not None:
            terminate(self._master, timeout=20.0)

    def __enter__(self) -> SparkCluster:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()

    def worker_dir(self, index: int) -> Path:
        """The work dir of worker ``index``: one folder per application it ran executors of."""
        return self.workdir / f"worker-{index}"

    def applications_on(self, index: int) -> list[str]:
        """The ids of the applications that worker ``index`` started executors for."""
        work_dir = self.worker_dir(index)
        return sorted(p.name for p in work_dir.iterdir() if p.is_dir()) if work_dir.exists() else []

    def status(self) -> dict[str, object]:
        """The master's JSON status (workers, applications)."""
        url = f"http://{LOOPBACK}:{self.webui_port}/json/"
        with urllib.request.urlopen(url, timeout=5) as response:
            status: dict[str, object] = json.load(response)
        return status

    def workers_alive(self) -> int:
        """How many workers the master counts ALIVE."""
        workers = self.status().get("workers")
        if not isinstance(workers, list):
            return 0
        return sum(1 for w in workers if w.get("state") == "ALIVE")

    def executors(self) -> list[Executor]:
        """The executor JVMs the workers are running now."""
        parents = {proc.pid: index for index, proc in enumerate(self._workers)}
        found = []
        for pid in _pids():
            worker = parents.get(_parent(pid) or -1)
            if worker is not None and EXECUTOR_MAIN in _cmdline(pid):
                found.append(Executor(worker, pid))
        return found

    def executor_of(self, pid: int) -> Executor | None:
        """The executor JVM that ``pid`` (e.g. a Python worker running a task) descends from."""
        by_pid = {e.pid: e for e in self.executors()}
        current: int | None = pid
        for _ in range(_ANCESTRY_LIMIT):
            if current is None or current <= 1:
                return None
            if current in by_pid:
                return by_pid[current]
            current = _parent(current)
        return None

    def kill_executor(self, executor: Executor, timeout: float = 30.0) -> None:
        """SIGKILL the executor JVM alone (as the kernel's OOM killer would) and wait until its
        worker has seen it go."""
        os.kill(executor.pid, signal.SIGKILL)
        wait_for(
            lambda: None if executor in self.executors() else True,
            timeout,
            f"executor {executor.pid} of worker {executor.worker} to end",
        )

    def _all_workers_alive(self) -> bool | None:
        for proc in [p for p in (self._master, *self._workers) if p is not None]:
            if proc.poll() is not None:
                raise TestbedError(f"a Spark daemon exited with {proc.returncode}\n" + self._logs())
        return True if self.workers_alive() == self.worker_count else None

    def _environment(self) -> dict[str, str]:
        return spark_environment(self.python, self.workdir)

    def _logs(self) -> str:
        names = ["master.log", *(f"worker-{i}.log" for i in range(self.worker_count))]
        return "\n".join(tail(self.workdir / name, 30) for name in names)


def wheel_venv(workdir: Path, source: Path, spark_version: str, timeout: float = 900.0) -> str:
    """A new venv under ``workdir`` with the package installed from a wheel built from
    ``source`` (a copy of its tracked and new files, so no stale ``build/`` is packed) and
    ``pyspark==spark_version``; its interpreter's path. pip's cache is reused.

    Raises:
        TestbedError: a step failed or ran over ``timeout``, or the package imports from
            anywhere but the venv.
    """
    copy = workdir / "source"
    _copy_sources(source, copy, timeout)
    dist, venv = workdir / "dist", workdir / "venv"
    _run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(dist), str(copy)],
        workdir,
        timeout,
        "build the wheel",
    )
    wheel = next(dist.glob("kafka_txn_sink-*.whl"))
    _run([sys.executable, "-m", "venv", str(venv)], workdir, timeout, "make the venv")
    python = str(venv / "bin" / "python")
    _run(
        [python, "-m", "pip", "install", "-q", f"{wheel}[spark]", f"pyspark=={spark_version}"],
        workdir,
        timeout,
        "install the wheel",
    )
    where = _run(
        [python, "-c", "import kafka_txn_sink; print(kafka_txn_sink.__file__)"],
        workdir,
        timeout,
        "import the package",
    )
    if venv.resolve() not in Path(where.strip()).resolve().parents:
        raise TestbedError(f"kafka_txn_sink imports from {where.strip()}, not from {venv}")
    return python


def _copy_sources(source: Path, target: Path, timeout: float) -> None:
    listed = _run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        source,
        timeout,
        "list the sources",
    )
    for name in filter(None, listed.split("\0")):
        origin = source / name
        if origin.is_file():
            (target / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(origin, target / name)


def _run(cmd: list[str], cwd: Path, timeout: float, what: str) -> str:
    try:
        done = subprocess.run(
            cmd, cwd=cwd, capture_output=True, text=True, timeout=timeout, check=False
        )
    except subprocess.TimeoutExpired:
        raise TestbedError(f"{what}: timed out after {timeout:.0f}s: {cmd}") from None
    if done.returncode != 0:
        raise TestbedError(f"{what} failed ({done.returncode}): {cmd}\n{done.stderr[-3000:]}")
    return done.stdout


def spark_environment(python: str, workdir: Path) -> dict[str, str]:
    """This process's environment for a Spark daemon of ``python``'s PySpark, whose Python
    workers run ``python``: on loopback, with an empty conf dir under ``workdir`` so that no
    site settings leak into the test bed."""
    conf_dir = workdir / "conf"
    conf_dir.mkdir(parents=True, exist_ok=True)
    return {
        **os.environ,
        "SPARK_HOME": str(spark_home(python)),
        "SPARK_CONF_DIR": str(conf_dir),
        "SPARK_LOCAL_IP": LOOPBACK,
        "SPARK_LOCAL_HOSTNAME": LOOPBACK,
        "PYSPARK_PYTHON": python,
    }


def spark_home(python: str) -> Path:
    """The directory of ``python``'s PySpark (its ``bin``, ``jars``).

    Raises:
        TestbedError: ``python`` has no PySpark.
    """
    found = subprocess.run(
        [python, "-c", "import os, pyspark; print(os.path.dirname(pyspark.__file__))"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    if found.returncode != 0:
        raise TestbedError(f"no PySpark in {python}: {found.stderr[-1000:]}")
    return Path(found.stdout.strip())


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
    except OSError:
        return ""
