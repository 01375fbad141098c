"""FilesOutput, files mode as a task's output: files written, one reference each in the task's
transaction (a fake here: no broker), the refs the commit message carries, abort."""

from __future__ import annotations

import datetime as dt
import json
import os
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import Any

import fastavro
import pyarrow as pa
import pytest
from pyspark.sql.conversion import ArrowTableToRowsConversion
from pyspark.sql.types import (
    DecimalType,
    IntegerType,
    LongType,
    MapType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from kafka_txn_sink.errors import InputError
from kafka_txn_sink.files import rows_arrow
from kafka_txn_sink.files.naming import parse_file_name
from kafka_txn_sink.files.output import FilesOutput
from kafka_txn_sink.files.plan import plan_for_options
from kafka_txn_sink.files.references import parse_reference
from kafka_txn_sink.files.spark_rows import arrow_rows
from kafka_txn_sink.options import SinkOptions, parse_options
from kafka_txn_sink.protocol.output import Headers

SCHEMA = StructType(
    [
        StructField("id", LongType(), False),
        StructField("user", StringType()),
        StructField("ts", TimestampType()),
    ]
)
START = dt.datetime(2026, 11, 21, 5, 6, 7, tzinfo=dt.timezone.utc)


@dataclass
class FakeTxn:
    """Records what the output produces into the task's transaction."""

    sent: list[tuple[str, bytes | None, bytes | None]] = field(default_factory=list)

    def send(
        self,
        topic: str,
        value: bytes | None,
        key: bytes | None = None,
        partition: int | None = None,
        headers: Headers | None = None,
        timestamp_ms: int | None = None,
    ) -> None:
        self.sent.append((topic, value, key))

    def send_many(
        self, topic: str, values: Sequence[bytes | None], keys: Sequence[bytes | None] | None
    ) -> None:
        raise AssertionError("files mode produces its references one by one")


def files_options(root: Path, **extra: str) -> SinkOptions:
    raw = {
        "kafka.bootstrap.servers": "h:1",
        "sinkId": "s",
        "commitLog": str(root / "log"),
        "path": str(root / "files"),
        "referencesTopic": "refs",
        "partitionBy": "user",
        **extra,
    }
    return parse_options(raw).with_transaction_timeout(60_000)


def open_output(root: Path, txn: FakeTxn, **extra: str) -> FilesOutput:
    options = files_options(root, **extra)
    assert options.files is not None
    plan = plan_for_options(options.files, SCHEMA)
    return FilesOutput(options, plan, txn, batch_id=7, partition=3, attempt=1)


def rows(n: int) -> list[tuple[Any, ...]]:
    return [(i, f"u{i % 2}", START) for i in range(n)]


def read_ids(location: str) -> list[int]:
    with open(location, "rb") as f:
        records: list[Any] = list(fastavro.reader(f))
    return [r["id"] for r in records]


def read_file(location: str) -> tuple[dict[str, bytes], bytes, list[Any]]:
    with open(location, "rb") as f:
        reader = fastavro.reader(f)
        records: list[Any] = list(reader)
    return reader.metadata, reader._header["sync"], records


def test_one_reference_per_written_file_and_the_refs_returned(tmp_path: Path) -> None:
    txn = FakeTxn()
    output = open_output(tmp_path, txn, maxRecordsPerFile="3")
    output.add_rows(rows(10))
    assert txn.sent == []  # nothing is referenced before close

    refs = output.close()

    assert len(refs) == 4  # u0: 5 rows in files of 3 and 2, u1 the same
    assert len(txn.sent) == len(refs)
    for ref, (topic, value, key) in zip(refs, txn.sent, strict=True):
        assert topic == "refs"
        assert key == ref.partition_path.encode()
        assert value is not None
        assert parse_reference(value) == ref
        body = json.loads(value)
        assert (body["sink_id"], body["batch_id"]) == ("s", 7)
        assert body["schema"]["type"] == "record"  # small enough to be inline
        name = parse_file_name(ref.location)
        assert name is not None
        assert (name.batch_id, name.partition, name.attempt) == (7, 3, 1)
        assert read_ids(ref.location) != []
    assert sorted(i for ref in refs for i in read_ids(ref.location)) == list(range(10))


def test_a_large_schema_is_stored_beside_the_files(tmp_path: Path) -> None:
    txn = FakeTxn()
    output = open_output(tmp_path, txn, schemaInlineMaxBytes="10")
    output.add_rows([(1, "ann", START)])

    (ref,) = output.close()

    body = json.loads(txn.sent[0][1] or b"")
    assert "schema" not in body
    stored = Path(body["schema_location"])
    assert stored.parent == tmp_path / "files" / "_schemas"
    assert json.loads(stored.read_text())["type"] == "record"
    assert parse_reference(txn.sent[0][1] or b"") == ref


def test_arrow_batches_write_what_rows_write(tmp_path: Path) -> None:
    by_rows, by_batches = FakeTxn(), FakeTxn()
    row_output = open_output(tmp_path / "rows", by_rows)
    batch_output = open_output(tmp_path / "batches", by_batches)
    data = rows(6)
    row_output.add_rows(data[:2])
    row_output.add_rows(data[2:])
    columns = list(zip(*data, strict=True))
    batch = pa.record_batch(
        [pa.array(columns[0], pa.int64()), pa.array(columns[1]), pa.array(columns[2])],
        names=SCHEMA.names,
    )
    batch_output.add_batch(batch.slice(0, 4))
    batch_output.add_batch(batch.slice(4))

    from_rows, from_batches = row_output.close(), batch_output.close()

    assert len(by_rows.sent) == len(by_batches.sent) == 2
    for a, b in zip(from_rows, from_batches, strict=True):
        assert (a.partition_path, a.records, a.schema_fingerprint) == (
            b.partition_path,
            b.records,
            b.schema_fingerprint,
        )
        # The same header (schema, codec, sync marker) and records; blocks may differ.
        assert read_file(a.location) == read_file(b.location)


def test_nothing_written_references_nothing(tmp_path: Path) -> None:
    txn = FakeTxn()
    assert open_output(tmp_path, txn).close() == ()
    assert txn.sent == []


def test_abort_references_nothing_and_uploads_nothing_more(tmp_path: Path) -> None:
    txn = FakeTxn()
    output = open_output(tmp_path, txn)
    output.add_rows(rows(4))

    output.abort()

    assert txn.sent == []
    assert list((tmp_path / "files").rglob("*.avro")) == []


def test_arrow_rows_equal_what_the_row_writer_gets() -> None:
    schema = StructType(
        [
            StructField("ts", TimestampType()),
            StructField("amount", DecimalType(10, 2)),
            StructField("tags", MapType(StringType(), IntegerType())),
            StructField("inner", StructType([StructField("a", StringType())])),
            StructField("name", StringType()),
        ]
    )
    batch = pa.record_batch(
        [
            pa.array([dt.datetime(2026, 11, 21, 5, 6, 7, tzinfo=dt.timezone.utc), None]),
            pa.array([Decimal("1.25"), None], pa.decimal128(10, 2)),
            pa.array([[("x", 1)], None], pa.map_(pa.string(), pa.int32())),
            pa.array([{"a": "b"}, None], pa.struct([("a", pa.string())])),
            pa.array(["n1", None]),
        ],
        names=["ts", "amount", "tags", "inner", "name"],
    )
    # What PySpark's row writer path builds from the same batch (write_into_data_source.py).
    converters = [ArrowTableToRowsConversion._create_converter(f.dataType) for f in schema.fields]
    columns = [c.to_pylist() for c in batch.columns]
    expected = [
        tuple(converters[c](columns[c][r]) for c in range(batch.num_columns))
        for r in range(batch.num_rows)
    ]

    assert list(arrow_rows(schema)(batch)) == expected


@pytest.fixture
def utc_local() -> Iterator[None]:
    """This process's local time set to UTC for the test."""
    saved = os.environ.get("TZ")
    os.environ["TZ"] = "UTC"
    time.tzset()
    yield
    if saved is None:
        del os.environ["TZ"]
    else:
        os.environ["TZ"] = saved
    time.tzset()


@pytest.mark.usefixtures("utc_local")
def test_rows_go_through_the_native_encoder_and_write_what_row_by_row_writes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    naive = START.replace(tzinfo=None)  # PySpark's rows carry naive local times
    data = [(i, f"u{i % 3}", naive + dt.timedelta(minutes=i)) for i in range(50)]
    native = open_output(tmp_path / "native", FakeTxn())
    native.add_rows(data[:1])
    native.add_rows(data[1:])
    monkeypatch.setattr(rows_arrow, "_utc_local", lambda: False)  # timestamps: row by row
    plain = open_output(tmp_path / "plain", FakeTxn())
    plain.add_rows(data)

    assert (native._files.native_rows, plain._files.native_rows) == (50, 0)
    from_native = sorted(native.close(), key=lambda f: f.partition_path)
    from_plain = sorted(plain.close(), key=lambda f: f.partition_path)
    assert [a.partition_path for a in from_native] == [b.partition_path for b in from_plain]
    for a, b in zip(from_native, from_plain, strict=True):
        assert read_file(a.location)[0] == read_file(b.location)[0]  # header: schema, codec
        assert read_file(a.location)[2] == read_file(b.location)[2]  # the records


def test_a_null_the_schema_forbids_names_its_row_on_the_row_path_too(tmp_path: Path) -> None:
    output = open_output(tmp_path, FakeTxn())
    data = rows(6)
    data[3] = (None, "u1", START)

    with pytest.raises(InputError, match=r"^row 3 of task partition 3: .*column id"):
        output.add_rows(data)
