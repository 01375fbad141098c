"""Orders from a Kafka topic to Kafka and to Avro files, exactly once: a pipeline to copy.

``parse_orders`` is the logic; ``start_orders_to_kafka`` and ``start_orders_to_files`` start the
streaming queries that write it with ``format("kafka_txn")`` until the input is drained.
``test_orders_pipeline.py`` beside it tests both with the fixtures of ``kafka_txn_sink.testing``
(a real broker, S3 server and SparkSession) and chispa.
"""

from __future__ import annotations

from collections.abc import Mapping

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.streaming import DataStreamWriter, StreamingQuery

ORDER_SCHEMA = "order_id STRING, customer STRING, amount DECIMAL(10,2), ts TIMESTAMP"


def read_orders(spark: SparkSession, bootstrap: str, topic: str) -> DataFrame:
    """The records of ``topic``, from its start, as a stream (Spark's Kafka source)."""
    return (
        spark.readStream.format("kafka")
        .option("kafka.bootstrap.servers", bootstrap)
        .option("subscribe", topic)
        .option("startingOffsets", "earliest")
        .load()
    )


def parse_orders(records: DataFrame) -> DataFrame:
    """Kafka records whose value is a JSON order -> typed orders; records that are not an
    order, and orders of no amount, are dropped."""
    orders = records.select(
        F.from_json(F.col("value").cast("string"), ORDER_SCHEMA).alias("order")
    ).select("order.*")
    return orders.where(F.col("order_id").isNotNull() & (F.col("amount") > 0))


def start_orders_to_kafka(
    orders: DataFrame,
    *,
    bootstrap: str,
    topic: str,
    sink_id: str,
    commit_log: str,
    checkpoint: str,
    options: Mapping[str, str] | None = None,
) -> StreamingQuery:
    """Each order to ``topic`` exactly once, as a JSON value keyed by its customer."""
    records = orders.select(
        F.col("customer").alias("key"), F.to_json(F.struct(*orders.columns)).alias("value")
    )
    writer = records.writeStream.format("kafka_txn").option("topic", topic)
    return _start(writer, bootstrap, sink_id, commit_log, checkpoint, options)


def start_orders_to_files(
    orders: DataFrame,
    *,
    bootstrap: str,
    path: str,
    references_topic: str,
    sink_id: str,
    commit_log: str,
    checkpoint: str,
    options: Mapping[str, str] | None = None,
) -> StreamingQuery:
    """Each order in exactly one Avro file under ``path`` (a directory per customer), and one
    reference message per file to ``references_topic``."""
    writer = (
        orders.writeStream.format("kafka_txn")
        .option("path", path)
        .option("referencesTopic", references_topic)
        .option("partitionBy", "customer")
    )
    return _start(writer, bootstrap, sink_id, commit_log, checkpoint, options)


def _start(
    writer: DataStreamWriter,
    bootstrap: str,
    sink_id: str,
    commit_log: str,
    checkpoint: str,
    options: Mapping[str, str] | None,
) -> StreamingQuery:
    """Start ``writer`` with the sink's common options; it stops once the input is drained."""
    return (
        writer.option("kafka.bootstrap.servers", bootstrap)
        .option("sinkId", sink_id)
        .option("commitLog", commit_log)
        .option("checkpointLocation", checkpoint)
        .options(**(options or {}))
        .trigger(availableNow=True)
        .start()
    )
