"""Where records mode sends a row: option `topic` wins over a `topic` column, as in Spark's own
Kafka sink; without the option the column routes; and no row ever goes to files mode's
`referencesTopic`. On both writers: the row writer (PySpark 4.0) and the Arrow writer (4.1+)."""

from __future__ import annotations

from collections.abc import Sequence

import pyarrow as pa
import pytest
from pyspark.sql.types import IntegerType, StringType, StructField, StructType

from kafka_txn_sink.errors import ConfigError, InputError
from kafka_txn_sink.options import parse_options
from kafka_txn_sink.records.columns import plan_columns
from kafka_txn_sink.records.output import RecordsOutput
from tests.unit.test_arrow_writer import FakeTxn

WITH_TOPIC = StructType(
    [
        StructField("key", StringType()),
        StructField("value", StringType()),
        StructField("topic", StringType()),
    ]
)
ROWS = [("k0", "v0", "elsewhere"), ("k1", "v1", None), ("k2", "v2", "refs")]


def arrow_batch(rows: Sequence[tuple[str, str, str | None]]) -> pa.RecordBatch:
    return pa.record_batch(
        [pa.array([row[i] for row in rows], pa.string()) for i in range(3)],
        names=["key", "value", "topic"],
    )


def feed(records: RecordsOutput, writer: str, rows: Sequence[tuple[str, str, str | None]]) -> None:
    if writer == "rows":
        records.add_rows(rows)
    else:
        records.add_batch(arrow_batch(rows))


@pytest.mark.parametrize("writer", ["rows", "arrow"])
def test_the_topic_option_wins_over_the_topic_column(writer: str) -> None:
    txn = FakeTxn()
    records = RecordsOutput(txn, plan_columns(WITH_TOPIC, "out"), "out")

    feed(records, writer, ROWS)

    assert [(t, v, k) for t, v, k, _, _ in txn.sent] == [
        ("out", b"v0", b"k0"),
        ("out", b"v1", b"k1"),
        ("out", b"v2", b"k2"),
    ]


@pytest.mark.parametrize("writer", ["rows", "arrow"])
def test_without_the_option_the_column_routes_each_row(writer: str) -> None:
    txn = FakeTxn()
    rows = [("k0", "v0", "t0"), ("k1", "v1", "t1")]
    records = RecordsOutput(txn, plan_columns(WITH_TOPIC, None), None)

    feed(records, writer, rows)

    assert [(t, v) for t, v, _, _, _ in txn.sent] == [("t0", b"v0"), ("t1", b"v1")]


def test_with_the_option_the_topic_column_is_not_used_so_its_type_does_not_matter() -> None:
    schema = StructType([StructField("value", StringType()), StructField("topic", IntegerType())])
    txn = FakeTxn()
    records = RecordsOutput(txn, plan_columns(schema, "out"), "out")

    records.add_rows([("v", 7)])

    assert [(t, v) for t, v, _, _, _ in txn.sent] == [("out", b"v")]


@pytest.mark.parametrize("writer", ["rows", "arrow"])
def test_a_row_routed_to_the_references_topic_fails_naming_column_topic_row_and_key(
    writer: str,
) -> None:
    txn = FakeTxn()
    records = RecordsOutput(txn, plan_columns(WITH_TOPIC, None), None, reserved_topic="refs")
    feed(records, writer, [("a", "1", "t"), ("b", "2", "t")])  # two rows before this group

    with pytest.raises(InputError) as failure:
        feed(records, writer, [("k0", "v0", "t"), ("k-secret-ish", "v2", "refs")])

    message = str(failure.value)
    assert "column topic" in message
    assert "'refs'" in message
    assert "referencesTopic" in message
    assert "row 3 " in message  # rows counted from 0 across the task's input
    assert "b'k-secret-ish'" in message
    assert all(t != "refs" for t, _, _, _, _ in txn.sent)


def test_the_topic_option_may_not_name_the_references_topic() -> None:
    with pytest.raises(ConfigError) as failure:
        parse_options(
            {
                "kafka.bootstrap.servers": "127.0.0.1:9092",
                "sinkId": "orders",
                "commitLog": "/tmp/log",
                "topic": "refs",
                "path": "/tmp/files",
                "referencesTopic": "refs",
            }
        )

    message = str(failure.value)
    assert "option topic" in message and "option referencesTopic" in message
    assert "'refs'" in message
