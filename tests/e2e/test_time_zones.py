"""Timestamps with the query's processes in New York (TZ=America/New_York: the driver, Spark's
JVM and session zone, the Python workers), over both changes of 2025-26: the hour repeated on
2 November 2025 and the hour skipped on 8 March 2026 (issue 39, item 5).

Records mode writes Avro and JSON Schema values through the real registry (JSON Schema goes
row by row on the Arrow path too), files mode partitioned Avro files. On the newest Spark line
(the Arrow writer) every row is read back exact. On PySpark 4.0 (the
row writer) the query is refused at its start, naming what to set, because PySpark would hand
both instants of the repeated hour to the sink as one local time (the tasks' own refusal of
such a value, for executors whose zone the driver cannot see, is tested in
tests/unit/test_timestamps.py).
"""

from __future__ import annotations

from datetime import date, datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer

from kafka_txn_sink import testing
from tests.e2e.conftest import NEWEST, SPARK_LINES
from tests.e2e.harness import Outcome, Pipeline, create_topics
from tests.e2e.test_files_mode import read_avro, references
from tests.e2e.test_registry_formats import decoded_values

OLDEST = SPARK_LINES[0]

pytestmark = [pytest.mark.kafka, pytest.mark.spark]

NEW_YORK = "America/New_York"
UTC = timezone.utc
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
STEP = timedelta(seconds=7, microseconds=200123)  # 500 rows an hour, sub-second parts
# (first instant, rows): March first, so that its batches all come before the one holding the
# repeated hour, which starts three hours (1,500 rows) into November's.
CHANGES = (
    (datetime(2026, 3, 8, 5, tzinfo=UTC), 2000),
    (datetime(2025, 11, 2, 2, tzinfo=UTC), 3000),
)

MICROS = "CAST(CAST(value AS STRING) AS BIGINT)"
AT = f"timestamp_micros({MICROS})"
# New York's wall clock as a timestamp_ntz (standard time), in the skipped hour too.
NTZ = f"timestampadd(MICROSECOND, {MICROS} - 18000000000, TIMESTAMP_NTZ'1970-01-01 00:00:00')"
DAY = f"date_from_unix_date(CAST(floor({MICROS} / 86400000000) AS INT))"  # the UTC date


def instants() -> list[datetime]:
    return [start + n * STEP for start, count in CHANGES for n in range(count)]


def micros(instant: datetime) -> int:
    delta = instant - EPOCH
    return (delta.days * 86400 + delta.seconds) * 1_000_000 + delta.microseconds


def produce(pipeline: Pipeline, times: list[datetime]) -> None:
    """One record per instant: its number as the key, its microseconds as the value."""
    producer = Producer({"bootstrap.servers": pipeline.bootstrap, "linger.ms": 5, "acks": "all"})
    for n, instant in enumerate(times):
        producer.produce(pipeline.input, key=str(n), value=str(micros(instant)))
    assert producer.flush(60) == 0, "input was not fully produced"


def expected(instant: datetime) -> dict[str, Any]:
    wall = (instant - timedelta(hours=5)).replace(tzinfo=None)
    return {"at": instant, "ntz": wall, "day": instant.date()}


def in_new_york(monkeypatch: pytest.MonkeyPatch) -> None:
    """The query's processes in New York: the driver's environment, which Spark's JVM and
    its Python workers inherit in local mode (as spark.executorEnv.TZ gives executors)."""
    monkeypatch.setenv("TZ", NEW_YORK)


def check_outcome(pipeline: Pipeline, outcome: Outcome, written: dict[int, Any]) -> None:
    """Exact on the newest line; on 4.0, refused at the start, nothing written."""
    times = instants()
    exact = {n: expected(t) for n, t in enumerate(times)}
    assert written == {n: exact[n] for n in written}, "a row was written otherwise"
    if pipeline.spark_line == NEWEST:
        assert outcome.returncode == 0, outcome.error
        assert sorted(written) == list(range(len(times)))
        return
    assert outcome.returncode != 0, "PySpark 4.0 wrote the repeated hour"
    assert "(America/New_York) repeats an hour when its clocks go back" in outcome.error
    assert "spark.executorEnv.TZ=UTC" in outcome.error
    assert written == {}, "the query was not refused at its start"


def read_json(value: dict[str, Any]) -> dict[str, Any]:
    """A JSON Schema value as Avro's reader gives it: instants aware, the rest naive, dates."""
    return {
        "n": value["n"],
        "at": datetime.fromisoformat(value["at"]),
        "ntz": datetime.fromisoformat(value["ntz"]),
        "day": date.fromisoformat(value["day"]),
    }


@pytest.mark.registry
@pytest.mark.parametrize(
    ("pipeline", "fmt"),
    [
        # Full tier: JSON Schema takes the same row path on this line, Avro the Arrow path on the
        # newest.
        pytest.param(OLDEST, "avro", marks=pytest.mark.full),
        (OLDEST, "json-schema"),
        (NEWEST, "avro"),
        # Full tier: its timestamps take the Arrow path that Avro's case on this line takes.
        pytest.param(NEWEST, "json-schema", marks=pytest.mark.full),
    ],
    indirect=["pipeline"],
)
def test_values_through_the_registry_are_exact_in_new_york(
    pipeline: Pipeline,
    schema_registry: testing.SchemaRegistry,
    monkeypatch: pytest.MonkeyPatch,
    fmt: str,
) -> None:
    in_new_york(monkeypatch)
    pipeline.options.update({"valueFormat": fmt, "schema.registry.url": schema_registry.url})
    value = f"named_struct('n', CAST(key AS STRING), 'at', {AT}, 'ntz', {NTZ}, 'day', {DAY})"
    pipeline.select = ["key", f"{value} AS value"]
    produce(pipeline, instants())

    outcome = pipeline.run()

    values = decoded_values(pipeline, schema_registry, fmt)
    if fmt == "json-schema":
        values = [read_json(v) for v in values]
    written = {int(v.pop("n")): v for v in values}
    assert len(written) == len(values), "a row was written twice"
    check_outcome(pipeline, outcome, written)


# CI: 4.0; 4.3 in the full tier (its Arrow path's timestamps are the Avro values' case above).
@pytest.mark.parametrize(
    "pipeline", [OLDEST, pytest.param(NEWEST, marks=pytest.mark.full)], indirect=True
)
def test_files_are_exact_and_in_the_directory_of_their_instant_in_new_york(
    pipeline: Pipeline, monkeypatch: pytest.MonkeyPatch
) -> None:
    in_new_york(monkeypatch)
    refs_topic = f"refs_{pipeline.sink_id}"
    create_topics(pipeline.bootstrap, 3, refs_topic)
    pipeline.output = ""
    number = "CAST(CAST(key AS STRING) AS INT) AS n"
    pipeline.select = [number, f"{AT} AS at", f"{NTZ} AS ntz", f"{DAY} AS day"]
    pipeline.options.update(
        {
            "path": str(pipeline.workdir / "files"),
            "referencesTopic": refs_topic,
            "timePartitionColumn": "at",
            "timePartitionPattern": "date=yyyy-MM-dd/hour=HH",
        }
    )
    produce(pipeline, instants())

    outcome = pipeline.run()

    written: dict[int, Any] = {}
    for ref in references(pipeline):
        assert Path(ref.location).exists()
        _, records = read_avro(ref.location)
        for record in records:
            n = record.pop("n")
            assert n not in written, "a row was written twice"
            written[n] = record
            hour = record["at"].astimezone(UTC)
            assert ref.partition_path == f"date={hour:%Y-%m-%d}/hour={hour:%H}"
    check_outcome(pipeline, outcome, written)
    for record in written.values():
        assert isinstance(record["day"], date)
