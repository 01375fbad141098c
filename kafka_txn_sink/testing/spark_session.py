"""A local SparkSession for tests of pipelines that end in ``format("kafka_txn")``.

Local mode on the loopback address, the Spark packages pyspark does not ship (Kafka source and
sink, Avro) on ``spark.jars``, times in UTC, and the Python workers running this interpreter (so
they import the packages of the test's environment, this one included).
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from kafka_txn_sink.testing.errors import TestbedError
from kafka_txn_sink.testing.processes import LOOPBACK, java_executable

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

BOOTSTRAP_CONF = "spark.kafka_txn_sink.testing.bootstrap"
"""The session's Kafka bootstrap address: ``read_committed`` reads it when none is given."""

DEFAULT_CONF: dict[str, str] = {
    "spark.ui.enabled": "false",
    "spark.sql.shuffle.partitions": "2",
    "spark.sql.session.timeZone": "UTC",
}


def local_spark(
    jars: Sequence[str],
    conf: Mapping[str, str] | None = None,
    *,
    master: str = "local[2]",
    app_name: str = "kafka_txn_sink_tests",
) -> SparkSession:
    """Start (or get) the local SparkSession: ``DEFAULT_CONF``, ``jars``, then ``conf``.

    Unless set already, ``PYSPARK_PYTHON`` becomes this interpreter and ``SPARK_LOCAL_IP``
    the loopback address, in this process's environment.

    Raises:
        TestbedError: Java or PySpark is not installed (Spark's driver runs on Java).
    """
    java_executable("Spark runs on it")
    try:
        from pyspark.sql import SparkSession
    except ModuleNotFoundError as exc:
        raise TestbedError(
            "PySpark is not installed in this environment: pip install "
            "'kafka-txn-sink[spark,testing]' (or use the PySpark your platform provides)"
        ) from exc
    # Environment, not settings: Spark's lookup of Python data sources (format("kafka_txn"))
    # starts its Python worker from PYSPARK_PYTHON alone, and the JVM inherits both now.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", LOOPBACK)
    builder = SparkSession.builder.master(master).appName(app_name)
    settings = {**DEFAULT_CONF, "spark.jars": ",".join(jars), **(conf or {})}
    for key, value in settings.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    return spark


JVM_EXIT_TIMEOUT_S = 30.0


def stop_spark(spark: SparkSession) -> None:
    """Stop ``spark`` and the JVM it ran in, waiting at most ``JVM_EXIT_TIMEOUT_S`` for it.

    ``spark.stop()`` alone leaves the JVM running until the interpreter exits, and with it
    Spark's cached Kafka producers, which retry a broker the test bed has stopped already.
    A later ``local_spark`` starts a new JVM.
    """
    from pyspark import SparkContext

    gateway = SparkContext._gateway
    spark.stop()
    if gateway is None:
        return
    process = getattr(gateway, "proc", None)  # set by pyspark's launch_gateway
    gateway.shutdown()
    SparkContext._gateway = None
    SparkContext._jvm = None
    if process is None:
        return
    # The JVM's gateway server exits when its stdin closes.
    if process.stdin is not None:
        process.stdin.close()
    try:
        process.wait(timeout=JVM_EXIT_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(timeout=JVM_EXIT_TIMEOUT_S)
