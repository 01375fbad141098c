"""Lets Spark find `format("kafka_txn")` by itself: Spark imports top-level `pyspark_*` modules
and registers their `DefaultSource`. Importing it has no side effects."""

from kafka_txn_sink.datasource import KafkaTxnDataSource as DefaultSource

__all__ = ["DefaultSource"]
