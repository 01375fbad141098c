"""FileSet on a local directory: routing, rolling, the open-file bound, both schema modes;
the plan's checks of the options against the input schema."""

from __future__ import annotations

import errno
import json
import os
import pickle
import random
from collections import Counter
from datetime import date, datetime, timedelta, timezone
from decimal import Decimal
from pathlib import Path
from typing import Any

import fastavro
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    DateType,
    DecimalType,
    DoubleType,
    FloatType,
    IntegerType,
    LongType,
    MapType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from kafka_txn_sink.errors import ConfigError, InputError, StagingError
from kafka_txn_sink.files.avro_names import fingerprint, schema_digest
from kafka_txn_sink.files.json_schema import Irreconcilable, SchemaAggregator
from kafka_txn_sink.files.naming import FileNaming
from kafka_txn_sink.files.plan import CODECS, FilePlan, plan_files
from kafka_txn_sink.files.references import WrittenFile, store_schema
from kafka_txn_sink.files.writer import FileSet
from kafka_txn_sink.storage.files import LocalFileSink

START = datetime(2026, 11, 21, 5, 0, tzinfo=timezone.utc)

LOGS = StructType(
    [
        StructField("id", LongType(), False),
        StructField("user", StringType()),
        StructField("ts", TimestampType()),
        StructField("level", StringType()),
        StructField("message", StringType()),
        StructField("status", IntegerType()),
    ]
)

PAYLOADS = StructType(
    [
        StructField("user", StringType()),
        StructField("ts", TimestampType()),
        StructField("payload", StringType()),
    ]
)


def log_row(i: int, user: str, ts: datetime = START) -> tuple[Any, ...]:
    return (i, user, ts, ["INFO", "WARN"][i % 2], f"message {i} " + "x" * (i % 13), 200 + i % 3)


def record_of(row: tuple[Any, ...], dropped: tuple[int, ...] = (1,)) -> dict[str, Any]:
    return {n: v for i, (n, v) in enumerate(zip(LOGS.names, row, strict=True)) if i not in dropped}


def read_avro(path: str | Path) -> tuple[dict[str, Any], list[dict[str, Any]], str]:
    with open(path, "rb") as f:
        reader = fastavro.reader(f)
        records = list(reader)
        header_schema = json.loads(reader.metadata["avro.schema"])
        return header_schema, records, reader.metadata["avro.codec"]


def write(
    plan: FilePlan, rows: list[tuple[Any, ...]], root: Path, **kwargs: Any
) -> list[WrittenFile]:
    naming = kwargs.pop("naming", FileNaming(7, 3, 0))
    sink = LocalFileSink(root, durable=kwargs.pop("durable", True))
    with FileSet(plan, sink, naming, **kwargs) as files:
        for row in rows:
            files.add(row)
        return files.close()


# --- Spark-schema mode ---------------------------------------------------------------------


def test_one_file_per_partition_directory(tmp_path: Path) -> None:
    plan = plan_files(
        LOGS, partition_by=["user"], time_column="ts", time_pattern="date=yyyy-MM-dd/hour=HH"
    )
    rows = [
        log_row(i, f"u{i % 3}", START + timedelta(minutes=60 * (i % 2) + i % 7)) for i in range(60)
    ]
    written = write(plan, rows, tmp_path)

    assert len(written) == 6
    by_path = {w.ref.partition_path: w for w in written}
    for user in ("u0", "u1", "u2"):
        for hour in ("05", "06"):
            assert f"user={user}/date=2026-11-21/hour={hour}" in by_path
    for w in written:
        ref = w.ref
        assert ref.location == str(tmp_path / w.name)
        assert w.name == f"{ref.partition_path}/{Path(w.name).name}"
        assert Path(w.name).name.startswith("part-0000000007-00003-000-")
        assert ref.bytes == os.path.getsize(ref.location)
        header, records, _ = read_avro(ref.location)
        assert header == w.schema == plan.avro_schema()
        assert ref.schema_fingerprint == fingerprint(header)
        assert ref.records == len(records)
        user, hour = ref.partition_values["user"], ref.partition_values["hour"]
        assert ref.partition_values["date"] == "2026-11-21"
        expected = [
            record_of(r)
            for r in rows
            if r[1] == user and r[2].astimezone(timezone.utc).strftime("%H") == hour
        ]
        assert records == expected  # the partition column is not in the file, as with Spark
    assert sum(w.ref.records for w in written) == len(rows)


def test_unpartitioned_files_sit_at_the_root(tmp_path: Path) -> None:
    plan = plan_files(LOGS, max_records_per_file=4)
    written = write(plan, [log_row(i, "u") for i in range(10)], tmp_path)
    assert [w.ref.records for w in written] == [4, 4, 2]
    assert all("/" not in w.name and w.ref.partition_path == "" for w in written)
    assert all(w.ref.partition_values == {} for w in written)
    records = [r for w in written for r in read_avro(w.ref.location)[1]]
    assert records == [record_of(log_row(i, "u"), dropped=()) for i in range(10)]


def test_rolls_at_max_records(tmp_path: Path) -> None:
    plan = plan_files(LOGS, partition_by=["user"], max_records_per_file=7)
    written = write(plan, [log_row(i, "ann") for i in range(20)], tmp_path)
    assert [w.ref.records for w in written] == [7, 7, 6]
    assert len({w.name for w in written}) == 3
    ids = [r["id"] for w in written for r in read_avro(w.ref.location)[1]]
    assert ids == list(range(20))


def test_rolls_at_max_bytes_of_the_written_file(tmp_path: Path) -> None:
    limit = 20_000
    plan = plan_files(LOGS, partition_by=["user"], max_bytes_per_file=limit)
    rows = [log_row(i, "ann") for i in range(3000)]
    written = write(plan, rows, tmp_path)
    sizes = [w.ref.bytes for w in written]
    assert len(sizes) > 3
    # A file rolls at the first block (fastavro's 16,000-byte blocks) that reaches the limit.
    for size in sizes[:-1]:
        assert limit <= size <= limit + 16_000 + 1_000
    assert sizes[-1] <= limit + 17_000
    ids = [r["id"] for w in written for r in read_avro(w.ref.location)[1]]
    assert ids == list(range(3000))


def test_open_files_stay_bounded_for_10000_users(tmp_path: Path) -> None:
    users, max_open = 10_000, 16
    plan = plan_files(LOGS, partition_by=["user"], max_open_files=max_open)
    rnd = random.Random(5)
    # Two rows per user, in an order drifting through the users with some interleaving (as a
    # time-ordered log): users come back after their file was closed, some files get both rows.
    order = sorted((2 * u + rnd.uniform(0, 48), u) for u in range(users) for _ in range(2))
    rows = [log_row(i, f"user{u:05d}") for i, (_, u) in enumerate(order)]
    fds_before = len(os.listdir("/proc/self/fd"))
    peak_fds = 0
    sink = LocalFileSink(tmp_path, durable=False)  # fsyncs of 15,000 files would take minutes
    with FileSet(plan, sink, FileNaming(1, 0, 0)) as files:
        for n, row in enumerate(rows):
            files.add(row)
            assert files.open_files <= max_open
            if n % 500 == 0:
                peak_fds = max(peak_fds, len(os.listdir("/proc/self/fd")))
        written = files.close()
        assert files.peak_open_files == max_open
    assert peak_fds - fds_before <= max_open + 2

    assert {w.ref.partition_values["user"] for w in written} == {
        f"user{u:05d}" for u in range(users)
    }
    assert len(written) > users  # closed users came back and got another file
    seen: Counter[int] = Counter()
    for w in written:
        _, records, _ = read_avro(w.ref.location)
        assert len(records) == w.ref.records > 0
        user = w.ref.partition_values["user"]
        for record in records:
            seen[record["id"]] += 1
            assert rows[record["id"]][1] == user
    assert seen == Counter(range(len(rows)))  # every row in exactly one file


def test_one_open_file_alternating_keys(tmp_path: Path) -> None:
    plan = plan_files(LOGS, partition_by=["user"], max_open_files=1)
    written = write(plan, [log_row(i, "ab"[i % 2]) for i in range(6)], tmp_path)
    assert [w.ref.records for w in written] == [1] * 6
    assert [w.ref.partition_values["user"] for w in written] == list("ababab")


NESTED = StructType(
    [
        StructField("k", StringType(), False),
        StructField(
            "address",
            StructType([StructField("city", StringType()), StructField("zip", IntegerType())]),
        ),
        StructField("tags", ArrayType(StringType())),
        StructField("attrs", MapType(StringType(), LongType())),
        StructField("price", DecimalType(10, 2)),
        StructField("day", DateType()),
        StructField("blob", BinaryType()),
        StructField("ratio", FloatType()),
        StructField("score", DoubleType()),
    ]
)


def test_nested_types_round_trip(tmp_path: Path) -> None:
    plan = plan_files(NESTED, partition_by=["k"], codec="deflate")
    rows = [
        (
            "a",
            ("Paris", 75001),
            ["x", None],
            {"n": 1},
            Decimal("12.50"),
            date(2026, 1, 2),
            b"\x00\x01",
            0.5,
            1e300,
        ),
        ("a", None, [], {}, None, None, None, None, None),
    ]
    (written,) = write(plan, rows, tmp_path)
    _, records, codec = read_avro(written.ref.location)
    assert codec == "deflate"
    assert records == [
        {
            "address": {"city": "Paris", "zip": 75001},
            "tags": ["x", None],
            "attrs": {"n": 1},
            "price": Decimal("12.50"),
            "day": date(2026, 1, 2),
            "blob": b"\x00\x01",
            "ratio": 0.5,
            "score": 1e300,
        },
        {
            k: (v if k in ("tags", "attrs") else None)
            for k, v in (
                ("address", None),
                ("tags", []),
                ("attrs", {}),
                ("price", None),
                ("day", None),
                ("blob", None),
                ("ratio", None),
                ("score", None),
            )
        },
    ]


@pytest.mark.parametrize("codec", CODECS)
def test_every_codec(tmp_path: Path, codec: str) -> None:
    plan = plan_files(LOGS, partition_by=["user"], codec=codec)
    rows = [log_row(i, "ann") for i in range(500)]
    (written,) = write(plan, rows, tmp_path)
    _, records, used = read_avro(written.ref.location)
    assert used == codec
    assert records == [record_of(r) for r in rows]


def test_rewrite_is_byte_identical(tmp_path: Path) -> None:
    plan = plan_files(LOGS, partition_by=["user"], codec="snappy", max_records_per_file=50)
    rows = [log_row(i, f"u{i % 4}") for i in range(400)]
    first = write(plan, rows, tmp_path / "a", naming=FileNaming(9, 2, 0, token="aaaaaaaa"))
    second = write(plan, rows, tmp_path / "b", naming=FileNaming(9, 2, 1, token="bbbbbbbb"))
    assert len(first) == len(second) == 8
    for a, b in zip(first, second, strict=True):
        assert a.name != b.name  # attempts never overwrite each other
        assert Path(a.ref.location).read_bytes() == Path(b.ref.location).read_bytes()
    other = write(plan, rows, tmp_path / "c", naming=FileNaming(10, 2, 0))
    assert Path(other[0].ref.location).read_bytes() != Path(first[0].ref.location).read_bytes()


def test_null_in_a_required_column_names_column_and_row(tmp_path: Path) -> None:
    plan = plan_files(LOGS)
    spool = tmp_path / "spool"
    spool.mkdir()
    with pytest.raises(InputError, match=r"row 1 of task partition 3: column id is null"):
        write(
            plan, [log_row(0, "a"), (None, "a", START, None, None, None)], tmp_path, spool_dir=spool
        )
    assert list(spool.iterdir()) == []  # the context manager aborted: spool removed


# --- payload mode ------------------------------------------------------------------------


def payload_rows(payloads: list[Any], user: str = "ann") -> list[tuple[Any, ...]]:
    return [
        (user, START, p if p is None or isinstance(p, str) else json.dumps(p)) for p in payloads
    ]


def payload_plan(**kwargs: Any) -> FilePlan:
    return plan_files(
        PAYLOADS,
        partition_by=["user"],
        time_column="ts",
        time_pattern="date=yyyy-MM-dd",
        payload_column="payload",
        **kwargs,
    )


def test_payload_files_get_their_merged_schema(tmp_path: Path) -> None:
    mixed = [
        {"a": 1, "b": "x"},
        {"a": 2.5, "c": {"d": True}},
        {"b": None, "e": [1, 2], "weird-name": 3},
    ]
    rows = payload_rows(mixed, "ann") + payload_rows([{"a": 1}, {"a": 2}], "bob")
    written = write(payload_plan(codec="zstandard"), rows, tmp_path)
    by_user = {w.ref.partition_values["user"]: w for w in written}

    ann = by_user["ann"]
    header, records, codec = read_avro(ann.ref.location)
    assert codec == "zstandard"
    assert header == ann.schema
    fields = {f["name"]: f["type"] for f in header["fields"]}
    assert fields["a"] == ["null", "double"]  # int -> double, missing in one payload
    assert fields["b"] == ["null", "string"]
    assert fields["e"] == ["null", {"type": "array", "items": "long"}]
    assert fields["c"][0] == "null" and fields["c"][1]["type"] == "record"
    assert records == [
        {"a": 1.0, "b": "x", "c": None, "e": None, "weird_name": None},
        {"a": 2.5, "b": None, "c": {"d": True}, "e": None, "weird_name": None},
        {"a": None, "b": None, "c": None, "e": [1, 2], "weird_name": 3},
    ]

    bob = by_user["bob"]
    header, records, _ = read_avro(bob.ref.location)
    assert header["fields"] == [{"name": "a", "type": "long"}]
    assert records == [{"a": 1}, {"a": 2}]
    assert bob.ref.schema_fingerprint == fingerprint(bob.schema) != ann.ref.schema_fingerprint
    assert ann.ref.partition_path == "user=ann/date=2026-11-21"


def test_payload_rolls_and_keeps_every_record(tmp_path: Path) -> None:
    payloads = [
        {"i": i, "text": "y" * (i % 50)} if i % 3 else {"i": i, "f": i / 2} for i in range(900)
    ]
    written = write(payload_plan(max_bytes_per_file=10_000), payload_rows(payloads), tmp_path)
    assert len(written) > 3
    got = []
    for w in written:
        header, records, _ = read_avro(w.ref.location)
        assert header == w.schema
        got.extend(records)
    assert [r["i"] for r in got] == list(range(900))


@pytest.mark.parametrize(
    ("payload", "message"),
    [
        ('{"a": 1', r"row 2 of task partition 3: column payload is not valid JSON"),
        (None, r"row 2 of task partition 3: column payload is null"),
        ("[1, 2]", r"row 2 of task partition 3: column payload holds a JSON list"),
    ],
)
def test_bad_payloads_name_column_and_row(
    tmp_path: Path, payload: str | None, message: str
) -> None:
    rows = payload_rows([{"a": 1}, {"a": 2}, payload, {"a": 3}])
    with pytest.raises(InputError, match=message):
        write(payload_plan(), rows, tmp_path)


def test_payload_rewrite_is_byte_identical(tmp_path: Path) -> None:
    rows = payload_rows([{"a": i, "b": [i] * (i % 3)} for i in range(100)])
    first = write(payload_plan(codec="snappy"), rows, tmp_path / "a", naming=FileNaming(1, 0, 0))
    second = write(payload_plan(codec="snappy"), rows, tmp_path / "b", naming=FileNaming(1, 0, 1))
    assert Path(first[0].ref.location).read_bytes() == Path(second[0].ref.location).read_bytes()


# --- plan ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"partition_by": ["usr"]}, ConfigError, r"partitionBy names column 'usr'"),
        ({"partition_by": ["user", "user"]}, ConfigError, "twice"),
        ({"partition_by": ["ts"]}, InputError, "partition column ts is timestamp"),
        ({"time_column": "ts"}, ConfigError, "go together"),
        ({"time_pattern": "hour=HH"}, ConfigError, "go together"),
        (
            {"time_column": "tz", "time_pattern": "hour=HH"},
            ConfigError,
            "timePartitionColumn names column 'tz'",
        ),
        (
            {"time_column": "message", "time_pattern": "hour=HH"},
            InputError,
            "column message is string; option timePartitionColumn needs a timestamp",
        ),
        (
            {"time_column": "ts", "time_pattern": "level=HH"},
            ConfigError,
            "like the column level",
        ),
        ({"time_column": "ts", "time_pattern": "h=hh"}, ConfigError, "timePartitionPattern"),
        (
            {"time_column": "ts", "time_pattern": "h=HH", "time_zone_name": "Nowhere/X"},
            ConfigError,
            "timePartitionTimeZone",
        ),
        ({"payload_column": "body"}, ConfigError, "payloadColumn names column 'body'"),
        ({"payload_column": "status"}, InputError, "column status is int; option payloadColumn"),
        (
            {"payload_column": "user", "partition_by": ["user"]},
            ConfigError,
            "both payloadColumn and a partition column",
        ),
        ({"codec": "lzo"}, ConfigError, "avroCodec must be one of"),
        ({"max_records_per_file": -1}, ConfigError, "maxRecordsPerFile"),
        ({"max_bytes_per_file": 0}, ConfigError, "maxBytesPerFile"),
        ({"max_open_files": 0}, ConfigError, "maxOpenFiles"),
    ],
)
def test_plan_rejects(kwargs: dict[str, Any], error: type[Exception], message: str) -> None:
    with pytest.raises(error, match=message):
        plan_files(LOGS, **kwargs)


def test_plan_rejects_partitioning_every_column() -> None:
    with pytest.raises(ConfigError, match="partitionBy names every column"):
        plan_files(StructType(LOGS.fields[:2]), partition_by=["id", "user"])


def test_plan_rejects_columns_avro_cannot_hold() -> None:
    schema = StructType([*LOGS.fields, StructField("m", MapType(IntegerType(), StringType()))])
    with pytest.raises(InputError, match="column m"):
        plan_files(schema)
    # In payload mode only the payload is written: other columns may have any type.
    plan_files(StructType([*PAYLOADS.fields, *schema.fields[-1:]]), payload_column="payload")


def test_plan_pickles(tmp_path: Path) -> None:
    plan = plan_files(
        LOGS,
        partition_by=["user"],
        time_column="ts",
        time_pattern="date=yyyy-MM-dd/hour=HH",
        time_zone_name="Europe/Paris",
        codec="SNAPPY",
    )
    assert plan.codec == "snappy"
    copy = pickle.loads(pickle.dumps(plan))
    assert copy == plan
    (written,) = write(copy, [log_row(1, "ann")], tmp_path)
    assert written.ref.partition_path == "user=ann/date=2026-11-21/hour=06"


# --- schemas beside the files, the local sink ---------------------------------------------


def test_store_schema_once(tmp_path: Path) -> None:
    sink = LocalFileSink(tmp_path)
    schema = plan_files(LOGS).avro_schema()
    name = store_schema(sink, schema)
    assert name == f"_schemas/{schema_digest(schema)}.avsc"
    assert json.loads((tmp_path / name).read_text()) == schema
    assert store_schema(sink, schema) == name
    assert sink.put_text(name, "other") is False
    assert json.loads((tmp_path / name).read_text()) == schema


def test_local_sink_list_and_delete(tmp_path: Path) -> None:
    sink = LocalFileSink(tmp_path / "root")
    source = tmp_path / "data"
    source.write_bytes(b"12345")
    assert sink.upload(source, "a=1/f.avro") == str(tmp_path / "root" / "a=1" / "f.avro")
    source.write_bytes(b"12345")
    sink.upload(source, "a=2/g.avro")
    (tmp_path / "root" / "a=2" / ".h.avro.1234.tmp").write_bytes(b"x")  # a crashed upload
    listed = sink.list()
    assert [f.name for f in listed] == ["a=1/f.avro", "a=2/.h.avro.1234.tmp", "a=2/g.avro"]
    assert [f.bytes for f in listed] == [5, 1, 5]
    assert [f.name for f in sink.list("a=2/")] == ["a=2/.h.avro.1234.tmp", "a=2/g.avro"]
    sink.delete("a=2/.h.avro.1234.tmp")
    sink.delete("a=1/f.avro")
    sink.delete("a=1/f.avro")  # missing: no error
    assert [f.name for f in sink.list()] == ["a=2/g.avro"]
    assert sink.list("nothing/") == []
    for bad in ("", "../x", "a//b", ".hidden"):
        with pytest.raises(StagingError, match="invalid file name"):
            sink.upload(source, bad)


def test_local_sink_copies_across_file_systems(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    source = tmp_path / "spool.avro"
    source.write_bytes(b"avro bytes")
    real_replace = os.replace

    def replace(src: Any, dst: Any) -> None:
        if Path(src) == source:  # the spool is on another file system
            raise OSError(errno.EXDEV, "Invalid cross-device link")
        real_replace(src, dst)

    monkeypatch.setattr(os, "replace", replace)
    sink = LocalFileSink(tmp_path / "root")
    location = sink.upload(source, "k=v/f.avro")
    assert Path(location).read_bytes() == b"avro bytes"
    assert [f.name for f in sink.list()] == ["k=v/f.avro"]  # no temporary file left


def test_local_sink_unwritable_root(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    source = tmp_path / "data"
    source.write_bytes(b"1")
    with pytest.raises(StagingError, match="cannot create directory"):
        LocalFileSink(blocker / "root").upload(source, "x.avro")


def test_closed_file_set_refuses_rows(tmp_path: Path) -> None:
    plan = plan_files(LOGS)
    files = FileSet(plan, LocalFileSink(tmp_path), FileNaming(0, 0, 0))
    files.add(log_row(0, "a"))
    first = files.close()
    assert files.close() == first
    with pytest.raises(StagingError, match="closed"):
        files.add(log_row(1, "a"))


# --- property: every payload reads back under its file's schema ----------------------------

KEYS = st.sampled_from(["a", "b", "a-b", "1x", "é"])
SCALARS = (
    st.none()
    | st.booleans()
    | st.integers(-(2**64), 2**64)
    | st.floats(allow_nan=False)
    | st.text(max_size=4)
    | st.just("\ud800")
)
JSON_VALUES = st.recursive(
    SCALARS,
    lambda children: st.lists(children, max_size=3) | st.dictionaries(KEYS, children, max_size=3),
    max_leaves=8,
)
KEYED_OBJECTS = st.lists(
    st.tuples(st.sampled_from(["ann", "bob"]), st.dictionaries(KEYS, JSON_VALUES, max_size=4)),
    min_size=1,
    max_size=12,
)


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    keyed=KEYED_OBJECTS,
    mode=st.sampled_from(["union", "string"]),
    max_records=st.integers(0, 4),
)
def test_every_payload_reads_back_under_its_files_schema(
    tmp_path_factory: pytest.TempPathFactory,
    keyed: list[tuple[str, dict[str, Any]]],
    mode: Irreconcilable,
    max_records: int,
) -> None:
    root = tmp_path_factory.mktemp("prop")
    rows = [(user, START, json.dumps(obj)) for user, obj in keyed]
    plan = payload_plan(irreconcilable=mode, max_records_per_file=max_records, codec="snappy")
    written = write(plan, rows, root, durable=False)
    assert sum(w.ref.records for w in written) == len(rows)
    remaining = {user: [obj for u, obj in keyed if u == user] for user in ("ann", "bob")}
    for w in written:
        user = w.ref.partition_values["user"]
        assert user is not None
        payloads = remaining[user][: w.ref.records]
        remaining[user] = remaining[user][w.ref.records :]
        aggregator = SchemaAggregator(irreconcilable=mode)
        for obj in payloads:
            aggregator.add(json.loads(json.dumps(obj)))
        header, records, _ = read_avro(w.ref.location)
        assert header == w.schema == aggregator.schema()
        assert records == [aggregator.conform(json.loads(json.dumps(o))) for o in payloads]
    assert remaining == {"ann": [], "bob": []}
