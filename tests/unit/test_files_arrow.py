"""Files mode on the Arrow path: batches split with Arrow compute and encoded natively must give
the files the row path (PySpark's rows, fastavro) gives: the same directories, records read
back with fastavro, header schema and sync marker; rolling and the open-file bound keep their
meaning; what the native encoder cannot write exactly falls back to the row path."""

from __future__ import annotations

import json
import random
from collections import defaultdict
from datetime import date, datetime, timedelta, timezone
from decimal import Decimal
from pathlib import Path
from typing import Any

import fastavro
import pyarrow as pa
import pytest
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    BooleanType,
    ByteType,
    DateType,
    DecimalType,
    DoubleType,
    FloatType,
    IntegerType,
    LongType,
    MapType,
    NullType,
    ShortType,
    StringType,
    StructField,
    StructType,
    TimestampNTZType,
    TimestampType,
)

from kafka_txn_sink.errors import InputError
from kafka_txn_sink.files.arrow_avro import shape
from kafka_txn_sink.files.naming import FileNaming
from kafka_txn_sink.files.plan import CODECS, FilePlan, plan_files
from kafka_txn_sink.files.references import WrittenFile
from kafka_txn_sink.files.spark_rows import arrow_rows
from kafka_txn_sink.files.writer import FileSet
from kafka_txn_sink.storage.files import LocalFileSink

START = datetime(2026, 10, 31, 22, 0, tzinfo=timezone.utc)

EVERY_TYPE = StructType(
    [
        StructField("id", LongType(), False),
        StructField("user", StringType()),
        StructField("ts", TimestampType()),
        StructField("ntz", TimestampNTZType()),
        StructField("small", ByteType()),
        StructField("short", ShortType()),
        StructField("n", IntegerType(), False),
        StructField("ratio", FloatType()),
        StructField("score", DoubleType()),
        StructField("ok", BooleanType()),
        StructField("blob", BinaryType()),
        StructField("amount", DecimalType(12, 3)),
        StructField("day", DateType()),
        StructField("tags", ArrayType(StringType(), containsNull=False)),
        StructField("counts", ArrayType(LongType())),
        StructField("attrs", MapType(StringType(), DoubleType())),
        StructField("labels", MapType(StringType(), StringType(), valueContainsNull=False)),
        StructField(
            "address",
            StructType(
                [
                    StructField("city", StringType()),
                    StructField("geo", StructType([StructField("lat", DoubleType(), False)])),
                ]
            ),
        ),
        StructField(
            "items",
            ArrayType(
                StructType([StructField("sku", StringType()), StructField("q", IntegerType())])
            ),
        ),
        StructField("a-b", StringType()),
    ]
)


def every_type_row(i: int, rnd: random.Random) -> dict[str, Any]:
    def maybe(value: Any) -> Any:
        return None if rnd.random() < 0.2 else value

    return {
        "id": i,
        "user": maybe(rnd.choice(["ann", "bob", "", "c/d=e"])),
        "ts": START + timedelta(minutes=17 * i),
        "ntz": maybe(datetime(2026, 3, 29, 1, 30) + timedelta(minutes=7 * i)),
        "small": maybe(rnd.randint(-128, 127)),
        "short": maybe(rnd.randint(-32768, 32767)),
        "n": rnd.randint(-(2**31), 2**31 - 1),
        "ratio": maybe(0.5 * i),
        "score": maybe(rnd.random() * 1e6),
        "ok": maybe(rnd.random() < 0.5),
        "blob": maybe(bytes(rnd.randrange(256) for _ in range(rnd.randrange(5)))),
        "amount": maybe(Decimal(rnd.randint(-(10**11), 10**11)).scaleb(-3)),
        "day": maybe(date(1969, 12, 30) + timedelta(days=i * 37)),
        "tags": maybe([f"t{j}" for j in range(rnd.randrange(3))]),
        "counts": maybe([maybe(j) for j in range(rnd.randrange(4))]),
        "attrs": maybe([(f"k{j}", maybe(j / 3)) for j in range(rnd.randrange(3))]),
        "labels": maybe([("env", "prod")]),
        "address": maybe({"city": maybe("Oslo"), "geo": maybe({"lat": 59.9})}),
        "items": maybe([maybe({"sku": "x", "q": maybe(j)}) for j in range(rnd.randrange(3))]),
        "a-b": maybe("dash"),
    }


def batch_of(schema: StructType, rows: list[dict[str, Any]]) -> pa.RecordBatch:
    """The rows as PySpark hands them to the Arrow writer (its Arrow types for `schema`)."""
    return pa.RecordBatch.from_pylist(rows, schema=to_arrow_schema(schema))


def every_type_batches(count: int, size: int = 50, seed: int = 3) -> list[pa.RecordBatch]:
    rnd = random.Random(seed)
    rows = [every_type_row(i, rnd) for i in range(count)]
    return [batch_of(EVERY_TYPE, rows[i : i + size]) for i in range(0, count, size)]


def by_rows(plan: FilePlan, batches: list[pa.RecordBatch], root: Path) -> list[WrittenFile]:
    rows_of = arrow_rows(plan.schema)
    with FileSet(plan, LocalFileSink(root, durable=False), FileNaming(7, 3, 0)) as files:
        for batch in batches:
            for row in rows_of(batch):
                files.add(row)
        return files.close()


def natively(plan: FilePlan, batches: list[pa.RecordBatch], root: Path) -> list[WrittenFile]:
    with FileSet(plan, LocalFileSink(root, durable=False), FileNaming(7, 3, 0)) as files:
        for batch in batches:
            assert files.accepts(batch.schema)
            files.add_batch(batch)
        assert files.native_rows == sum(b.num_rows for b in batches)  # not the row path
        return files.close()


def read(written: WrittenFile) -> tuple[dict[str, Any], str, list[Any]]:
    """The header's schema and codec, and the records, read back with fastavro."""
    with open(written.ref.location, "rb") as f:
        reader = fastavro.reader(f)
        records = list(reader)
    header = json.loads(reader.metadata["avro.schema"])
    return header, reader.metadata["avro.codec"], records


def sync_marker(written: WrittenFile) -> bytes:
    with open(written.ref.location, "rb") as f:
        marker: bytes = fastavro.reader(f)._header["sync"]
    return marker


def by_directory(written: list[WrittenFile]) -> list[WrittenFile]:
    """The files grouped by directory, in write order within each (directories may be closed
    in another order: the row path closes the least recently used one first)."""
    return sorted(written, key=lambda w: w.ref.partition_path)


def assert_same_files(expected: list[WrittenFile], got: list[WrittenFile]) -> None:
    expected, got = by_directory(expected), by_directory(got)
    assert [w.ref.partition_path for w in got] == [w.ref.partition_path for w in expected]
    for want, have in zip(expected, got, strict=True):
        assert have.ref.records == want.ref.records
        assert have.ref.schema_fingerprint == want.ref.schema_fingerprint
        assert have.schema == want.schema
        assert read(have) == read(want)
        assert have.ref.bytes == Path(have.ref.location).stat().st_size


@pytest.mark.parametrize("codec", CODECS)
def test_every_type_reads_back_as_the_row_path_wrote_it(tmp_path: Path, codec: str) -> None:
    plan = plan_files(EVERY_TYPE, codec=codec)
    batches = every_type_batches(200)

    expected = by_rows(plan, batches, tmp_path / "rows")
    got = natively(plan, batches, tmp_path / "native")

    assert_same_files(expected, got)
    header, written_codec, records = read(got[0])
    assert sync_marker(got[0]) == sync_marker(expected[0])  # a rewrite writes the same bytes
    assert written_codec == codec
    assert header["name"] == "Row" and header["namespace"] == "kafka_txn_sink"
    assert [r["id"] for r in records] == list(range(200))
    # Spot checks beyond the comparison: what a reader of the mapping expects.
    fields = {f["name"]: f for f in header["fields"]}
    assert fields["a_b"]["originalName"] == "a-b"
    assert fields["n"]["type"] == "int"
    assert records[0]["ts"] == START


def test_partitions_and_time_directories_match_the_row_path(tmp_path: Path) -> None:
    plan = plan_files(
        EVERY_TYPE,
        partition_by=["user", "ok"],
        time_column="ts",
        time_pattern="date=yyyy-MM-dd/hour=HH",
        time_zone_name="America/New_York",  # daylight saving time ends on 2026-11-01
        codec="snappy",
    )
    batches = every_type_batches(300, size=100)

    expected = by_rows(plan, batches, tmp_path / "rows")
    got = natively(plan, batches, tmp_path / "native")

    paths = {w.ref.partition_path for w in got}
    assert any(p.endswith("/date=2026-11-01/hour=01") for p in paths)  # twice an hour here
    assert any(p.startswith("user=c%2Fd%3De/ok=") for p in paths)
    assert any(p.startswith("user=__HIVE_DEFAULT_PARTITION__/ok=__HIVE_") for p in paths)
    assert_same_files(expected, got)


@pytest.mark.parametrize(
    ("column", "pattern", "zone"),
    [
        ("ts", "y=yyyy/doy=DDD/at=HH-mm", "Asia/Kolkata"),
        ("ts", "month=yy-MM/sec='s'ss", "UTC"),
        ("ntz", "date=yyyy-MM-dd/hour=H", "Europe/Paris"),
    ],
)
def test_time_patterns_and_zones_match_the_row_path(
    tmp_path: Path, column: str, pattern: str, zone: str
) -> None:
    schema = StructType([f for f in EVERY_TYPE.fields if f.name in ("id", "ts", "ntz", "n")])
    rnd = random.Random(5)
    rows = [
        {
            "id": i,
            "ts": START + timedelta(seconds=rnd.randrange(3 * 86400)),
            "ntz": datetime(2026, 3, 29) + timedelta(seconds=rnd.randrange(86400)),
            "n": i,
        }
        for i in range(400)
    ]
    batches = [batch_of(schema, rows[:150]), batch_of(schema, rows[150:])]
    plan = plan_files(
        schema, time_column=column, time_pattern=pattern, time_zone_name=zone, max_open_files=1000
    )

    assert_same_files(
        by_rows(plan, batches, tmp_path / "r"), natively(plan, batches, tmp_path / "n")
    )


@pytest.mark.parametrize(
    ("data_type", "values", "directories"),
    [
        (IntegerType(), [3, -1, None, 3], ["k=3", "k=-1", "k=__HIVE_DEFAULT_PARTITION__"]),
        (DateType(), [date(2026, 1, 2), None], ["k=2026-01-02", "k=__HIVE_DEFAULT_PARTITION__"]),
        (DecimalType(6, 2), [Decimal("1.50"), Decimal("-0.05")], ["k=1.50", "k=-0.05"]),
        (BooleanType(), [False, True, None], ["k=false", "k=true", "k=__HIVE_DEFAULT_PARTITION__"]),
        (StringType(), ["", None, "a"], ["k=__HIVE_DEFAULT_PARTITION__", "k=a"]),
    ],
)
def test_partition_column_types_name_directories_as_rows_do(
    tmp_path: Path, data_type: Any, values: list[Any], directories: list[str]
) -> None:
    schema = StructType([StructField("k", data_type), StructField("id", LongType())])
    batches = [batch_of(schema, [{"k": v, "id": i} for i, v in enumerate(values)])]
    plan = plan_files(schema, partition_by=["k"])

    got = natively(plan, batches, tmp_path / "n")

    assert sorted(w.ref.partition_path for w in got) == sorted(directories)
    assert_same_files(by_rows(plan, batches, tmp_path / "r"), got)
    if data_type == StringType():  # "" and null share the default directory, in batch order
        (default,) = [w for w in got if "DEFAULT" in w.ref.partition_path]
        assert [r["id"] for r in read(default)[2]] == [0, 1]


def test_rolls_at_max_records_as_the_row_path(tmp_path: Path) -> None:
    plan = plan_files(EVERY_TYPE, partition_by=["user"], max_records_per_file=7)
    batches = every_type_batches(230, size=40)

    expected = by_rows(plan, batches, tmp_path / "rows")
    got = natively(plan, batches, tmp_path / "native")

    assert_same_files(expected, got)
    assert max(w.ref.records for w in got) == 7


def test_rolls_at_max_bytes_without_overshooting_by_much(tmp_path: Path) -> None:
    limit = 8192
    plan = plan_files(EVERY_TYPE, partition_by=["ok"], max_bytes_per_file=limit, codec="snappy")
    batches = every_type_batches(3000, size=500)

    got = natively(plan, batches, tmp_path / "native")

    files: dict[str, list[WrittenFile]] = defaultdict(list)
    for w in got:
        files[w.ref.partition_path].append(w)
    ids: list[int] = []
    for written in files.values():
        for w in written[:-1]:  # each rolled file reached the limit, by a few records at most
            assert limit <= w.ref.bytes <= limit * 1.1
        assert written[-1].ref.bytes <= limit * 1.1
        ids += [r["id"] for w in written for r in read(w)[2]]
    assert sorted(ids) == list(range(3000))
    assert all(len(written) > 5 for written in files.values())  # rolled


def test_open_files_stay_bounded_and_every_row_is_written_once(tmp_path: Path) -> None:
    schema = StructType([StructField("user", StringType()), StructField("id", LongType())])
    rnd = random.Random(11)
    rows = [{"user": f"u{rnd.randrange(50)}", "id": i} for i in range(2000)]
    batches = [batch_of(schema, rows[i : i + 100]) for i in range(0, 2000, 100)]
    plan = plan_files(schema, partition_by=["user"], max_open_files=4)
    sink = LocalFileSink(tmp_path, durable=False)

    with FileSet(plan, sink, FileNaming(1, 0, 0)) as files:
        for batch in batches:
            files.add_batch(batch)
            assert files.open_files <= 4
        written = files.close()

    assert files.peak_open_files == 4
    for w in written:
        ids = [r["id"] for r in read(w)[2]]
        assert ids == sorted(ids)  # batch order kept within a file
        assert {rows[i]["user"] for i in ids} == {w.ref.partition_values["user"]}
    assert sorted(r["id"] for w in written for r in read(w)[2]) == list(range(2000))


def test_a_null_in_a_column_that_is_not_nullable_fails_naming_it(tmp_path: Path) -> None:
    plan = plan_files(EVERY_TYPE)
    rows = [every_type_row(0, random.Random(1))]
    rows[0]["n"] = None
    batch = pa.RecordBatch.from_pylist(rows, schema=to_arrow_schema(EVERY_TYPE))

    with (
        FileSet(plan, LocalFileSink(tmp_path), FileNaming(1, 0, 0)) as files,
        pytest.raises(InputError, match="row 0 of task partition 0: column n is null"),
    ):
        files.add_batch(batch)


def test_a_null_time_fails_naming_the_column(tmp_path: Path) -> None:
    schema = StructType([StructField("ts", TimestampType()), StructField("id", LongType())])
    plan = plan_files(schema, time_column="ts", time_pattern="date=yyyy-MM-dd")
    batch = batch_of(schema, [{"ts": START, "id": 1}, {"ts": None, "id": 2}])

    with (
        FileSet(plan, LocalFileSink(tmp_path), FileNaming(1, 0, 0)) as files,
        pytest.raises(InputError, match="column ts is null"),
    ):
        files.add_batch(batch)


def test_void_columns_take_the_row_path(tmp_path: Path) -> None:
    void = StructType([StructField("id", LongType()), StructField("nothing", NullType())])
    sink = LocalFileSink(tmp_path)
    with FileSet(plan_files(void), sink, FileNaming(1, 0, 0)) as files:
        assert not files.accepts(to_arrow_schema(void))


def test_shape_ignores_names_but_not_types() -> None:
    a = {"type": "record", "name": "Row", "fields": [{"name": "x", "type": ["null", "long"]}]}
    b = {"type": "record", "name": "top", "fields": [{"name": "y", "type": ["null", "long"]}]}
    c = {"type": "record", "name": "Row", "fields": [{"name": "x", "type": "long"}]}
    assert shape(a) == shape(b) != shape(c)


GEO = StructType(
    [
        StructField("id", LongType()),
        StructField(
            "geo",
            StructType(
                [
                    StructField("lat", DoubleType(), False),
                    StructField("tags", ArrayType(StringType(), False), False),
                    StructField("names", MapType(StringType(), StringType(), False), False),
                    StructField("at", StructType([StructField("z", IntegerType(), False)]), False),
                ]
            ),
        ),
    ]
)


def geo_batch(lat: list[float | None], valid: list[bool]) -> pa.RecordBatch:
    """`geo` as Spark's Arrow writer gives it: a null struct's fields are nulls too."""
    n = len(lat)
    fields = list(to_arrow_schema(GEO).field("geo").type)
    nulls = pa.array([not v for v in valid])
    children = [
        pa.array(lat, pa.float64()),
        pa.array([["a", "b"] if v else None for v in valid], fields[1].type),
        pa.array([[("k", "v")] if v else None for v in valid], fields[2].type),
        pa.StructArray.from_arrays(
            [pa.array([7 if v else None for v in valid], pa.int32())],
            fields=list(fields[3].type),
            mask=nulls,
        ),
    ]
    geo = pa.StructArray.from_arrays(children, fields=fields, mask=nulls)
    return pa.record_batch([pa.array(range(n), pa.int64()), geo], schema=to_arrow_schema(GEO))


def test_null_structs_with_null_required_fields_are_encoded_natively(tmp_path: Path) -> None:
    valid = [True, False, True, False, True, True]
    batch = geo_batch([1.5, None, 2.5, None, 3.5, 4.5], valid)
    plan = plan_files(GEO, max_records_per_file=4)
    sliced = [batch.slice(1, 3), batch.slice(4)]  # offsets into the arrays, too

    got = natively(plan, sliced, tmp_path / "n")

    assert_same_files(by_rows(plan, sliced, tmp_path / "r"), got)
    records = [r for w in got for r in read(w)[2]]
    assert [r["geo"] is None for r in records] == [not v for v in valid[1:]]
    assert records[1]["geo"] == {
        "lat": 2.5,
        "tags": ["a", "b"],
        "names": {"k": "v"},
        "at": {"z": 7},
    }


def test_a_null_no_null_struct_hides_fails_naming_the_field(tmp_path: Path) -> None:
    batch = geo_batch([1.5, None, None], [True, False, True])

    with (
        FileSet(plan_files(GEO), LocalFileSink(tmp_path), FileNaming(1, 0, 0)) as files,
        pytest.raises(InputError, match=r"row 2 of task partition 0: column geo\.lat is null"),
    ):
        files.add_batch(batch)


def test_a_void_column_is_written_row_by_row(tmp_path: Path) -> None:
    schema = StructType([StructField("id", LongType()), StructField("nothing", NullType())])
    batch = batch_of(schema, [{"id": 1, "nothing": None}])

    with FileSet(plan_files(schema), LocalFileSink(tmp_path), FileNaming(1, 0, 0)) as files:
        files.add_batch(batch)
        assert (files.rows, files.native_rows) == (1, 0)
        (written,) = files.close()

    assert read(written)[2] == [{"id": 1, "nothing": None}]


def test_a_rewrite_of_the_same_batches_gives_the_same_bytes(tmp_path: Path) -> None:
    plan = plan_files(EVERY_TYPE, partition_by=["user"], codec="snappy", max_records_per_file=9)
    batches = every_type_batches(120, size=30)

    first = natively(plan, batches, tmp_path / "a")
    again = natively(plan, batches, tmp_path / "b")

    assert [Path(w.ref.location).read_bytes() for w in first] == [
        Path(w.ref.location).read_bytes() for w in again
    ]
