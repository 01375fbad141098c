"""Spark's timestamps as PySpark hands them to the sink, made exact instants.

A Spark `timestamp` is an instant; a `timestamp_ntz` is a wall-clock time of no zone, written
as it is (Avro `local-timestamp-*`, ISO text without an offset). PySpark hands them over in
one of two ways:

- Arrow batches (the Arrow writers: streaming queries on PySpark 4.1+, batch writes): a
  `timestamp[us, tz=<session zone>]` array, whose int64 values are the instants in UTC, and a
  `timestamp[us]` one of wall-clock times for timestamp_ntz. Nothing is lost; the sink reads
  the integers or the aware datetimes pyarrow makes of them (never PySpark's row conversion).
- Rows (PySpark 4.0's streaming writer, or `KTS_ARROW_WRITER=0`): PySpark makes each instant a
  naive local time of the Python worker (`value.astimezone().replace(tzinfo=None)`, in
  `pyspark.sql.conversion`), which drops `fold`. Where the worker's zone repeats an hour (its
  clocks go back), that hour's two instants become one local time, and nothing the sink is
  handed tells them apart: read back, the second comes out one hour early.

`instant_converter` reads naive local times by the zone's own rules, as
`datetime.astimezone` does, from a per-day cache of the zone's UTC offsets (a day within three
days of an offset change is read value by value, by Python). With `from_row_writer`, a local
time the zone repeats (or skips, which no instant gives) is refused, naming what to set, instead
of written one hour off: exactness is impossible there. `repeating_zone_error` is that refusal for
the start of a query on the row writer, made on the driver: a zone that will meet such an hour
within a year.
"""

from __future__ import annotations

import itertools
import os
import time
from collections.abc import Callable
from datetime import date, datetime, timedelta, timezone
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

from kafka_txn_sink.errors import ConfigError, InputError

UTC = timezone.utc
Instant = Callable[[datetime], datetime]
"""Turns a PySpark timestamp value into an aware datetime of the same instant."""

SETTINGS = (
    "run the Python workers in UTC (spark.executorEnv.TZ=UTC, and TZ=UTC in the environment of "
    "a local-mode driver) or on PySpark 4.1 or later, whose Arrow writer hands instants over whole"
)
"""What to set where PySpark's row writer loses instants; every such error ends with it."""

_UTC_ZONES: tuple[Any, ...] = (UTC, ZoneInfo("UTC"))
# An aware datetime is made as EPOCH + (local - base), base the naive epoch plus the UTC offset:
# two C operations, where datetime.replace(tzinfo=...) costs ten times as much in CPython 3.11.
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_NAIVE_EPOCH = datetime(1970, 1, 1)
_UTC_NAMES = frozenset(
    {
        "",
        "UTC",
        "UTC0",
        "UCT",
        "Universal",
        "Zulu",
        "GMT",
        "GMT0",
        "GMT+0",
        "GMT-0",
        "Greenwich",
        "Etc/UTC",
        "Etc/UCT",
        "Etc/Universal",
        "Etc/Zulu",
        "Etc/GMT",
        "Etc/GMT0",
        "Etc/GMT+0",
        "Etc/GMT-0",
        "Etc/Greenwich",
    }
)
_EPOCH_DAY = date(1970, 1, 1).toordinal()
_DAY_S = 86400
# Offsets are probed at every UTC midnight; a day is read from the cache when the probes two
# days before to three after agree. No two changes of a zone in tzdata 2025 are within 95 hours
# (Africa/Freetown, 1939), so no pair hides between two probes; and a wall-clock day's instants
# lie within 16 hours of its UTC day.
_BEFORE, _AFTER = 2, 3
_UNSCANNED = object()


def instant_converter(*, from_row_writer: bool = False) -> Instant:
    """A function giving the instant of a PySpark timestamp value as an aware datetime: an
    aware value as it is (in UTC), a naive one read as a local time of this process's zone.

    With `from_row_writer`, a naive value is taken for what PySpark's row writer makes: a local
    time without its `fold`. One the zone repeats is refused unless its fold is 1, one it skips
    always; the function raises InputError saying what to set (`SETTINGS`).
    """
    if local_is_utc():
        return _utc_converter()
    local = _local_days()
    days = local.days
    slow = local.strict if from_row_writer else local.lenient

    def instant(value: datetime) -> datetime:
        zone = value.tzinfo
        if zone is not None:
            return value if zone in _UTC_ZONES else value.astimezone(UTC)
        base = days.get(value.toordinal(), _UNSCANNED)
        if base is _UNSCANNED:
            base = local.scan(value)
        if base is None:
            return slow(value)
        return _EPOCH + (value - base)

    return instant


def _utc_converter() -> Instant:
    def instant(value: datetime) -> datetime:
        zone = value.tzinfo
        if zone is None:
            return _EPOCH + (value - _NAIVE_EPOCH)
        return value if zone in _UTC_ZONES else value.astimezone(UTC)

    return instant


def wall_clock_as_utc(value: datetime) -> datetime:
    """A timestamp_ntz as the aware UTC datetime of the same wall clock: what an instant's
    field (Avro `timestamp-*`, protobuf `Timestamp`) holds of it, whatever the worker's zone."""
    return _EPOCH + (value - _NAIVE_EPOCH) if value.tzinfo is None else value


def repeating_zone_error(now: float | None = None) -> ConfigError | None:
    """The error of the start of a query fed by PySpark's row writer (PySpark 4.0) whose Python
    workers' zone repeats an hour within a year of `now` (default: the clock): the hour whose
    instants the writer hands over as the same local times. None where that cannot happen.
    This process's zone is taken for the workers' (the planner's environment has
    spark.executorEnv.* as theirs does)."""
    if local_is_utc():
        return None
    today = int(time.time() if now is None else now) // _DAY_S
    offsets = [_gmtoff(day * _DAY_S) for day in range(today - 366, today + 367)]
    if not any(later < earlier for earlier, later in itertools.pairwise(offsets)):
        return None
    return ConfigError(
        f"the Python workers' time zone ({local_zone_name()}) repeats an hour when its clocks "
        f"go back, and PySpark's row writer (PySpark 4.0) hands the sink that hour's two "
        f"instants as one local time; timestamps cannot be written exactly: {SETTINGS}"
    )


def local_zone_name() -> str:
    """This process's local time zone as TZ names it (`America/New_York`), else the zone
    file /etc/localtime links to, else its abbreviations."""
    name = _zone_key()
    return name if name not in ("", "localtime") else "/".join(sorted(set(time.tzname)))


def local_is_utc() -> bool:
    """Whether this process's local time is UTC at every instant (no offset, no history): a
    naive local time is then the UTC wall clock."""
    fixed = time.timezone == 0 and time.altzone == 0 and not time.daylight
    return fixed and _zone_key() in _UTC_NAMES


def _zone_key() -> str:
    """The name of the zone file TZ or /etc/localtime selects; "" for glibc's default (UTC),
    "localtime" for a zone file that is not a link."""
    tz = os.environ.get("TZ")
    if tz is not None:
        name = tz[1:] if tz.startswith(":") else tz
        return _zoneinfo_key(name) if name.startswith("/") else name
    localtime = Path("/etc/localtime")
    if not localtime.exists():
        return ""
    if localtime.is_symlink():
        return _zoneinfo_key(str(localtime.resolve()))
    utc = Path("/usr/share/zoneinfo/UTC")
    same = utc.exists() and utc.read_bytes() == localtime.read_bytes()
    return "UTC" if same else "localtime"


def _zoneinfo_key(path: str) -> str:
    _, found, key = path.partition("/zoneinfo/")
    return key.removeprefix("posix/") if found else path


def _gmtoff(seconds: int) -> int:
    return time.localtime(seconds).tm_gmtoff


class _LocalDays:
    """This zone's UTC offset per wall-clock day (ordinal), as the naive epoch plus the offset
    (the local time of the epoch), or None for a day near a change."""

    def __init__(self) -> None:
        self.days: dict[int, Any] = {}
        self._bases: dict[int, datetime] = {}

    def scan(self, value: datetime) -> datetime | None:
        """Fill the days of `value`'s year; `value`'s day's base."""
        first = date(value.year, 1, 1).toordinal()
        last = date(value.year, 12, 31).toordinal()
        try:
            probes = [
                _gmtoff((d - _EPOCH_DAY) * _DAY_S)
                for d in range(first - _BEFORE, last + _AFTER + 1)
            ]
        except (OverflowError, OSError, ValueError):  # beyond the C library's years
            self.days.update(dict.fromkeys(range(first, last + 1)))
            return None
        width = _BEFORE + _AFTER + 1
        for index, day in enumerate(range(first, last + 1)):
            window = probes[index : index + width]
            same = min(window) == max(window)
            self.days[day] = self._base(window[0]) if same else None
        found: datetime | None = self.days[value.toordinal()]
        return found

    def _base(self, offset: int) -> datetime:
        found = self._bases.get(offset)
        if found is None:
            found = self._bases[offset] = _NAIVE_EPOCH + timedelta(seconds=offset)
        return found

    @staticmethod
    def lenient(value: datetime) -> datetime:
        """Python's reading of a local time near a change (its fold chooses)."""
        return value.astimezone(UTC)

    @staticmethod
    def strict(value: datetime) -> datetime:
        """A local time near a change, refused where the zone repeats it (fold 0: the row
        writer's, which has lost which of two instants it was) or skips it.

        Raises:
            InputError: saying what to set.
        """
        first = value.replace(fold=0).astimezone(UTC)
        second = value.replace(fold=1).astimezone(UTC)
        if first == second:
            return first
        # Both folds of a skipped time are instants of other local times.
        skipped = first.astimezone().replace(tzinfo=None) != value.replace(fold=0)
        if value.fold and not skipped:
            return second
        what = "skips" if skipped else "repeats when its clocks go back"
        raise InputError(
            f"the timestamp {value.replace(fold=0)} is a local time that the Python worker's "
            f"time zone ({local_zone_name()}) {what}, and PySpark's row writer hands timestamps "
            f"to the sink as such local times: which instant it was is lost; {SETTINGS}"
        )


_CACHE: dict[tuple[Any, ...], _LocalDays] = {}


def _local_days() -> _LocalDays:
    """The day cache of this process's zone as it is now (tests change TZ and call tzset)."""
    key = (os.environ.get("TZ"), time.tzname, time.timezone, time.altzone)
    found = _CACHE.get(key)
    if found is None:
        found = _CACHE[key] = _LocalDays()
    return found
