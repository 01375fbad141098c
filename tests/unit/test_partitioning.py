"""Partition directories: Hive escaping, Java-style time patterns, partition specs."""

from __future__ import annotations

import pickle
from datetime import date, datetime, timedelta, timezone
from decimal import Decimal
from zoneinfo import ZoneInfo

import pytest
from pyspark.sql import Row
from pyspark.sql.types import (
    BooleanType,
    DateType,
    DecimalType,
    IntegerType,
    StringType,
    StructField,
    StructType,
    TimestampNTZType,
    TimestampType,
)

from kafka_txn_sink.errors import ConfigError, InputError
from kafka_txn_sink.files.partitioning import (
    HIVE_DEFAULT_PARTITION,
    PartitionSpec,
    TimePattern,
    hive_escape,
    hive_path,
    time_zone,
)

UTC = ZoneInfo("UTC")
NEW_YORK = ZoneInfo("America/New_York")

# The list in Hive's FileUtils.charToEscape, besides the control characters below 0x20.
HIVE_LIST = "\"#%'*/:=?\\\x7f{[]^"


@pytest.mark.parametrize(
    ("value", "escaped"),
    [
        ("ann", "ann"),
        ("a/b", "a%2Fb"),
        ("10:30", "10%3A30"),
        ("k=v", "k%3Dv"),
        ("100%", "100%25"),
        ("what?", "what%3F"),
        ("a\\b", "a%5Cb"),
        ("line\nbreak\ttab", "line%0Abreak%09tab"),
        ("\x01\x1f\x7f", "%01%1F%7F"),
        ("\x00", "%00"),
        ("\"#'*{[]^", "%22%23%27%2A%7B%5B%5D%5E"),
        # Not escaped: space, '}', '<', '>', '|', '-', '.', '_', '~', ',', '+', '@', '&', '!'.
        ("a b}<>|-._~,+@&!", "a b}<>|-._~,+@&!"),
        ("Zoë/日本/😀", "Zoë%2F日本%2F😀"),
        ("", HIVE_DEFAULT_PARTITION),
        (None, HIVE_DEFAULT_PARTITION),
    ],
)
def test_hive_escape(value: str | None, escaped: str) -> None:
    assert hive_escape(value) == escaped


def test_hive_escape_every_ascii_character() -> None:
    for code in range(128):
        char = chr(code)
        expected = f"%{code:02X}" if code < 0x20 or char in HIVE_LIST else char
        assert hive_escape(char) == expected, repr(char)


def test_hive_path_escapes_names_and_values() -> None:
    assert hive_path((("user", "a/b"), ("k:1", None), ("hour", "05"))) == (
        f"user=a%2Fb/k%3A1={HIVE_DEFAULT_PARTITION}/hour=05"
    )
    assert hive_path(()) == ""


# --- time patterns -----------------------------------------------------------------------


def utc(*args: int) -> datetime:
    return datetime(*args, tzinfo=timezone.utc)  # type: ignore[misc]


def test_date_hour_pattern_in_utc() -> None:
    pattern = TimePattern.parse("date=yyyy-MM-dd/hour=HH")
    assert pattern.names == ("date", "hour")
    assert pattern.format(utc(2026, 11, 21, 5, 7, 9), UTC) == [
        ("date", "2026-11-21"),
        ("hour", "05"),
    ]


def test_other_time_zone_changes_the_day() -> None:
    pattern = TimePattern.parse("date=yyyy-MM-dd/hour=HH")
    assert pattern.format(utc(2026, 11, 21, 23, 30), ZoneInfo("Europe/Paris")) == [
        ("date", "2026-11-22"),
        ("hour", "00"),
    ]
    assert pattern.format(utc(2026, 11, 21, 2, 0), ZoneInfo("Asia/Kolkata")) == [
        ("date", "2026-11-21"),
        ("hour", "07"),
    ]


def test_dst_start_skips_an_hour() -> None:
    # 2026-03-08: New York jumps from 01:59:59 EST to 03:00 EDT.
    pattern = TimePattern.parse("hour=HH")
    hours = {
        pattern.format(utc(2026, 3, 8, 5, 0) + timedelta(minutes=30 * i), NEW_YORK)[0][1]
        for i in range(10)
    }
    assert hours == {"00", "01", "03", "04", "05"}  # 05:00Z..09:30Z, no 02


def test_dst_end_shares_an_hour() -> None:
    # 2026-11-01: 05:30Z is 01:30 EDT, 06:30Z is 01:30 EST: two instants, one directory.
    pattern = TimePattern.parse("date=yyyy-MM-dd/hour=HH")
    first = pattern.format(utc(2026, 11, 1, 5, 30), NEW_YORK)
    second = pattern.format(utc(2026, 11, 1, 6, 30), NEW_YORK)
    assert first == second == [("date", "2026-11-01"), ("hour", "01")]


def test_naive_timestamp_is_a_wall_clock_time() -> None:
    pattern = TimePattern.parse("hour=HH")
    assert pattern.format(datetime(2026, 11, 1, 1, 30), NEW_YORK) == [("hour", "01")]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("y=yy", "26"),
        ("y=y", "2026"),
        ("y=yyy", "2026"),
        ("m=M/d=d", "3|8"),
        ("m=MM/d=dd", "03|08"),
        ("doy=DDD", "067"),
        ("doy=DD", "67"),
        ("doy=D", "67"),
        ("t=H.m.s", "5.7.9"),
        ("t=HH:mm:ss", "05:07:09"),
        ("t=yyyy'T'HH", "2026T05"),
        ("t='week of' yyyy", "week of 2026"),
        ("t=HH' o''clock'", "05 o'clock"),
        ("t=''yy''", "'26'"),
        ("t='a/b'HH", "a/b05"),
        ("t=yyyyMMdd-HH%", "20260308-05%"),
    ],
)
def test_pattern_letters_and_literals(text: str, expected: str) -> None:
    pattern = TimePattern.parse(text)
    values = pattern.format(utc(2026, 3, 8, 5, 7, 9), UTC)
    assert "|".join(v for _, v in values) == expected


def test_day_of_year_at_year_end_and_small_years() -> None:
    pattern = TimePattern.parse("d=DDD/y=yyyy/s=yy")
    assert pattern.format(datetime(2024, 12, 31), UTC) == [
        ("d", "366"),
        ("y", "2024"),
        ("s", "24"),
    ]
    assert pattern.format(datetime(987, 1, 2), UTC) == [("d", "002"), ("y", "0987"), ("s", "87")]


@pytest.mark.parametrize("letter", ["h", "a", "E", "S", "u", "Y", "k", "z", "X", "w", "G"])
def test_unsupported_letters_are_refused(letter: str) -> None:
    with pytest.raises(ConfigError) as info:
        TimePattern.parse(f"x=yyyy{letter}")
    assert "timePartitionPattern" in str(info.value)
    assert repr(letter) in str(info.value)


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("d=MMM", "'MMM'"),
        ("h=HHH", "'HHH'"),
        ("y=yyyyy", "'yyyyy'"),
        ("d=DDDD", "'DDDD'"),
        ("d=yyyy[-MM]", "reserved"),
        ("d=yyyy#", "reserved"),
        ("d='open", "unterminated quote"),
        ("", "empty"),
        ("yyyy-MM-dd", "not name=pattern"),
        ("=yyyy", "not name=pattern"),
        ("date=", "not name=pattern"),
        ("date=yyyy//hour=HH", "not name=pattern"),
        ("h=HH/h=H", "twice"),
    ],
)
def test_invalid_patterns_are_refused(text: str, fragment: str) -> None:
    with pytest.raises(ConfigError) as info:
        TimePattern.parse(text)
    assert "timePartitionPattern" in str(info.value)
    assert fragment in str(info.value)


def test_pattern_pickles_and_compares_by_text() -> None:
    pattern = TimePattern.parse("date=yyyy-MM-dd/hour=HH")
    copy = pickle.loads(pickle.dumps(pattern))
    assert copy == pattern
    assert copy.format(utc(2026, 1, 2, 3), UTC) == pattern.format(utc(2026, 1, 2, 3), UTC)


def test_cache_never_confuses_instants() -> None:
    pattern = TimePattern.parse("date=yyyy-MM-dd/hour=HH/min=mm")
    start = utc(2026, 3, 1)
    for i in range(0, 10_000, 7):
        ts = start + timedelta(minutes=i)
        local = ts.astimezone(NEW_YORK)
        assert pattern.format(ts, NEW_YORK) == [
            ("date", local.strftime("%Y-%m-%d")),
            ("hour", local.strftime("%H")),
            ("min", local.strftime("%M")),
        ]


def test_unknown_time_zone() -> None:
    assert time_zone("Europe/Paris") == ZoneInfo("Europe/Paris")
    with pytest.raises(ConfigError, match=r"timePartitionTimeZone.*Mars/Olympus"):
        time_zone("Mars/Olympus")


# --- partition specs ---------------------------------------------------------------------

SCHEMA = StructType(
    [
        StructField("user", StringType()),
        StructField("n", IntegerType()),
        StructField("ok", BooleanType()),
        StructField("day", DateType()),
        StructField("price", DecimalType(10, 2)),
        StructField("ts", TimestampType()),
    ]
)


def spec(**kwargs: object) -> PartitionSpec:
    defaults: dict[str, object] = {
        "columns": ("user", "n", "ok", "day", "price"),
        "time": TimePattern.parse("date=yyyy-MM-dd/hour=HH"),
        "time_column": "ts",
        "tz": UTC,
    }
    return PartitionSpec(**{**defaults, **kwargs})  # type: ignore[arg-type]


def row(**values: object) -> Row:
    defaults: dict[str, object] = {
        "user": "ann",
        "n": 7,
        "ok": True,
        "day": date(2026, 1, 2),
        "price": Decimal("12.50"),
        "ts": utc(2026, 11, 21, 5, 7),
    }
    merged = {**defaults, **values}
    return Row(*SCHEMA.names)(*(merged[n] for n in SCHEMA.names))


def test_values_and_path() -> None:
    s = spec()
    values = s.values(row())
    assert values == (
        ("user", "ann"),
        ("n", "7"),
        ("ok", "true"),
        ("day", "2026-01-02"),
        ("price", "12.50"),
        ("date", "2026-11-21"),
        ("hour", "05"),
    )
    assert (
        s.path(values) == "user=ann/n=7/ok=true/day=2026-01-02/price=12.50/date=2026-11-21/hour=05"
    )
    assert s.extractor(SCHEMA)(row()) == values


@pytest.mark.parametrize("empty", [None, ""])
def test_null_and_empty_values_are_the_default_partition(empty: str | None) -> None:
    s = spec(columns=("user", "n"))
    values = s.values(row(user=empty, n=None))
    assert values[:2] == (("user", None), ("n", None))
    assert s.extractor(SCHEMA)(row(user=empty, n=None)) == values
    assert s.path(values).startswith(
        f"user={HIVE_DEFAULT_PARTITION}/n={HIVE_DEFAULT_PARTITION}/date="
    )


def test_values_of_dict_rows() -> None:
    s = spec(columns=("user",))
    assert s.values({"user": "a:b", "ts": utc(2026, 1, 1)}) == (
        ("user", "a:b"),
        ("date", "2026-01-01"),
        ("hour", "00"),
    )


def test_null_timestamp_names_the_column() -> None:
    with pytest.raises(InputError, match="column ts is null"):
        spec().values(row(ts=None))
    with pytest.raises(InputError, match="column ts is null"):
        spec().extractor(SCHEMA)(row(ts=None))


def test_timestamp_of_the_wrong_type_names_the_column() -> None:
    with pytest.raises(InputError, match="column ts holds a str"):
        spec().values(row(ts="2026-01-01"))


def test_naive_timestamps_are_local_instants_unless_ntz() -> None:
    naive = datetime(2026, 11, 21, 5, 30)
    s = spec(columns=(), tz=NEW_YORK)
    expected = naive.astimezone(NEW_YORK).strftime("%H")  # PySpark: worker's local time
    assert s.values({"ts": naive})[1] == ("hour", expected)
    ntz = spec(columns=(), tz=NEW_YORK, time_ntz=True)
    assert ntz.values({"ts": naive})[1] == ("hour", "05")
    ntz_schema = StructType([StructField("ts", TimestampNTZType())])
    assert ntz.extractor(ntz_schema)((naive,))[1] == ("hour", "05")


def test_unsupported_partition_value_names_the_column() -> None:
    with pytest.raises(InputError, match=r"partition column user: .* float"):
        spec(columns=("user",)).values(row(user=1.5))


def test_spec_checks() -> None:
    with pytest.raises(ConfigError, match="go together"):
        PartitionSpec(("user",), None, "ts")
    with pytest.raises(ConfigError, match="appear twice"):
        PartitionSpec(("date",), TimePattern.parse("date=yyyy-MM-dd"), "ts")
    with pytest.raises(ConfigError, match="partitionBy names column 'usr'"):
        PartitionSpec(("usr",)).extractor(SCHEMA)
    with pytest.raises(ConfigError, match="timePartitionColumn names column 'time'"):
        spec(time_column="time").extractor(SCHEMA)


def test_spec_without_partitions() -> None:
    s = PartitionSpec()
    assert s.values(row()) == ()
    assert s.extractor(SCHEMA)(row()) == ()
    assert s.path(()) == ""


def test_spec_pickles() -> None:
    s = spec(tz=NEW_YORK)
    copy = pickle.loads(pickle.dumps(s))
    assert copy == s
    assert copy.values(row()) == s.values(row())
