"""The Arrow write path's conversion, on whatever PySpark runs the tests (4.0 has no Arrow stream
writer, so the batches are built with pyarrow directly, as Spark 4.1 would hand them over)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

import pyarrow as pa
import pytest
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    IntegerType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from kafka_txn_sink.errors import InputError
from kafka_txn_sink.protocol.prepare import _feed_batches
from kafka_txn_sink.records.arrow import bytes_list, record_columns, send_batch
from kafka_txn_sink.records.columns import Routing, plan_columns
from kafka_txn_sink.records.output import RecordsOutput

HEADERS = ArrayType(
    StructType([StructField("key", StringType()), StructField("value", BinaryType())])
)


@dataclass
class FakeTxn:
    sent: list[tuple[str, bytes | None, bytes | None, int | None, Any]] = field(
        default_factory=list
    )
    bulk_calls: int = 0
    stamps: list[int | None] = field(default_factory=list)

    def send(
        self,
        topic: str,
        value: bytes | None,
        key: bytes | None = None,
        partition: int | None = None,
        headers: Any = None,
        timestamp_ms: int | None = None,
        undigested: Any = None,
    ) -> None:
        """As a `DigestingTransaction` sends (`undigested` headers after the others)."""
        if undigested:
            headers = [*(headers or []), *undigested]
        self.sent.append((topic, value, key, partition, headers))
        self.stamps.append(timestamp_ms)

    def send_many(
        self, topic: str, values: Sequence[bytes | None], keys: Sequence[bytes | None] | None
    ) -> None:
        self.bulk_calls += 1
        for index, value in enumerate(values):
            self.send(topic, value, keys[index] if keys is not None else None)


def test_string_and_binary_columns_become_bytes_without_decoding() -> None:
    assert bytes_list(pa.array(["a", None, "ü"]), "value") == [b"a", None, "ü".encode()]
    assert bytes_list(pa.array([b"\x00\xff", None], pa.binary()), "value") == [b"\x00\xff", None]
    assert bytes_list(pa.array(["x"], pa.large_string()), "key") == [b"x"]
    assert bytes_list(pa.array([b"y"], pa.large_binary()), "key") == [b"y"]
    with pytest.raises(InputError, match="column value holds int64"):
        bytes_list(pa.array([1]), "value")


def test_key_value_batch_goes_through_the_bulk_path() -> None:
    schema = StructType([StructField("key", StringType()), StructField("value", BinaryType())])
    batch = pa.record_batch(
        [pa.array(["k1", None, "k3"]), pa.array([b"v1", b"v2", None], pa.binary())],
        names=["key", "value"],
    )
    txn = FakeTxn()

    send_batch(txn, record_columns(batch, plan_columns(schema, "out")), Routing("out"))

    assert txn.bulk_calls == 1
    assert txn.sent == [
        ("out", b"v1", b"k1", None, None),
        ("out", b"v2", None, None, None),
        ("out", None, b"k3", None, None),  # a null value is a tombstone, as in Spark's sink
    ]


def test_without_the_option_topic_partition_and_headers_columns_route_each_record() -> None:
    schema = StructType(
        [
            StructField("value", StringType()),
            StructField("topic", StringType()),
            StructField("partition", IntegerType()),
            StructField("headers", HEADERS),
            StructField("ignored", IntegerType()),
        ]
    )
    headers_type = pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))
    batch = pa.record_batch(
        [
            pa.array(["a", "b"]),
            pa.array(["t1", "t2"]),
            pa.array([2, None], pa.int32()),
            pa.array([[{"key": "h", "value": b"1"}], None], headers_type),
            pa.array([7, 8], pa.int32()),
        ],
        names=["value", "topic", "partition", "headers", "ignored"],
    )
    txn = FakeTxn()

    send_batch(txn, record_columns(batch, plan_columns(schema, None)), Routing(None))

    assert txn.bulk_calls == 0
    assert txn.sent == [
        ("t1", b"a", None, 2, [("h", b"1")]),
        ("t2", b"b", None, None, None),
    ]


def test_a_null_topic_without_a_topic_option_is_an_input_error() -> None:
    schema = StructType([StructField("value", StringType()), StructField("topic", StringType())])
    batch = pa.record_batch([pa.array(["a"]), pa.array([None], pa.string())], ["value", "topic"])

    with pytest.raises(InputError, match="column topic is null"):
        send_batch(FakeTxn(), record_columns(batch, plan_columns(schema, None)), Routing(None))


def test_a_header_without_a_key_is_an_input_error() -> None:
    schema = StructType([StructField("value", StringType()), StructField("headers", HEADERS)])
    headers_type = pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))
    batch = pa.record_batch(
        [pa.array(["a"]), pa.array([[{"key": None, "value": b"1"}]], headers_type)],
        ["value", "headers"],
    )

    with pytest.raises(InputError, match="header without a key"):
        record_columns(batch, plan_columns(schema, "out"))


def test_the_arrow_writer_sends_each_batch_and_skips_empty_ones() -> None:
    schema = StructType([StructField("value", StringType())])
    batches = [
        pa.record_batch([pa.array(["a", "b"])], ["value"]),
        pa.record_batch([pa.array([], pa.string())], ["value"]),
        pa.record_batch([pa.array(["c"])], ["value"]),
    ]
    txn = FakeTxn()
    output = RecordsOutput(txn, plan_columns(schema, "out"), "out")

    _feed_batches([output], iter(batches), batch_id=0)

    assert [s[1] for s in txn.sent] == [b"a", b"b", b"c"]
    assert txn.bulk_calls == 2


STAMPED = StructType(
    [
        StructField("value", StringType()),
        StructField("timestamp", TimestampType()),
        StructField("headers", HEADERS),
        StructField("trace", StringType()),
        StructField("origin", BinaryType()),
    ]
)


def test_a_timestamp_column_and_header_columns_reach_each_record_on_both_paths() -> None:
    """The `timestamp` column sets each record's timestamp in ms (null: the producer's clock);
    option headerColumns' columns become headers after the `headers` column's, in the option's
    order, named as the option names them; the Arrow batch and the row writer's rows agree."""
    at = datetime(2026, 3, 8, 6, 30, 0, 123456, tzinfo=timezone.utc)
    headers_type = pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))
    batch = pa.record_batch(
        [
            pa.array(["a", "b"]),
            pa.array([at, None], pa.timestamp("us", tz="America/New_York")),
            pa.array([[{"key": "h", "value": b"1"}], None], headers_type),
            pa.array(["00-abc-01", None]),
            pa.array([b"src", b"src2"]),
        ],
        names=["value", "timestamp", "headers", "trace", "origin"],
    )
    columns = plan_columns(STAMPED, "out", header_columns=["Trace", "origin"])
    from_arrow, from_rows = FakeTxn(), FakeTxn()

    send_batch(from_arrow, record_columns(batch, columns), Routing("out"))
    RecordsOutput(from_rows, columns, "out").add_rows(
        [("a", at.astimezone().replace(tzinfo=None), [("h", b"1")], "00-abc-01", b"src"),
         ("b", None, None, None, bytearray(b"src2"))]
    )  # fmt: skip

    millis = 1772951400123  # 2026-03-08T06:30:00.123Z
    for txn in (from_arrow, from_rows):
        assert txn.bulk_calls == 0
        assert txn.stamps == [millis, None]
        assert [s[4] for s in txn.sent] == [
            [("h", b"1"), ("Trace", b"00-abc-01"), ("origin", b"src")],
            [("Trace", None), ("origin", b"src2")],
        ]


def test_a_timestamp_column_of_another_type_is_ignored_and_a_header_column_checked() -> None:
    schema = StructType(
        [StructField("value", StringType()), StructField("timestamp", IntegerType())]
    )
    assert plan_columns(schema, "out").timestamp is None
    assert plan_columns(schema, "out").simple
    with pytest.raises(InputError, match="option headerColumns names column trace, which"):
        plan_columns(schema, "out", header_columns=["trace"])
    with pytest.raises(InputError, match="column timestamp of option headerColumns must be"):
        plan_columns(schema, "out", header_columns=["timestamp"])


def test_a_timestamp_column_first_in_the_input_is_used_on_the_row_path() -> None:
    """Its position is 0 (review: a truth test on the position left it unread)."""
    schema = StructType(
        [StructField("timestamp", TimestampType()), StructField("value", BinaryType())]
    )
    at = datetime(2024, 1, 1, 12, tzinfo=timezone.utc)
    txn = FakeTxn()

    RecordsOutput(txn, plan_columns(schema, "out"), "out").add_rows(
        [(at.astimezone().replace(tzinfo=None), b"v")]
    )

    assert txn.stamps == [1704110400000]


def test_a_timestamp_not_after_the_epoch_is_refused_on_both_paths() -> None:
    """librdkafka writes its own clock for 0, and -1 reads back as no timestamp."""
    schema = StructType(
        [StructField("value", BinaryType()), StructField("timestamp", TimestampType())]
    )
    columns = plan_columns(schema, "out")
    epoch = datetime(1970, 1, 1, tzinfo=timezone.utc)
    batch = pa.record_batch(
        [pa.array([b"v"]), pa.array([epoch], pa.timestamp("us", tz="UTC"))],
        names=["value", "timestamp"],
    )
    with pytest.raises(InputError, match="must be after 1970-01-01T00:00:00Z"):
        record_columns(batch, columns)
    with pytest.raises(InputError, match="must be after 1970-01-01T00:00:00Z"):
        RecordsOutput(FakeTxn(), columns, "out").add_rows(
            [(b"v", epoch.astimezone().replace(tzinfo=None))]
        )
