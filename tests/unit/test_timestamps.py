"""Timestamps in a Python worker whose local time zone has daylight saving time (issue 39,
item 5): instants are written exactly, or refused where PySpark has lost them already.

PySpark 4.0's row writer turns Arrow's instants into naive local times with
`value.astimezone().replace(tzinfo=None)`, which drops `fold`: the two instants of the hour
New York repeats on 2 November 2025 become the same local time. The Arrow writer (4.1+) hands
the instants over whole; the sink's own fallbacks then must not go through that conversion.
`timestamp_ntz` values are wall-clock times, written as they are whatever the worker's zone.
"""

from __future__ import annotations

import io
import json
import os
import random
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import date, datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import fastavro
import pyarrow as pa
import pytest
from pyspark.sql import Row
from pyspark.sql.conversion import ArrowTableToRowsConversion
from pyspark.sql.types import (
    ArrayType,
    DateType,
    LongType,
    MapType,
    NullType,
    StringType,
    StructField,
    StructType,
    TimestampNTZType,
    TimestampType,
)

from kafka_txn_sink.errors import ConfigError, InputError
from kafka_txn_sink.files.naming import FileNaming
from kafka_txn_sink.files.plan import FilePlan, plan_files
from kafka_txn_sink.files.spark_avro import row_converter
from kafka_txn_sink.files.spark_rows import arrow_rows
from kafka_txn_sink.files.writer import FileSet
from kafka_txn_sink.serde.encode import COLUMN_MIN_ROWS, FieldEncoder
from kafka_txn_sink.serde.protobuf import compile_proto, message_reader
from kafka_txn_sink.serde.resolve import Encoding, derived_schema
from kafka_txn_sink.serde.timestamps import instant_converter, local_is_utc, repeating_zone_error
from kafka_txn_sink.storage.files import LocalFileSink

NEW_YORK = "America/New_York"
UTC = timezone.utc


def utc(
    year: int, month: int, day: int, hour: int = 0, minute: int = 0, second: int = 0, micro: int = 0
) -> datetime:
    return datetime(year, month, day, hour, minute, second, micro, tzinfo=UTC)


# Around New York's two changes: 01:00-01:59 happens twice on 2 November 2025 (EDT, then EST),
# 02:00-02:59 never on 8 March 2026.
FIRST = utc(2025, 11, 2, 5, 30, 0, 123000)  # 01:30:00.123 EDT
SECOND = utc(2025, 11, 2, 6, 30, 0, 123000)  # 01:30:00.123 EST: the same local time
INSTANTS = [
    utc(2025, 11, 2, 4, 59, 59, 999000),  # 00:59:59.999 EDT
    utc(2025, 11, 2, 5, 0),  # 01:00 EDT, the repeated hour begins
    FIRST,
    SECOND,
    utc(2025, 11, 2, 6, 59, 59, 999000),  # 01:59:59.999 EST
    utc(2025, 11, 2, 7, 0),  # 02:00 EST
    utc(2026, 3, 8, 6, 59, 59, 999000),  # 01:59:59.999 EST
    utc(2026, 3, 8, 7, 0),  # 03:00 EDT
    utc(2026, 3, 8, 7, 30, 0, 123000),  # 03:30 EDT
]
# The instants PySpark 4.0's row writer hands over as a local time of the repeated hour.
REPEATED = {i for i in INSTANTS if utc(2025, 11, 2, 5) <= i < utc(2025, 11, 2, 7)}

VALUE = StructType(
    [
        StructField("at", TimestampType()),
        StructField("ntz", TimestampNTZType()),
        StructField("day", DateType()),
    ]
)
USER_AVRO = {  # the user's schema: millis, and a timestamp_ntz in an instant's field
    "type": "record",
    "name": "Value",
    "fields": [
        {"name": n, "type": ["null", {"type": t, "logicalType": lt}], "default": None}
        for n, t, lt in (
            ("at", "long", "timestamp-millis"),
            ("ntz", "long", "timestamp-micros"),
            ("day", "int", "date"),
        )
    ],
}
PROTO = """
syntax = "proto3";
import "google/protobuf/timestamp.proto";
message Value {
  google.protobuf.Timestamp at = 1;
  google.protobuf.Timestamp ntz = 2;
  string day = 3;
}
"""
FORMATS = ["avro", "avro-user", "json-schema", "protobuf"]


@contextmanager
def in_zone(name: str) -> Iterator[None]:
    """This process's local time zone set to `name` (as TZ sets a Python worker's)."""
    saved = os.environ.get("TZ")
    os.environ["TZ"] = name
    time.tzset()
    try:
        yield
    finally:
        if saved is None:
            del os.environ["TZ"]
        else:
            os.environ["TZ"] = saved
        time.tzset()


def row_writer_cells(instants: list[datetime]) -> list[datetime]:
    """The cells PySpark 4.0's row writer hands the sink for `instants`, in this process's
    zone: Arrow's values through its converter (pyspark/sql/worker/write_into_data_source.py)."""
    convert = ArrowTableToRowsConversion._create_converter(TimestampType())
    return [convert(v) for v in pa.array(instants, pa.timestamp("us", tz="UTC")).to_pylist()]


def wall_of(instant: datetime) -> datetime:
    """The timestamp_ntz of a row: New York's wall clock, even where it repeats or skips."""
    return (instant - timedelta(hours=5)).replace(tzinfo=None)


def expected(instant: datetime) -> dict[str, Any]:
    return {"at": instant, "ntz": wall_of(instant), "day": instant.date()}


def encoding(fmt: str) -> Encoding:
    if fmt == "protobuf":
        return Encoding("value", "protobuf", "s", 9, PROTO, VALUE, compile_proto(PROTO))
    if fmt == "avro-user":
        return Encoding("value", "avro", "s", 9, json.dumps(USER_AVRO), VALUE)
    return Encoding("value", fmt, "s", 9, derived_schema("value", VALUE, fmt), VALUE)  # type: ignore[arg-type]


def decode(fmt: str, data: bytes | None) -> dict[str, Any]:
    """A value as a reader gets it: instants aware, timestamp_ntz naive, dates."""
    assert data is not None
    body = data[5:]
    if fmt in ("avro", "avro-user"):
        schema = json.loads(encoding(fmt).schema)
        found = fastavro.schemaless_reader(io.BytesIO(body), schema)
        assert isinstance(found, dict)
        ntz = found["ntz"]
        return {**found, "ntz": ntz.replace(tzinfo=None) if ntz.tzinfo else ntz}
    found = json.loads(body) if fmt == "json-schema" else message_reader(PROTO)(body)
    return {name: READERS[name](text) for name, text in found.items()}


READERS: dict[str, Callable[[str], Any]] = {
    "at": datetime.fromisoformat,
    "ntz": lambda text: datetime.fromisoformat(text).replace(tzinfo=None),
    "day": date.fromisoformat,
}


def outcome(write: Callable[..., Any], *args: Any) -> Any:
    """What `write(*args)` gives, or "refused" for an error that says what to set."""
    try:
        return write(*args)
    except (InputError, ConfigError) as exc:
        if "TZ=UTC" not in str(exc):
            raise
        return "refused"


def encode_one(fmt: str, encoder: FieldEncoder, cell: Any) -> dict[str, Any]:
    """One cell through the row path's encoder, decoded."""
    return decode(fmt, encoder.cells([cell], 0)[0])


# -- the cause ------------------------------------------------------------------------------------


def test_pyspark_s_row_writer_hands_both_instants_of_the_repeated_hour_as_one_local_time() -> None:
    with in_zone(NEW_YORK):
        first, second = row_writer_cells([FIRST, SECOND])
        # What any reading of a naive local time gives back: Python's own rules, fold 0.
        assert first == second == datetime(2025, 11, 2, 1, 30, 0, 123000)
        assert (first.fold, second.fold) == (0, 0)
        assert second.astimezone(UTC) == FIRST  # one hour early: the two rows


# -- records mode ---------------------------------------------------------------------------------


@pytest.mark.parametrize("fmt", FORMATS)
def test_the_row_writer_s_cells_are_written_exactly_or_refused(fmt: str) -> None:
    with in_zone(NEW_YORK):
        rows = [
            Row(at=at, ntz=wall_of(i), day=i.date())
            for at, i in zip(row_writer_cells(INSTANTS), INSTANTS, strict=True)
        ]
        encoder = FieldEncoder(encoding(fmt))
        found = {
            i: outcome(encode_one, fmt, encoder, row) for i, row in zip(INSTANTS, rows, strict=True)
        }
        exact = [(i, r) for i, r in zip(INSTANTS, rows, strict=True) if i not in REPEATED]
        many = [r for _, r in exact] * COLUMN_MIN_ROWS  # the column path, for Avro
        together = [decode(fmt, c) for c in encoder.cells(many, 0)]
        refused = outcome(encoder.cells, rows * COLUMN_MIN_ROWS, 0)

    assert found == {i: "refused" if i in REPEATED else expected(i) for i in INSTANTS}
    assert together == [expected(i) for i, _ in exact] * COLUMN_MIN_ROWS
    assert refused == "refused"


def value_array(instants: list[datetime], session_zone: str) -> pa.StructArray:
    """The value column as Spark's Arrow writer sends it: instants in the session's zone."""
    return pa.StructArray.from_arrays(
        [
            pa.array(instants, pa.timestamp("us", tz=session_zone)),
            pa.array([wall_of(i) for i in instants], pa.timestamp("us")),
            pa.array([i.date() for i in instants], pa.date32()),
        ],
        names=["at", "ntz", "day"],
    )


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("session_zone", ["UTC", NEW_YORK])
def test_the_arrow_writer_s_columns_are_written_exactly(fmt: str, session_zone: str) -> None:
    with in_zone(NEW_YORK):
        cells = FieldEncoder(encoding(fmt)).array(value_array(INSTANTS, session_zone), 0)

    assert [decode(fmt, c) for c in cells] == [expected(i) for i in INSTANTS]


def test_a_local_time_repeated_only_in_the_zone_s_past_is_refused_and_the_rest_exact() -> None:
    # Sao Paulo left daylight saving time in 2019; 23:00-23:59 happened twice on 16 Feb 2019.
    repeated = [utc(2019, 2, 17, 1, 30), utc(2019, 2, 17, 2, 30)]
    today = [utc(2025, 11, 2, 6, 30), utc(2026, 3, 8, 7, 30)]
    struct = StructType([StructField("at", TimestampType())])
    enc = Encoding(
        "value", "json-schema", "s", 9, derived_schema("value", struct, "json-schema"), struct
    )
    with in_zone("America/Sao_Paulo"):
        cells = [Row(at=at) for at in row_writer_cells(repeated + today)]
        encoder = FieldEncoder(enc)
        found = [outcome(encode_one, "json-schema", encoder, c) for c in cells]

    assert found[:2] == ["refused", "refused"]
    assert [f["at"] for f in found[2:]] == today


# -- files mode -----------------------------------------------------------------------------------

FILE_SCHEMA = StructType([StructField("id", LongType(), False), *VALUE.fields])
VOID = StructField("none", NullType())  # arrow-avro cannot write it: the batch goes as rows


def files_plan(schema: StructType = FILE_SCHEMA) -> FilePlan:
    payload = "payload" in schema.names
    return plan_files(
        schema,
        time_column="at",
        time_pattern="date=yyyy-MM-dd/hour=HH",
        payload_column="payload" if payload else None,
    )


def file_set(plan: FilePlan, root: Path) -> FileSet:
    return FileSet(plan, LocalFileSink(root, durable=False), FileNaming(7, 3, 0))


def written(files: FileSet) -> dict[int, tuple[str, Any]]:
    """Each row's directory and record (less its id), by id."""
    found: dict[int, tuple[str, Any]] = {}
    for item in files.close():
        with open(item.ref.location, "rb") as avro:
            for record in fastavro.reader(avro):
                assert isinstance(record, dict)
                found[record.pop("id")] = (item.ref.partition_path, record)
    return found


def directory(instant: datetime) -> str:
    return f"date={instant:%Y-%m-%d}/hour={instant:%H}"


def test_files_of_the_row_writer_s_rows_are_exact_or_refused(tmp_path: Path) -> None:
    refused = set()
    with in_zone(NEW_YORK):
        files = file_set(files_plan(), tmp_path)
        cells = row_writer_cells(INSTANTS)
        for n, (at, instant) in enumerate(zip(cells, INSTANTS, strict=True)):
            row = (n, at, wall_of(instant), instant.date())
            if outcome(files.add, row) == "refused":
                refused.add(instant)
        found = written(files)

    assert refused == REPEATED
    assert found == {
        n: (directory(i), expected(i)) for n, i in enumerate(INSTANTS) if i not in REPEATED
    }


@pytest.mark.parametrize("session_zone", ["UTC", NEW_YORK])
@pytest.mark.parametrize("void", [False, True])
def test_files_of_the_arrow_writer_s_batches_are_exact(
    tmp_path: Path, session_zone: str, void: bool
) -> None:
    count = len(INSTANTS)
    schema = StructType([*FILE_SCHEMA.fields, *([VOID] if void else [])])
    values = value_array(INSTANTS, session_zone)
    columns = [pa.array(range(count), pa.int64()), *values.flatten()]
    batch = pa.RecordBatch.from_arrays(
        [*columns, *([pa.nulls(count)] if void else [])], names=schema.names
    )
    with in_zone(NEW_YORK):
        files = file_set(files_plan(schema), tmp_path)
        assert files.accepts(batch.schema) is not void
        files.add_batch(batch)
        found = written(files)

    more = {"none": None} if void else {}
    assert found == {n: (directory(i), {**expected(i), **more}) for n, i in enumerate(INSTANTS)}


@pytest.mark.parametrize("arrow", [False, True])
def test_payload_files_are_in_the_directory_of_their_instant(tmp_path: Path, arrow: bool) -> None:
    schema = StructType([*FILE_SCHEMA.fields[:2], StructField("payload", StringType())])
    payloads = [json.dumps({"id": n}) for n in range(len(INSTANTS))]
    with in_zone(NEW_YORK):
        files = file_set(files_plan(schema), tmp_path)
        if arrow:  # a line break: the batch goes as PySpark's rows
            times = pa.array(INSTANTS, pa.timestamp("us", tz=NEW_YORK))
            texts = pa.array([p.replace(":", ":\n") for p in payloads])
            ids = pa.array(range(len(INSTANTS)), pa.int64())
            files.add_batch(pa.RecordBatch.from_arrays([ids, times, texts], names=schema.names))
        else:
            rows = zip(range(len(INSTANTS)), row_writer_cells(INSTANTS), payloads, strict=True)
            for row in rows:
                outcome(files.add, row)
        found = {n: d for n, (d, _) in written(files).items()}

    exact = [i for i in INSTANTS if arrow or i not in REPEATED]
    assert found == {INSTANTS.index(i): directory(i) for i in exact}


# -- the conversion itself -----------------------------------------------------------------------

ZONES = [
    "UTC",
    NEW_YORK,
    "Australia/Lord_Howe",  # half an hour of daylight saving time
    "America/Sao_Paulo",
    "Asia/Kolkata",
    "Africa/Abidjan",  # GMT since 1912, its local mean time before
    "Europe/Dublin",  # negative daylight saving time in tzdata
]


@pytest.mark.parametrize("zone", ZONES)
def test_fold_aware_local_times_are_the_instants_python_reads(zone: str) -> None:
    # As `TimestampType.fromInternal` makes them (datetime.fromtimestamp sets fold).
    rnd = random.Random(zone)
    seconds = [rnd.randrange(-2_208_988_800, 4_102_444_800) for _ in range(3000)]
    seconds += [int(i.timestamp()) + d for i in INSTANTS for d in (-3600, 0, 1800, 3600)]
    schema = StructType([StructField("at", TimestampType())])
    with in_zone(zone):
        local = [datetime.fromtimestamp(s).replace(microsecond=s % 997) for s in seconds]
        convert = row_converter(schema)
        found = [convert((v,))["at"] for v in local]
        python = [v.astimezone(UTC) for v in local]

    assert found == python
    assert [f.tzinfo for f in found] == [UTC] * len(found)


@pytest.mark.parametrize("zone", ZONES)
def test_the_row_writer_s_local_times_are_their_instants_where_the_zone_has_one(zone: str) -> None:
    rnd = random.Random(zone)
    seconds = [rnd.randrange(-2_208_988_800, 4_102_444_800) for _ in range(3000)]
    seconds += [int(i.timestamp()) + d for i in INSTANTS for d in range(-7200, 7201, 900)]
    with in_zone(zone):
        convert = instant_converter(from_row_writer=True)
        for s in seconds:
            local = datetime.fromtimestamp(s)
            earlier = local.replace(fold=0).astimezone(UTC)
            later = local.replace(fold=1).astimezone(UTC)
            if earlier == later or local.fold:
                assert convert(local) == local.astimezone(UTC), local
            else:  # a repeated local time, as the row writer hands it over (fold 0)
                with pytest.raises(InputError, match=r"repeats when its clocks go back.*TZ=UTC"):
                    convert(local)


def test_a_local_time_the_zone_skips_is_refused_from_the_row_writer() -> None:
    skipped = datetime(2026, 3, 8, 2, 30)  # no instant has it in New York
    with in_zone(NEW_YORK):
        with pytest.raises(InputError, match=r"\(America/New_York\) skips.*TZ=UTC"):
            instant_converter(from_row_writer=True)(skipped)
        assert instant_converter()(skipped) == skipped.astimezone(UTC)  # Python's reading


def test_the_driver_refuses_a_zone_that_repeats_an_hour_within_a_year() -> None:
    now = FIRST.timestamp() - 200 * 86400  # April 2025
    errors = {}
    for zone in (
        "UTC",
        "Etc/UTC",
        "Asia/Kolkata",
        "America/Sao_Paulo",
        NEW_YORK,
        "Australia/Lord_Howe",
    ):
        with in_zone(zone):
            errors[zone] = repeating_zone_error(now)
    with in_zone("America/Sao_Paulo"):
        errors["Sao_Paulo in 2018"] = repeating_zone_error(utc(2018, 6, 1).timestamp())

    refused = {z for z, e in errors.items() if e is not None}
    assert refused == {NEW_YORK, "Australia/Lord_Howe", "Sao_Paulo in 2018"}
    message = str(errors[NEW_YORK])
    assert "(America/New_York) repeats an hour" in message
    assert "spark.executorEnv.TZ=UTC" in message


@pytest.mark.parametrize(
    ("zone", "utc_always"),
    [
        ("UTC", True),
        (":Etc/UTC", True),
        ("", True),
        ("/usr/share/zoneinfo/UTC", True),
        ("Africa/Abidjan", False),
        ("Atlantic/Reykjavik", False),
        (NEW_YORK, False),
    ],
)
def test_only_a_zone_that_was_always_utc_reads_naive_times_as_utc(
    zone: str, utc_always: bool
) -> None:
    with in_zone(zone):
        assert local_is_utc() is utc_always
        naive = datetime(1911, 6, 1, 12)  # Abidjan: 00:16:08 behind GMT until 1912
        assert instant_converter()(naive) == naive.astimezone(UTC)


def test_timestamp_ntz_in_protobuf_is_utc_in_a_timestamp_and_text_in_a_string() -> None:
    proto = """
    syntax = "proto3";
    import "google/protobuf/timestamp.proto";
    message V {
      message Item { google.protobuf.Timestamp at = 1; string text = 2; }
      repeated Item items = 1;
      map<string, google.protobuf.Timestamp> by = 2;
      string text = 3;
    }
    """
    item = StructType(
        [StructField("at", TimestampNTZType()), StructField("text", TimestampNTZType())]
    )
    struct = StructType(
        [
            StructField("items", ArrayType(item)),
            StructField("by", MapType(StringType(), TimestampNTZType())),
            StructField("text", TimestampNTZType()),
        ]
    )
    wall = datetime(2026, 3, 8, 2, 30)  # skipped in New York, a wall clock all the same
    enc = Encoding("value", "protobuf", "s", 9, proto, struct, compile_proto(proto))
    with in_zone(NEW_YORK):
        [cell] = FieldEncoder(enc).cells(
            [Row(items=[Row(at=wall, text=wall)], by={"k": wall}, text=wall)], 0
        )
    assert cell is not None
    assert message_reader(proto)(cell[5:]) == {
        "items": [{"at": "2026-03-08T02:30:00Z", "text": "2026-03-08T02:30:00"}],
        "by": {"k": "2026-03-08T02:30:00Z"},
        "text": "2026-03-08T02:30:00",
    }


def test_json_timestamps_are_utc_text_whatever_the_worker_s_zone() -> None:
    struct = StructType([StructField("at", TimestampType()), StructField("w", TimestampNTZType())])
    enc = Encoding(
        "value", "json-schema", "s", 9, derived_schema("value", struct, "json-schema"), struct
    )
    with in_zone(NEW_YORK):
        [at] = row_writer_cells([SECOND + timedelta(hours=1)])
        [cell] = FieldEncoder(enc).cells([Row(at=at, w=datetime(2026, 3, 8, 2, 30))], 0)
    assert cell is not None
    assert json.loads(cell[5:]) == {
        "at": "2025-11-02T07:30:00.123000+00:00",
        "w": "2026-03-08T02:30:00",
    }


def test_the_arrow_fallback_keeps_nested_instants_aware() -> None:
    schema = StructType(
        [
            StructField("at", TimestampType()),
            StructField("list", ArrayType(TimestampType())),
            StructField("map", MapType(StringType(), TimestampType())),
            StructField("s", StructType([StructField("at", TimestampType())])),
            StructField("ntz", TimestampNTZType()),
        ]
    )
    zoned = pa.timestamp("us", tz=NEW_YORK)
    batch = pa.RecordBatch.from_arrays(
        [
            pa.array([SECOND], zoned),
            pa.array([[SECOND]], pa.list_(zoned)),
            pa.array([[("k", SECOND)]], pa.map_(pa.string(), zoned)),
            pa.array([{"at": SECOND}], pa.struct([("at", zoned)])),
            pa.array([wall_of(SECOND)], pa.timestamp("us")),
        ],
        names=schema.names,
    )
    with in_zone(NEW_YORK):
        [row] = list(arrow_rows(schema, instants=True)(batch))
        [lossy] = list(arrow_rows(schema)(batch))  # PySpark's own rows

    # Aware in the session's zone, fold 1 (an aware time in the fold equals no other zone's).
    instants = [row[0], row[1][0], row[2]["k"], row[3][0]]
    assert [(i.fold, i.astimezone(UTC)) for i in instants] == [(1, SECOND)] * 4
    assert [convert(i) for i in instants for convert in [instant_converter()]] == [SECOND] * 4
    assert row[4] == wall_of(SECOND)
    assert lossy[0] == wall_of(SECOND) and lossy[0].fold == 0  # 01:30, which one is lost
