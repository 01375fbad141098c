"""Tests of orders_pipeline.py with the test kit of kafka_txn_sink and chispa.

The fixtures ``kts_spark``, ``kts_kafka``, ``kts_s3`` and ``kts_s3_bucket`` come from the pytest
plugin that ``pip install "kafka-txn-sink[spark,testing]"`` installs: a local SparkSession with
Spark's Kafka connector, Apache Kafka's broker and an S3-compatible server, all real, started
once per test session. ``read_committed`` and ``read_referenced_files`` give what a
read_committed consumer sees as DataFrames, compared here with chispa.
"""

from __future__ import annotations

import json
import uuid
from datetime import datetime, timezone
from decimal import Decimal
from pathlib import Path

import pytest
from chispa import assert_df_equality
from orders_pipeline import (
    ORDER_SCHEMA,
    parse_orders,
    read_orders,
    start_orders_to_files,
    start_orders_to_kafka,
)
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.streaming import StreamingQuery

from kafka_txn_sink.testing import (
    AnyKafkaBroker,
    AnyS3Server,
    read_committed,
    read_referenced_files,
    s3_settings,
    sink_s3_options,
)

ORDERS = [
    ("o-1", "ann", Decimal("12.50"), datetime(2026, 1, 5, 10, 0, tzinfo=timezone.utc)),
    ("o-2", "bob", Decimal("3.20"), datetime(2026, 1, 5, 10, 1, tzinfo=timezone.utc)),
    ("o-3", "ann", Decimal("7.00"), datetime(2026, 1, 5, 10, 2, tzinfo=timezone.utc)),
]
NOT_ORDERS = ["not json", json.dumps({"order_id": "o-4", "customer": "bob", "amount": 0})]
QUERY_TIMEOUT_S = 300


def order_json(order: tuple[str, str, Decimal, datetime]) -> str:
    order_id, customer, amount, ts = order
    return json.dumps(
        {"order_id": order_id, "customer": customer, "amount": str(amount), "ts": ts.isoformat()}
    )


@pytest.fixture
def orders_topic(kts_spark: SparkSession, kts_kafka: AnyKafkaBroker) -> str:
    """A new topic holding the orders and two records that are not orders."""
    topic = kts_kafka.create_topic(f"orders_{uuid.uuid4().hex[:8]}")
    values = [order_json(order) for order in ORDERS] + NOT_ORDERS
    (
        kts_spark.createDataFrame([(value,) for value in values], "value STRING")
        .write.format("kafka")
        .option("kafka.bootstrap.servers", kts_kafka.bootstrap)
        .option("topic", topic)
        .save()
    )
    return topic


def expected_orders(spark: SparkSession) -> DataFrame:
    return spark.createDataFrame(ORDERS, ORDER_SCHEMA)


def run_to_end(query: StreamingQuery) -> None:
    """Wait for an availableNow query; its failure is raised here."""
    assert query.awaitTermination(QUERY_TIMEOUT_S), f"still running after {QUERY_TIMEOUT_S} s"


def test_each_order_reaches_kafka_once_keyed_by_customer(
    kts_spark: SparkSession, kts_kafka: AnyKafkaBroker, orders_topic: str, tmp_path: Path
) -> None:
    out = kts_kafka.create_topic(f"orders_out_{uuid.uuid4().hex[:8]}")
    orders = parse_orders(read_orders(kts_spark, kts_kafka.bootstrap, orders_topic))

    run_to_end(
        start_orders_to_kafka(
            orders,
            bootstrap=kts_kafka.bootstrap,
            topic=out,
            sink_id=f"orders_{uuid.uuid4().hex[:8]}",
            commit_log=str(tmp_path / "commit_log"),
            checkpoint=str(tmp_path / "checkpoint"),
        )
    )

    seen = read_committed(kts_spark, out).select(
        F.col("key").cast("string").alias("key"),
        F.from_json(F.col("value").cast("string"), ORDER_SCHEMA).alias("order"),
    )
    assert_df_equality(
        seen.select("key", "order.*"),
        expected_orders(kts_spark).select(F.col("customer").alias("key"), "*"),
        ignore_row_order=True,
        ignore_nullable=True,
    )


def test_each_order_is_in_one_referenced_file_on_s3(
    kts_spark: SparkSession,
    kts_kafka: AnyKafkaBroker,
    kts_s3: AnyS3Server,
    kts_s3_bucket: str,
    orders_topic: str,
    tmp_path: Path,
) -> None:
    references = kts_kafka.create_topic(f"orders_files_{uuid.uuid4().hex[:8]}")
    orders = parse_orders(read_orders(kts_spark, kts_kafka.bootstrap, orders_topic))

    run_to_end(
        start_orders_to_files(
            orders,
            bootstrap=kts_kafka.bootstrap,
            path=f"s3://{kts_s3_bucket}/orders",
            references_topic=references,
            sink_id=f"orders_files_{uuid.uuid4().hex[:8]}",
            commit_log=f"s3://{kts_s3_bucket}/commit_log",
            checkpoint=str(tmp_path / "checkpoint"),
            options=sink_s3_options(kts_s3.endpoint),
        )
    )

    rows = read_referenced_files(kts_spark, references, s3=s3_settings(kts_s3.endpoint))
    # The files hold every column but the partition column, which comes back from the
    # directories as a string.
    assert_df_equality(
        rows,
        expected_orders(kts_spark).select("order_id", "amount", "ts", "customer"),
        ignore_row_order=True,
        ignore_nullable=True,
    )
