"""Partition directories of files mode: Hive-style `key=value` paths from row data.

A path has one `name=value` segment per partition column (in the order of `partitionBy`), then one
per segment of the time pattern, whose values are formatted from a timestamp column of the row in
a fixed time zone, never from the wall clock. Names and values are escaped as Hive (and Spark's
file sink) escape them; a null or empty value is Hive's default partition.

Time patterns use the letters of Java's `DateTimeFormatter`, as Spark users write them:

| Letters         | Meaning                                   | Example |
|-----------------|-------------------------------------------|---------|
| `yyyy`, `y`     | year, zero-padded to the count (not 2)    | `2026`  |
| `yy`            | last two digits of the year               | `26`    |
| `MM`, `M`       | month of year                             | `03`    |
| `dd`, `d`       | day of month                              | `08`    |
| `DDD`, `DD`, `D`| day of year, zero-padded to the count     | `067`   |
| `HH`, `H`       | hour of day, 0-23                         | `05`    |
| `mm`, `m`       | minute of hour                            | `07`    |
| `ss`, `s`       | second of minute                          | `09`    |
| `'text'`        | literal text (`''` is one quote)          |         |

Other characters are literal; every other letter is refused, as are `[ ] { } #`, which Java
reserves. A `timestamp` column is formatted as its instant shown in the partition's zone
(`timePartitionTimeZone`, UTC by default), never in the Python worker's: PySpark's row writer's
naive local times are read back into instants first (`serde/timestamps.py`, which refuses the
hour the worker's zone repeats); a `timestamp_ntz` is its own wall clock, not shifted. In a
partition zone with daylight saving time, on the day it ends two instants an hour apart share
an hour directory (`hour=01` twice); on the day it starts, one hour has no directory.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import date, datetime
from decimal import Decimal
from operator import attrgetter
from typing import Any
from zoneinfo import ZoneInfo

from pyspark.sql.types import (
    BooleanType,
    ByteType,
    CharType,
    DataType,
    DateType,
    DecimalType,
    IntegerType,
    LongType,
    ShortType,
    StringType,
    StructType,
    VarcharType,
)

from kafka_txn_sink.errors import ConfigError, InputError
from kafka_txn_sink.files_options import TIME_PARTITION_PATTERN
from kafka_txn_sink.serde.timestamps import instant_converter

HIVE_DEFAULT_PARTITION = "__HIVE_DEFAULT_PARTITION__"
"""The directory value of a null or empty partition value (Hive's and Spark's default)."""


# Hive's FileUtils.charToEscape (0x00-0x1F, then its list); Spark's copy leaves out 0x00.
_HIVE_ESCAPED = frozenset(chr(c) for c in range(0x20)) | frozenset("\"#%'*/:=?\\\x7f{[]^")
_ESCAPES = {c: f"%{ord(c):02X}" for c in _HIVE_ESCAPED}
_JAVA_RESERVED = frozenset("[]{}#")

PartitionValues = tuple[tuple[str, str | None], ...]
"""`(name, value)` per partition segment, in path order; None for a null or empty value."""


def hive_escape(value: str | None) -> str:
    """`value` as Hive's `FileUtils.escapePathName` writes it into a path: characters Hive
    escapes become `%XX` (upper-case hex); null and the empty string become the default
    partition name. Characters beyond ASCII are kept as they are."""
    if not value:
        return HIVE_DEFAULT_PARTITION
    if not any(c in _HIVE_ESCAPED for c in value):
        return value
    return "".join(_ESCAPES.get(c, c) for c in value)


def hive_path(values: PartitionValues) -> str:
    """`name=value/...` with names and values escaped; the empty string for no segment."""
    return "/".join(f"{hive_escape(name)}={hive_escape(value)}" for name, value in values)


# --- time patterns -----------------------------------------------------------------------

Field = Callable[[datetime], str]


def _padded(get: Callable[[datetime], int], width: int) -> Field:
    return lambda ts: str(get(ts)).zfill(width)


def _year(ts: datetime) -> int:
    return ts.year


def _month(ts: datetime) -> int:
    return ts.month


def _day(ts: datetime) -> int:
    return ts.day


def _day_of_year(ts: datetime) -> int:
    return ts.timetuple().tm_yday


def _hour(ts: datetime) -> int:
    return ts.hour


def _minute(ts: datetime) -> int:
    return ts.minute


def _second(ts: datetime) -> int:
    return ts.second


# letter -> (getter, the counts allowed)
_FIELDS: dict[str, tuple[Callable[[datetime], int], range]] = {
    "y": (_year, range(1, 5)),
    "M": (_month, range(1, 3)),
    "d": (_day, range(1, 3)),
    "D": (_day_of_year, range(1, 4)),
    "H": (_hour, range(1, 3)),
    "m": (_minute, range(1, 3)),
    "s": (_second, range(1, 3)),
}


def _field_of(letter: str, count: int, pattern: str) -> Field:
    known = _FIELDS.get(letter)
    if known is None:
        raise ConfigError(
            f"option {TIME_PARTITION_PATTERN}: pattern letter {letter!r} in {pattern!r} is not "
            "supported; use y, M, d, D, H, m, s, and quote literal letters ('T')"
        )
    get, counts = known
    if count not in counts:
        raise ConfigError(
            f"option {TIME_PARTITION_PATTERN}: {letter * count!r} in {pattern!r} is not supported; "
            f"use {' or '.join(letter * n for n in reversed(counts))}"
        )
    if letter == "y" and count == 2:
        return lambda ts: str(ts.year % 100).zfill(2)
    return _padded(get, count)


def _literal(text: str) -> Field:
    return lambda ts: text


# The datetime attributes each letter reads (day of year from the date).
_ATTRIBUTES = {
    "y": ("year",),
    "M": ("month",),
    "d": ("day",),
    "D": ("year", "month", "day"),
    "H": ("hour",),
    "m": ("minute",),
    "s": ("second",),
}
_CACHE_SIZE = 4096


@dataclass(frozen=True)
class TimeSegment:
    """One directory of a time pattern: its name and how its value is formatted."""

    name: str
    pattern: str
    parts: tuple[Field, ...] = field(compare=False, repr=False)
    letters: frozenset[str] = field(default=frozenset(), compare=False, repr=False)

    def format(self, ts: datetime) -> str:
        """This directory's value for `ts` (already in the partition's time zone)."""
        return "".join(part(ts) for part in self.parts)


@dataclass(frozen=True)
class TimePattern:
    """Directory segments formatted from a timestamp, e.g. `date=yyyy-MM-dd/hour=HH`."""

    text: str
    segments: tuple[TimeSegment, ...] = field(compare=False, repr=False)
    # Rows of a batch share few hours: values are cached by the fields the pattern reads.
    _key: Callable[[datetime], Any] = field(compare=False, repr=False, init=False)
    _cache: dict[Any, tuple[tuple[str, str], ...]] = field(
        default_factory=dict, compare=False, repr=False, init=False
    )

    def __post_init__(self) -> None:
        letters = set().union(*(s.letters for s in self.segments))
        attributes = sorted({a for letter in letters for a in _ATTRIBUTES[letter]}) or ["year"]
        object.__setattr__(self, "_key", attrgetter(*attributes))

    @classmethod
    def parse(cls, text: str) -> TimePattern:
        """Raises ConfigError (naming the option) for an invalid pattern."""
        segments = tuple(_segment(s, text) for s in _split_segments(text))
        names = [s.name for s in segments]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise ConfigError(
                f"option {TIME_PARTITION_PATTERN}: {text!r} names {', '.join(duplicates)} twice"
            )
        return cls(text, segments)

    @property
    def names(self) -> tuple[str, ...]:
        """The directory names, in order (`date`, `hour`)."""
        return tuple(s.name for s in self.segments)

    def format(self, ts: datetime, tz: ZoneInfo) -> list[tuple[str, str]]:
        """`(name, value)` per segment. An aware `ts` is shown in `tz`; a naive one is taken as
        a wall-clock time already in `tz` (a timestamp_ntz)."""
        local = ts.astimezone(tz) if ts.tzinfo is not None else ts
        return list(self.values(local))

    def values(self, local: datetime) -> tuple[tuple[str, str], ...]:
        """`(name, value)` per segment of a timestamp already in the partition's time zone."""
        key = self._key(local)
        found = self._cache.get(key)
        if found is None:
            if len(self._cache) >= _CACHE_SIZE:
                self._cache.clear()
            found = tuple((s.name, s.format(local)) for s in self.segments)
            self._cache[key] = found
        return found

    def __reduce__(self) -> tuple[Any, ...]:
        # The compiled parts are closures; ship the text and parse again where it lands.
        return (TimePattern.parse, (self.text,))


def _split_segments(text: str) -> list[str]:
    """`text` split at the `/` that are outside quotes."""
    if not text.strip():
        raise ConfigError(f"option {TIME_PARTITION_PATTERN} is empty; e.g. date=yyyy-MM-dd/hour=HH")
    segments: list[str] = []
    current: list[str] = []
    quoted = False
    for c in text:
        if c == "'":
            quoted = not quoted
        if c == "/" and not quoted:
            segments.append("".join(current))
            current = []
        else:
            current.append(c)
    segments.append("".join(current))
    return segments


def _segment(segment: str, text: str) -> TimeSegment:
    name, eq, pattern = segment.partition("=")
    if not eq or not name.strip() or not pattern or "'" in name:
        raise ConfigError(
            f"option {TIME_PARTITION_PATTERN}: segment {segment!r} of {text!r} is not name=pattern "
            "(e.g. date=yyyy-MM-dd/hour=HH)"
        )
    tokens = _tokens(pattern, text)
    parts = tuple(
        _literal(token) if isinstance(token, str) else _field_of(*token, text) for token in tokens
    )
    letters = frozenset(token[0] for token in tokens if not isinstance(token, str))
    return TimeSegment(name, pattern, parts, letters)


Token = str | tuple[str, int]  # literal text, or (letter, count)


def _tokens(pattern: str, text: str) -> list[Token]:
    tokens: list[Token] = []
    literal: list[str] = []
    i = 0
    while i < len(pattern):
        c = pattern[i]
        if c == "'":
            end = _quote_end(pattern, i, text)
            quoted = pattern[i + 1 : end]
            literal.append("'" if end == i + 1 else quoted.replace("''", "'"))
            i = end + 1
        elif c.isascii() and c.isalpha():
            count = _run_length(pattern, i)
            if literal:
                tokens.append("".join(literal))
                literal = []
            tokens.append((c, count))
            i += count
        elif c in _JAVA_RESERVED:
            raise ConfigError(
                f"option {TIME_PARTITION_PATTERN}: {c!r} in {text!r} is reserved by Java's "
                f"DateTimeFormatter; quote it ('{c}') to use it literally"
            )
        else:
            literal.append(c)
            i += 1
    if literal:
        tokens.append("".join(literal))
    return tokens


def _quote_end(pattern: str, start: int, text: str) -> int:
    """Index of the quote closing the one at `start`; `''` inside stands for one quote."""
    i = start + 1
    while i < len(pattern):
        if pattern[i] == "'":
            if i + 1 < len(pattern) and pattern[i + 1] == "'" and i != start + 1:
                i += 2
                continue
            return i
        i += 1
    raise ConfigError(f"option {TIME_PARTITION_PATTERN}: unterminated quote in {text!r}")


def _run_length(pattern: str, start: int) -> int:
    end = start
    while end < len(pattern) and pattern[end] == pattern[start]:
        end += 1
    return end - start


# --- partition specs ---------------------------------------------------------------------

_TEXT_TYPES = (StringType, CharType, VarcharType)
_INTEGRAL_TYPES = (ByteType, ShortType, IntegerType, LongType)
PARTITION_TYPES = "string, char, varchar, tinyint, smallint, int, bigint, boolean, date, decimal"


def partition_text(value: Any) -> str | None:
    """A partition column's value as Spark writes it into a path (unescaped); None for null or
    the empty string, which Spark also reads back as null."""
    if value is None or value == "":
        return None
    if isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, Decimal):
        return format(value, "f")
    if isinstance(value, date) and not isinstance(value, datetime):
        return value.isoformat()
    raise InputError(
        f"a partition value of type {type(value).__name__} cannot name a directory; "
        f"partition columns must be {PARTITION_TYPES}"
    )


def supports_partition_type(data_type: DataType) -> bool:
    """True when a column of `data_type` can name a directory (one of `PARTITION_TYPES`)."""
    return isinstance(
        data_type, (*_TEXT_TYPES, *_INTEGRAL_TYPES, BooleanType, DateType, DecimalType)
    )


@dataclass(frozen=True)
class PartitionSpec:
    """How a row picks its directory: columns first, then the time pattern's segments.

    `time_ntz`: the time column is a timestamp_ntz, whose naive values are wall-clock times in
    `tz`; otherwise naive values are local times of the worker's zone, as PySpark's row writer
    hands timestamps over, read back into their instants (or refused where the zone repeats
    the hour: `timestamps.instant_converter`).
    """

    columns: tuple[str, ...] = ()
    time: TimePattern | None = None
    time_column: str | None = None
    tz: ZoneInfo = field(default_factory=lambda: ZoneInfo("UTC"))
    time_ntz: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "columns", tuple(self.columns))
        if (self.time is None) != (self.time_column is None):
            raise ConfigError(
                f"options {TIME_PARTITION_PATTERN} and timePartitionColumn go together: give both "
                "or neither"
            )
        names = [*self.columns, *(self.time.names if self.time else ())]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise ConfigError(
                f"partition name(s) {', '.join(duplicates)} appear twice in partitionBy and "
                f"{TIME_PARTITION_PATTERN}"
            )

    @property
    def names(self) -> tuple[str, ...]:
        """Every directory name, in path order: the columns, then the time pattern's."""
        return (*self.columns, *(self.time.names if self.time else ()))

    def values(self, row: Any) -> PartitionValues:
        """The partition values of a row (a pyspark Row, or a dict by column name).

        Raises:
            InputError: the time column is null, or a value cannot name a directory.
        """
        get = row.get if isinstance(row, dict) else row.__getitem__
        values = [(c, _column_text(c, get(c))) for c in self.columns]
        if self.time is not None and self.time_column is not None:
            values.extend(self._time_values(get(self.time_column), self._local_time()))
        return tuple(values)

    def extractor(self, schema: StructType) -> Callable[[Sequence[Any]], PartitionValues]:
        """`values` for rows of `schema` read by position: the per-row path of a task.

        Raises:
            ConfigError: a column is missing from `schema`.
        """
        names = schema.names
        columns = [
            (c, _index_of(names, c, "partitionBy"), _text_of(c, schema[c].dataType))
            for c in self.columns
        ]
        if self.time is None or self.time_column is None:
            return lambda row: tuple((c, text(row[i])) for c, i, text in columns)
        time_index = _index_of(names, self.time_column, "timePartitionColumn")
        time_values = self._time_values
        local_time = self._local_time()

        def by_columns_and_time(row: Sequence[Any]) -> PartitionValues:
            return (
                *((c, text(row[i])) for c, i, text in columns),
                *time_values(row[time_index], local_time),
            )

        return by_columns_and_time

    def values_of(self, columns: Sequence[Any], local_time: datetime | None) -> PartitionValues:
        """The partition values of rows holding `columns` (one value per partition column, in
        order) and, with a time pattern, the wall-clock time `local_time` (already in `tz`).

        Raises:
            InputError: a value cannot name a directory, or the time is missing.
        """
        values = [(c, _column_text(c, v)) for c, v in zip(self.columns, columns, strict=True)]
        if self.time is not None:
            if local_time is None:
                raise self._null_time()
            values.extend(self.time.values(local_time))
        return tuple(values)

    def path(self, values: PartitionValues) -> str:
        """The directory of these values, relative to the sink's root (`user=ann/date=...`)."""
        return hive_path(values)

    def _local_time(self) -> Callable[[datetime], datetime]:
        """A timestamp's time in `tz`: its instant there (PySpark's row writer's naive local
        times are read back into instants first, `timestamps.instant_converter`)."""
        instant = instant_converter(from_row_writer=True)
        if self.tz.key == "UTC":
            return instant  # its instants are in UTC already
        tz = self.tz
        return lambda ts: instant(ts).astimezone(tz)

    def _time_values(
        self, ts: Any, local_time: Callable[[datetime], datetime]
    ) -> tuple[tuple[str, str | None], ...]:
        time = self.time
        assert time is not None
        if ts is None:
            raise self._null_time()
        if not isinstance(ts, datetime):
            raise InputError(
                f"column {self.time_column} holds a {type(ts).__name__}, not a timestamp; "
                "timePartitionColumn must be a timestamp or timestamp_ntz column"
            )
        local = ts if self.time_ntz and ts.tzinfo is None else local_time(ts)
        return time.values(local)

    def _null_time(self) -> InputError:
        text = self.time.text if self.time is not None else ""
        return InputError(
            f"column {self.time_column} is null; it names the time partition ({text}) of every row"
        )


def _text_of(column: str, data_type: DataType) -> Callable[[Any], str | None]:
    """`partition_text` of one column, with a fast path for the common types."""
    if isinstance(data_type, _TEXT_TYPES):
        return lambda value: value or None
    if isinstance(data_type, _INTEGRAL_TYPES):
        return lambda value: None if value is None else str(value)
    return lambda value: _column_text(column, value)


def _column_text(column: str, value: Any) -> str | None:
    try:
        return partition_text(value)
    except InputError as exc:
        raise InputError(f"partition column {column}: {exc}") from None


def _index_of(names: list[str], column: str, option: str) -> int:
    try:
        return names.index(column)
    except ValueError:
        raise ConfigError(
            f"option {option} names column {column!r}, which the input does not have "
            f"(columns: {', '.join(names)})"
        ) from None


def time_zone(name: str, option: str = "timePartitionTimeZone") -> ZoneInfo:
    """The IANA time zone `name` (e.g. `UTC`, `Europe/Paris`); ConfigError naming `option`."""
    try:
        return ZoneInfo(name)
    except (ValueError, OSError, KeyError) as exc:  # ZoneInfoNotFoundError is a KeyError
        raise ConfigError(
            f"option {option}: unknown time zone {name!r}; use an IANA name such as UTC or "
            "Europe/Paris"
        ) from exc
