"""A Spark Connect server on the loopback address, started from an installed PySpark, for tests
whose queries a Connect client sends (``SparkSession.builder.remote(server.url)``).

PySpark's pip package has the server's jar (``pyspark/jars/spark-connect_*.jar``, 4.0 on) but
not ``sbin/start-connect-server.sh``, which is ``spark-submit --class`` of the server's main
class; that is what ``start`` runs, in a process group of its own. Its Python workers run
``python`` (``PYSPARK_PYTHON``): the package must be installed there for
``format("kafka_txn")`` to resolve by its short name. ``kill`` SIGKILLs the server's whole
process tree, as a lost machine would; ``start`` again brings it back at the same URL.
"""

from __future__ import annotations

import socket
import subprocess
from collections.abc import Mapping
from pathlib import Path
from types import TracebackType

from kafka_txn_sink.testing.errors import TestbedError
from kafka_txn_sink.testing.processes import (
    LOOPBACK,
    free_port,
    java_executable,
    kill_tree,
    spawn,
    tail,
    wait_for,
)
from kafka_txn_sink.testing.spark_cluster import spark_environment

SERVER_CLASS = "org.apache.spark.sql.connect.service.SparkConnectServer"
START_TIMEOUT_S = 120.0
# What examples/pipeline.py sets on a session of its own: over Connect only the server can.
DEFAULT_CONF = {
    "spark.ui.enabled": "false",
    "spark.sql.shuffle.partitions": "4",
    "spark.python.worker.reuse": "true",
}


class SparkConnectServer:
    """A Spark Connect server of ``python``'s PySpark with ``jars`` (e.g. Spark's Kafka
    connector), its logs under ``workdir`` (one file per start).

    ``env`` is added to the server's environment, which its Python workers inherit (e.g. the
    failpoints' variables). Use as a context manager, or call ``start`` and ``stop``.
    """

    def __init__(
        self,
        workdir: Path,
        python: str,
        jars: list[str],
        master: str = "local[2,4]",
        env: Mapping[str, str] | None = None,
        conf: Mapping[str, str] | None = None,
    ) -> None:
        self.workdir = workdir
        self.python = python
        self.jars = jars
        self.master = master
        self.env = dict(env or {})
        self.conf = {**DEFAULT_CONF, **(conf or {})}
        self.port = free_port()
        self.starts = 0
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        """What ``SparkSession.builder.remote`` takes."""
        return f"sc://{LOOPBACK}:{self.port}"

    @property
    def log(self) -> Path:
        """The log of the latest start."""
        return self.workdir / f"connect-server-{self.starts}.log"

    def start(self) -> SparkConnectServer:
        """Start the server; return once it accepts connections at ``url``.

        Raises:
            TestbedError: Java or PySpark is missing, this server runs already, another
                process holds its port, the server exited, or it did not listen within
                START_TIMEOUT_S.
        """
        java_executable("the Spark Connect server runs on it")
        if self._proc is not None:
            raise TestbedError(f"the Spark Connect server at {self.url} runs already")
        if self._accepts():
            raise TestbedError(
                f"another process listens at {self.url}: stop it, or make a "
                "new SparkConnectServer (a new free port)"
            )
        env = {**spark_environment(self.python, self.workdir), **self.env}
        self.starts += 1
        command = [
            str(Path(env["SPARK_HOME"]) / "bin" / "spark-submit"),
            "--class",
            SERVER_CLASS,
            "--master",
            self.master,
            "--driver-memory",
            "1g",
        ]
        if self.jars:
            command += ["--jars", ",".join(self.jars)]
        settings = {
            **self.conf,
            "spark.local.dir": str(self.workdir / "local"),
            "spark.connect.grpc.binding.address": LOOPBACK,
            "spark.connect.grpc.binding.port": str(self.port),
        }
        for key, value in settings.items():
            command += ["--conf", f"{key}={value}"]
        self._proc = spawn(command, self.log, self.workdir, detached=False, env=env)
        wait_for(
            self._listening,
            START_TIMEOUT_S,
            f"the Spark Connect server at {self.url}",
            on_timeout=lambda: tail(self.log, 40),
        )
        return self

    def kill(self, grace: float = 0.0) -> None:
        """SIGKILL the server's JVM and every process below it (its Python workers too),
        after SIGTERM and up to ``grace`` seconds if given."""
        if self._proc is not None:
            kill_tree(self._proc, grace=grace)
            self._proc = None

    def stop(self) -> None:
        """End the server: SIGTERM, then SIGKILL of whatever of its tree is left."""
        self.kill(grace=20.0)

    def __enter__(self) -> SparkConnectServer:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()

    def _listening(self) -> bool | None:
        if self._proc is None or self._proc.poll() is not None:
            code = None if self._proc is None else self._proc.returncode
            raise TestbedError(
                f"the Spark Connect server exited with {code}\n" + tail(self.log, 40)
            )
        return True if self._accepts() else None

    def _accepts(self) -> bool:
        try:
            with socket.create_connection((LOOPBACK, self.port), timeout=2):
                return True
        except OSError:
            return False
