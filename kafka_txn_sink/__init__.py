"""kafka_txn_sink: exactly-once delivery from Spark Structured Streaming to Kafka.

Use it as `df.writeStream.format("kafka_txn")`; the top-level module `pyspark_kafka_txn` lets
Spark find it without `register()`, which stays available for explicit registration.

`KAFKA_TXN_SINK_LOG_LEVEL=DEBUG` (or INFO, ...) in the environment of Spark's Python workers
(`spark.executorEnv.*` for executors) sends the sink's log records, and kafka-python's, to
stderr at that level: they are Spark's processes, whose Python logging nobody else configures.
"""

from __future__ import annotations

import logging
import os
from typing import TYPE_CHECKING

__version__ = "0.1.0"
__all__ = ["__version__", "register"]

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

LOG_LEVEL_ENV = "KAFKA_TXN_SINK_LOG_LEVEL"


def _log_to_stderr(level: str) -> None:
    """The sink's loggers and its driver's Kafka client's (kafka-python) to stderr at `level`;
    no other logger changes (py4j's, at DEBUG, would print every option sent to Spark)."""
    handler = logging.StreamHandler()
    handler.setFormatter(
        logging.Formatter("%(asctime)s %(process)d %(name)s %(levelname)s %(message)s")
    )
    for name in ("kafka_txn_sink", "kafka"):
        logger = logging.getLogger(name)
        logger.setLevel(level.upper())
        logger.addHandler(handler)
        logger.propagate = False


if os.environ.get(LOG_LEVEL_ENV):
    _log_to_stderr(os.environ[LOG_LEVEL_ENV])


def register(spark: SparkSession) -> None:
    """Register `format("kafka_txn")` with `spark` (see `kafka_txn_sink.datasource.register`)."""
    from kafka_txn_sink.datasource import register as _register

    _register(spark)
