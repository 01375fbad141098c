"""kafka_txn_sink: exactly-once delivery from Spark Structured Streaming to Kafka.

Use it as `df.writeStream.format("kafka_txn")`; the top-level module `pyspark_kafka_txn` lets
Spark find it without `register()`, which stays available for explicit registration.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

__version__ = "0.1.0"
__all__ = ["__version__", "register"]

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


def register(spark: SparkSession) -> None:
    """Register `format("kafka_txn")` with `spark` (see `kafka_txn_sink.datasource.register`)."""
    from kafka_txn_sink.datasource import register as _register

    _register(spark)
