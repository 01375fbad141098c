"""Files mode on a real broker and real Spark: partitioned Avro files, one reference per file,
each input row in exactly one referenced file, each file referenced once; the files read back
with fastavro and with Spark's own Avro reader equal the input, in Hive-style directories; and a
file of JSON payloads gets the merged schema of its payloads."""

from __future__ import annotations

import json
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import fastavro
import pytest
from chispa import assert_df_equality
from confluent_kafka import Producer
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from kafka_txn_sink.files.references import parse_reference
from kafka_txn_sink.protocol.messages import FileRef
from kafka_txn_sink.testing import stop_spark
from kafka_txn_sink.testing.topics import compare_ids, read_topic
from tests.e2e.conftest import on_the_newest_line_in_full
from tests.e2e.harness import (
    Pipeline,
    create_topics,
    kill_group,
    open_transactions,
    produce_events,
)

pytestmark = [pytest.mark.kafka, pytest.mark.spark]

VALUE = "CAST(value AS STRING)"
SELECT = [
    "CAST(key AS STRING) AS id",
    f"get_json_object({VALUE}, '$.user') AS user",
    f"to_timestamp(get_json_object({VALUE}, '$.ts')) AS ts",
    f"{VALUE} AS payload",
]


@pytest.fixture
def files_pipeline(pipeline: Pipeline) -> Pipeline:
    return as_files_pipeline(pipeline)


def as_files_pipeline(pipeline: Pipeline) -> Pipeline:
    """`pipeline` in files mode alone: partitioned by user, date and hour, with payloads."""
    references = f"refs_{uuid.uuid4().hex[:8]}"
    create_topics(pipeline.bootstrap, 3, references)
    pipeline.output = ""  # files mode alone
    pipeline.select = SELECT
    pipeline.options.update(
        {
            "path": str(pipeline.workdir / "files"),
            "referencesTopic": references,
            "partitionBy": "user",
            "timePartitionColumn": "ts",
            "timePartitionPattern": "date=yyyy-MM-dd/hour=HH",
            "payloadColumn": "payload",
            "avroCodec": "snappy",
        }
    )
    return pipeline


# -- helpers (also used by the other files-mode modules) ---------------------------------------


def reference_bodies(pipeline: Pipeline) -> list[dict[str, Any]]:
    """The reference messages a read_committed consumer of `referencesTopic` sees, as JSON."""
    topic = pipeline.options["referencesTopic"]
    return [json.loads(r.value or b"") for r in read_topic(pipeline.bootstrap, topic)]


def references(pipeline: Pipeline) -> list[FileRef]:
    topic = pipeline.options["referencesTopic"]
    return [parse_reference(r.value or b"") for r in read_topic(pipeline.bootstrap, topic)]


def read_avro(location: str) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The schema in a local Avro file's header, and its records."""
    with Path(location).open("rb") as avro:
        reader = fastavro.reader(avro)
        records = [dict(r) for r in reader if isinstance(r, dict)]
        return json.loads(reader.metadata["avro.schema"]), records


def referenced_ids(pipeline: Pipeline) -> tuple[list[str], Counter[str]]:
    """Ids in the files that read_committed references name, and how often each file is named."""
    refs = references(pipeline)
    named = Counter(ref.location for ref in refs)
    ids: list[str] = []
    for ref in refs:
        path = Path(ref.location)
        assert path.parent.relative_to(pipeline.workdir / "files").as_posix() == ref.partition_path
        _, records = read_avro(ref.location)
        assert len(records) == ref.records
        # Payload files hold the user; Spark-schema files leave the partition column out.
        users = {r.get("user", ref.partition_values["user"]) for r in records}
        assert users == {ref.partition_values["user"]}
        ids.extend(r["id"] for r in records)
    return ids, named


def logged_files(pipeline: Pipeline) -> list[str]:
    commit_log = pipeline.open_log()
    locations = []
    for batch in commit_log.decided_batches():
        decision = commit_log.decision(batch)
        assert decision is not None
        locations += [f.location for p in decision.participants for f in p.files]
    return sorted(locations)


def stored_files(pipeline: Pipeline) -> list[str]:
    """Every Avro file under the local `path`, referenced or not."""
    return sorted(str(p) for p in (pipeline.workdir / "files").rglob("*.avro"))


def assert_files_exactly_once(pipeline: Pipeline, ids: list[str]) -> Counter[str]:
    """Each input id in exactly one referenced file, each file referenced once, the commit log
    listing exactly the referenced files, and no transaction of the sink left open."""
    seen, named = referenced_ids(pipeline)
    report = compare_ids(ids, seen)
    assert report.exact, report.summary()
    assert set(named.values()) == {1}, "a file is referenced more than once"
    assert logged_files(pipeline) == sorted(named), "the log lists the referenced files"
    assert open_transactions(pipeline.bootstrap, pipeline.sink_id) == []
    return named


# -- exactly once --------------------------------------------------------------------------------


@pytest.mark.full  # CI: test_files_mode_s3 writes partitioned files, each referenced once
@on_the_newest_line_in_full
def test_files_partitioned_and_referenced_exactly_once(files_pipeline: Pipeline) -> None:
    ids = produce_events(files_pipeline.bootstrap, files_pipeline.input, 900, users=4)

    outcome = files_pipeline.run()

    assert outcome.returncode == 0, outcome.error
    named = assert_files_exactly_once(files_pipeline, ids)
    assert outcome.result["sink_rows"] == len(ids)  # Spark's progress counts files mode's rows
    partitions = {
        Path(loc).parent.relative_to(files_pipeline.workdir / "files").as_posix() for loc in named
    }
    assert "user=user0/date=2026-11-21/hour=00" in partitions
    decided = files_pipeline.open_log().decision(0)
    assert decided is not None and all(p.files for p in decided.participants)


@pytest.mark.full  # CI: the crash suite kills files mode on S3 at driver and task points
@on_the_newest_line_in_full
def test_files_mode_killed_after_the_decision(files_pipeline: Pipeline) -> None:
    ids = produce_events(files_pipeline.bootstrap, files_pipeline.input, 900, users=4)

    process = files_pipeline.start("driver.after_decision=block@1")
    files_pipeline.wait_reached("driver.after_decision", process)
    kill_group(process)
    outcome = files_pipeline.run()

    assert outcome.returncode == 0, outcome.error
    assert files_pipeline.reached_batches("driver.after_decision") == [1]
    assert_files_exactly_once(files_pipeline, ids)


# -- round trip: fastavro and Spark's Avro reader give back the input ----------------------------

# Spark-schema mode: every type of the Spark -> Avro mapping a log pipeline meets.
ROUND_TRIP_SELECT = [
    "CAST(key AS STRING) AS id",
    f"get_json_object({VALUE}, '$.user') AS user",
    f"to_timestamp(get_json_object({VALUE}, '$.ts')) AS ts",
    f"CAST(get_json_object({VALUE}, '$.n') AS INT) AS n",
    f"get_json_object({VALUE}, '$.level') = 'warn' AS warn",
    f"CAST(get_json_object({VALUE}, '$.n') AS DECIMAL(12, 2)) / 8 AS amount",
    f"to_date(to_timestamp(get_json_object({VALUE}, '$.ts'))) AS day",
    f"from_json({VALUE}, 'extra STRUCT<tags: ARRAY<STRING>, score: DOUBLE>').extra AS extra",
    f"map('level', get_json_object({VALUE}, '$.level')) AS labels",
    "key AS raw",
]
# Values Hive escapes in a path, and a null user (Hive's default partition).
ROUND_TRIP_USERS = ["ann", "bob/smith", "x=y %", None]
ROUND_TRIP_DIRS = {
    f"user={user}/date=2026-11-21/hour={hour}"
    for user in ("ann", "bob%2Fsmith", "x%3Dy %25", "__HIVE_DEFAULT_PARTITION__")
    for hour in ("00", "01")
}


@pytest.fixture(scope="module")
def spark(spark_jars: list[str]) -> Iterator[SparkSession]:
    """A reader of the sink's output with Spark's own Avro and Kafka sources, times in UTC, and
    partition directories read as strings."""
    session = (
        SparkSession.builder.master("local[2]")
        .appName("kafka_txn_files_reader")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.sql.sources.partitionColumnTypeInference.enabled", "false")
        .config("spark.jars", ",".join(spark_jars))
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    yield session
    stop_spark(session)


def produce_round_trip_events(bootstrap: str, topic: str, count: int) -> list[str]:
    """Events over two hours and four users (independently), some with a nested `extra`."""
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, "acks": "all"})
    ids = [uuid.uuid4().hex for _ in range(count)]
    for n, event_id in enumerate(ids):
        event: dict[str, Any] = {
            "id": event_id,
            "ts": f"2026-11-21T{(n // 4) % 2:02d}:{n % 60:02d}:{n % 7:02d}.{n:06d}Z",
            "n": n,
            "level": "warn" if n % 3 == 0 else "info",
        }
        user = ROUND_TRIP_USERS[n % len(ROUND_TRIP_USERS)]
        if user is not None:
            event["user"] = user
        if n % 5 == 0:
            event["extra"] = {"tags": ["a", None] if n % 10 else [], "score": n / 3}
        producer.produce(topic, key=event_id, value=json.dumps(event))
    if producer.flush(60) != 0:
        raise AssertionError("input was not fully produced")
    return ids


def expected_frame(spark: SparkSession, pipeline: Pipeline) -> DataFrame:
    """The input as the query's select sees it, with the directories' date and hour (UTC)."""
    return (
        spark.read.format("kafka")
        .option("kafka.bootstrap.servers", pipeline.bootstrap)
        .option("subscribe", pipeline.input)
        .option("startingOffsets", "earliest")
        .option("endingOffsets", "latest")
        .load()
        .selectExpr(*ROUND_TRIP_SELECT)
        .withColumn("date", F.date_format("ts", "yyyy-MM-dd"))
        .withColumn("hour", F.date_format("ts", "HH"))
    )


def fastavro_frame(spark: SparkSession, refs: list[FileRef], expected: DataFrame) -> DataFrame:
    """Every record of the referenced files (fastavro) with its file's partition values."""
    rows = [
        {**record, **ref.partition_values} for ref in refs for record in read_avro(ref.location)[1]
    ]
    return spark.createDataFrame(rows, expected.schema)


def assert_same_rows(actual: DataFrame, expected: DataFrame) -> None:
    """Same columns, types and rows, in any order (ids are unique; chispa's own row-order
    option cannot sort map columns)."""
    by_id = [lambda df: df.select(*expected.columns).orderBy("id")]
    assert_df_equality(actual, expected, ignore_nullable=True, transforms=by_id)


@on_the_newest_line_in_full
def test_files_read_back_with_fastavro_and_spark_equal_the_input(
    files_pipeline: Pipeline, spark: SparkSession
) -> None:
    files_pipeline.select = ROUND_TRIP_SELECT
    del files_pipeline.options["payloadColumn"]
    produce_round_trip_events(files_pipeline.bootstrap, files_pipeline.input, 240)

    outcome = files_pipeline.run()

    assert outcome.returncode == 0, outcome.error
    root = files_pipeline.workdir / "files"
    refs = references(files_pipeline)
    assert {ref.partition_path for ref in refs} == ROUND_TRIP_DIRS
    for ref in refs:
        assert Path(ref.location).parent == root / ref.partition_path, ref.location
    expected = expected_frame(spark, files_pipeline)
    assert expected.count() == 240
    assert_same_rows(fastavro_frame(spark, refs, expected), expected)
    by_spark = spark.read.format("avro").option("basePath", str(root))
    assert_same_rows(by_spark.load([ref.location for ref in refs]), expected)


# -- schema aggregation: one file, payloads with different fields -------------------------------

TS = "2026-11-21T05:30:00Z"
MIXED: list[dict[str, Any]] = [
    {"user": "mixed", "ts": TS, "v": 1, "tags": []},
    {"user": "mixed", "ts": TS, "v": 2.5, "extra": {"a": 1}},
    {"user": "mixed", "ts": TS, "v": "high", "extra": {"b": ["x"]}, "bad-name": True},
    {"user": "mixed", "ts": TS, "tags": ["t"], "extra": None},
]
PLAIN: list[dict[str, Any]] = [
    {"user": "plain", "ts": TS, "w": 1},
    {"user": "plain", "ts": TS, "w": 2},
]


def nullable(avro_type: Any) -> dict[str, Any]:
    return {"type": ["null", avro_type], "default": None}


MERGED_SCHEMA = {
    "type": "record",
    "name": "Payload",
    "namespace": "kafka_txn_sink",
    "fields": [
        {"name": "id", "type": "string"},
        {"name": "user", "type": "string"},
        {"name": "ts", "type": "string"},
        # long then double widen to double; a string too gives a union; missing once: nullable.
        {"name": "v", "type": ["null", "double", "string"], "default": None},
        # [] takes the element type of ["t"].
        {"name": "tags", **nullable({"type": "array", "items": "string"})},
        {
            "name": "extra",
            **nullable(
                {
                    "type": "record",
                    "name": "Payload_extra",
                    "fields": [
                        {"name": "a", **nullable("long")},
                        {"name": "b", **nullable({"type": "array", "items": "string"})},
                    ],
                }
            ),
        },
        {"name": "bad_name", **nullable("boolean"), "originalName": "bad-name"},
    ],
}
MERGED_RECORDS: list[dict[str, Any]] = [
    {"v": 1.0, "tags": [], "extra": None, "bad_name": None},
    {"v": 2.5, "tags": None, "extra": {"a": 1, "b": None}, "bad_name": None},
    {"v": "high", "tags": None, "extra": {"a": None, "b": ["x"]}, "bad_name": True},
    {"v": None, "tags": ["t"], "extra": None, "bad_name": None},
]
PLAIN_SCHEMA = {
    "type": "record",
    "name": "Payload",
    "namespace": "kafka_txn_sink",
    "fields": [
        {"name": "id", "type": "string"},
        {"name": "user", "type": "string"},
        {"name": "ts", "type": "string"},
        {"name": "w", "type": "long"},
    ],
}


def produce_payloads(bootstrap: str, topic: str, payloads: list[dict[str, Any]]) -> list[str]:
    """Each payload with a new id, all into Kafka partition 0: one Spark task writes them all."""
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all"})
    ids = [uuid.uuid4().hex for _ in payloads]
    for event_id, payload in zip(ids, payloads, strict=True):
        body = json.dumps({"id": event_id, **payload})
        producer.produce(topic, key=event_id, value=body, partition=0)
    if producer.flush(60) != 0:
        raise AssertionError("input was not fully produced")
    return ids


@pytest.mark.full  # CI: tests/unit/test_files_writer.py merges the payloads' schemas
def test_a_file_gets_the_merged_schema_of_its_payloads(files_pipeline: Pipeline) -> None:
    files_pipeline.max_offsets = 10_000  # one batch
    files_pipeline.options["avroCodec"] = "Snappy"  # option values are case-insensitive
    ids = produce_payloads(files_pipeline.bootstrap, files_pipeline.input, MIXED + PLAIN)

    outcome = files_pipeline.run()

    assert outcome.returncode == 0, outcome.error
    bodies = {b["partition_path"]: b for b in reference_bodies(files_pipeline)}
    assert sorted(bodies) == [
        "user=mixed/date=2026-11-21/hour=05",
        "user=plain/date=2026-11-21/hour=05",
    ], "one file per directory"
    mixed = bodies["user=mixed/date=2026-11-21/hour=05"]
    header, records = read_avro(mixed["location"])
    assert header == mixed["schema"] == MERGED_SCHEMA
    with Path(mixed["location"]).open("rb") as avro:
        assert fastavro.reader(avro).codec == mixed["codec"] == "snappy"
    expected = [
        {"id": event_id, "user": "mixed", "ts": TS, **fields}
        for event_id, fields in zip(ids[: len(MIXED)], MERGED_RECORDS, strict=True)
    ]
    assert records == expected
    plain = bodies["user=plain/date=2026-11-21/hour=05"]
    header, records = read_avro(plain["location"])
    assert header == plain["schema"] == PLAIN_SCHEMA, "the schema is merged per file"
    assert [r["w"] for r in records] == [1, 2]
