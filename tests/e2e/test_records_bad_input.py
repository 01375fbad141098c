"""Bad input and operator mistakes through real Spark: each fails the query with an error that
names the option, column or location at fault, and publishes nothing.

Invalid options, wrong column types, oversized records, a deleted commit log or checkpoint, an S3
endpoint that ignores conditional writes. The queries run in one Spark session of this process
(real Spark, real broker, real S3 server), most failing within seconds of their start;
`task.after_init` and `task.after_flush` are set to `signal` in the Spark workers, so each test
can tell whether a task opened or prepared a transaction.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import boto3
import pytest
from confluent_kafka import Producer
from pyspark.sql import DataFrame, SparkSession

from kafka_txn_sink import failpoints
from kafka_txn_sink.testing import stop_spark
from kafka_txn_sink.testing.topics import read_topic
from tests.e2e.harness import (
    committed_report,
    create_small_topic,
    create_topics,
    open_transactions,
    produce_ids,
)
from tests.s3_proxy import HeaderDroppingProxy

pytestmark = [pytest.mark.kafka, pytest.mark.spark]

SIGNALLED = ("task.after_init", "task.after_flush")
QUERY_TIMEOUT_S = 180


# -- one Spark session for the module ---------------------------------------------------------


@pytest.fixture(scope="module")
def signals(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """Failpoint signals of the Spark workers; set before the session starts, which they inherit."""
    directory = tmp_path_factory.mktemp("signals")
    saved = {k: os.environ.get(k) for k in failpoints.VARIABLES}
    spec = ";".join(f"{name}=signal" for name in SIGNALLED)
    os.environ.update(failpoints.environment(spec, directory))
    yield directory
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


@pytest.fixture(scope="module")
def spark(spark_jars: list[str], signals: Path) -> Iterator[SparkSession]:
    session = (
        SparkSession.builder.master("local[2]")
        .appName("kafka_txn_bad_input")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.jars", ",".join(spark_jars))
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("OFF")
    yield session
    stop_spark(session)


@dataclass
class Sink:
    """Names of one sink under test, and the options that make a valid query of it."""

    bootstrap: str
    input: str
    output: str
    workdir: Path
    sink_id: str

    @property
    def commit_log(self) -> Path:
        return self.workdir / "log"

    @property
    def checkpoint(self) -> Path:
        return self.workdir / "checkpoint"

    def options(self, **changes: str | None) -> dict[str, str]:
        """Valid options with `changes` applied (None removes an option)."""
        options: dict[str, str | None] = {
            "kafka.bootstrap.servers": self.bootstrap,
            "topic": self.output,
            "sinkId": self.sink_id,
            "commitLog": str(self.commit_log),
            "checkpointLocation": str(self.checkpoint),
            **changes,
        }
        return {k: v for k, v in options.items() if v is not None}


@pytest.fixture(scope="module")
def shared_topics(kafka_bootstrap: str) -> tuple[str, str]:
    """An input with a few rows and an output that every failing-at-start query shares."""
    name = uuid.uuid4().hex[:10]
    topics = (f"bad_in_{name}", f"bad_out_{name}")
    create_topics(kafka_bootstrap, 3, *topics)
    produce_ids(kafka_bootstrap, topics[0], 30)
    return topics


def new_sink(bootstrap: str, workdir: Path, input_topic: str, output_topic: str) -> Sink:
    return Sink(bootstrap, input_topic, output_topic, workdir, f"bad_{uuid.uuid4().hex[:10]}")


def source(spark: SparkSession, sink: Sink) -> DataFrame:
    return (
        spark.readStream.format("kafka")
        .option("kafka.bootstrap.servers", sink.bootstrap)
        .option("subscribe", sink.input)
        .option("startingOffsets", "earliest")
        .load()
    )


def run_query(
    frame: DataFrame, options: Mapping[str, str], mode: str = "append"
) -> tuple[str | None, str]:
    """Run the query until the input is drained; (None, "") if it succeeded, else its error."""
    writer = frame.writeStream.format("kafka_txn").outputMode(mode).trigger(availableNow=True)
    for key, value in options.items():
        writer = writer.option(key, value)
    try:
        query = writer.start()
        finished = query.awaitTermination(QUERY_TIMEOUT_S)
    except Exception as exc:  # Spark's own checks raise at start(), the sink's at run time
        return type(exc).__name__, str(exc)
    if not finished:
        query.stop()
        raise AssertionError(f"the query did not end within {QUERY_TIMEOUT_S}s")
    return None, ""


def reached(signals: Path, name: str) -> list[int]:
    path = signals / f"{name}.reached"
    if not path.exists():
        return []
    return [json.loads(line)["batch"] for line in path.read_text().splitlines() if line]


def clear(signals: Path) -> None:
    for path in signals.glob("*.reached"):
        path.unlink()


def assert_error(error: tuple[str | None, str], *fragments: str) -> None:
    kind, text = error
    assert kind is not None, "the query succeeded"
    for fragment in fragments:
        assert fragment in text, f"{fragment!r} not in the query's error:\n{text[:3000]}"


# -- invalid or forbidden options ---------------------------------------------------------------

# (options changed, output mode, fragments the error must contain)
START_FAILURES: dict[str, tuple[dict[str, str | None], str, list[str]]] = {
    "missing sinkId": ({"sinkId": None}, "append", ["option sinkId must be", "got ''"]),
    "invalid sinkId": ({"sinkId": "bad-id!"}, "append", ["option sinkId must be", "'bad-id!'"]),
    "acks": ({"kafka.acks": "1"}, "append", ["option kafka.acks cannot be set", "acks=all"]),
    "transactional.id": (
        {"kafka.transactional.id": "x"},
        "append",
        ["option kafka.transactional.id cannot be set"],
    ),
    # Spark refuses it before the sink sees it (the sink's own check is a second line).
    "async progress": (
        {"asyncProgressTrackingEnabled": "true"},
        "append",
        ["kafka_txn does not support async progress tracking"],
    ),
    "timeout above the broker's": (
        {"transactionTimeoutMs": "900001"},
        "append",
        ["transactionTimeoutMs=900001", "transaction.max.timeout.ms=900000"],
    ),
    "absurd timeout": (
        {"transactionTimeoutMs": "999999999"},
        "append",
        ["transactionTimeoutMs", "999999999", "transaction.max.timeout.ms"],
    ),
    "missing topic": (
        {"topic": "no_such_topic_kts"},
        "append",
        ["topic 'no_such_topic_kts' (option topic) does not exist"],
    ),
    "unreachable sink broker": (
        {"kafka.bootstrap.servers": "127.0.0.1:1", "commitTimeoutMs": "2000"},
        "append",
        ["KafkaUnavailableError", "cannot reach Kafka at kafka.bootstrap.servers=127.0.0.1:1"],
    ),
    "complete mode": ({}, "complete", ["output mode complete is not supported", "append"]),
    # Spark refuses update mode itself: the Python data source offers no update-as-append.
    "update mode": ({}, "update", ["kafka_txn does not support Update mode"]),
}


@pytest.mark.parametrize("case", list(START_FAILURES))
def test_bad_option_fails_at_start_and_publishes_nothing(
    case: str,
    spark: SparkSession,
    signals: Path,
    shared_topics: tuple[str, str],
    kafka_bootstrap: str,
    tmp_path: Path,
) -> None:
    changes, mode, fragments = START_FAILURES[case]
    sink = new_sink(kafka_bootstrap, tmp_path, *shared_topics)
    frame = source(spark, sink)
    if mode == "append":
        frame = frame.selectExpr("key", "value")
    else:
        frame = frame.groupBy("key").count().selectExpr("key", "CAST(count AS STRING) AS value")
    clear(signals)

    error = run_query(frame, sink.options(**changes), mode)

    assert_error(error, *fragments)
    assert reached(signals, "task.after_init") == [], "a task opened a transaction"
    assert read_topic(kafka_bootstrap, sink.output, "read_uncommitted") == []


# -- bad columns and records -----------------------------------------------------------------------


def test_value_column_of_the_wrong_type_is_named(
    spark: SparkSession,
    signals: Path,
    shared_topics: tuple[str, str],
    kafka_bootstrap: str,
    tmp_path: Path,
) -> None:
    sink = new_sink(kafka_bootstrap, tmp_path, *shared_topics)
    frame = source(spark, sink).selectExpr("key", "CAST(1 AS INT) AS value")
    clear(signals)

    error = run_query(frame, sink.options())

    assert_error(error, "InputError", "column value must be string or binary, found int")
    assert reached(signals, "task.after_init") == [], "a task opened a transaction"
    assert read_topic(kafka_bootstrap, sink.output, "read_uncommitted") == []


def test_record_above_the_topics_size_limit_fails_the_batch_and_publishes_nothing(
    spark: SparkSession, signals: Path, kafka_bootstrap: str, tmp_path: Path
) -> None:
    name = uuid.uuid4().hex[:10]
    sink = new_sink(kafka_bootstrap, tmp_path, f"big_in_{name}", f"big_out_{name}")
    create_topics(kafka_bootstrap, 3, sink.input)
    create_small_topic(kafka_bootstrap, sink.output, max_message_bytes=20_000)
    # Small rows around a few of 50 kB: the small ones may reach the log, inside the aborted
    # transaction; none may become visible.
    rows = [(f"small-{i}", b"x" * 100) for i in range(60)]
    rows[10:10] = [(f"big-{i}", b"y" * 50_000) for i in range(3)]
    produce_rows(kafka_bootstrap, sink.input, rows)
    frame = source(spark, sink).selectExpr("key", "value")
    clear(signals)

    error = run_query(frame, sink.options())

    assert_error(error, "InputError", "larger than the broker accepts", "max.message.bytes")
    # Tasks without a large record prepare; the driver's abort() must undo them.
    opened, prepared = reached(signals, "task.after_init"), reached(signals, "task.after_flush")
    assert set(opened) == {0} and len(prepared) < len(opened), (opened, prepared)
    assert read_topic(kafka_bootstrap, sink.output, "read_committed") == []
    assert open_transactions(kafka_bootstrap, sink.sink_id) == []


def produce_rows(bootstrap: str, topic: str, rows: list[tuple[str, bytes]]) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 5})
    for key, value in rows:
        producer.produce(topic, key=key, value=value)
    assert producer.flush(60) == 0, "input was not fully produced"


# -- a commit log or a checkpoint that went missing ---------------------------------------


def test_empty_commit_log_for_ids_the_broker_knows_is_refused(
    spark: SparkSession, signals: Path, kafka_bootstrap: str, tmp_path: Path
) -> None:
    name = uuid.uuid4().hex[:10]
    sink = new_sink(kafka_bootstrap, tmp_path, f"gone_in_{name}", f"gone_out_{name}")
    create_topics(kafka_bootstrap, 3, sink.input, sink.output)
    ids = produce_ids(kafka_bootstrap, sink.input, 30)
    assert run_query(source(spark, sink).selectExpr("key", "value"), sink.options()) == (None, "")
    assert committed_report(kafka_bootstrap, sink.output, ids).exact
    shutil.rmtree(sink.commit_log)
    shutil.rmtree(sink.checkpoint)
    clear(signals)

    error = run_query(source(spark, sink).selectExpr("key", "value"), sink.options())

    assert_error(
        error,
        f"commit log {sink.commit_log} is empty, but the brokers already know",
        f"transactional ids of sink {sink.sink_id}",
    )
    assert reached(signals, "task.after_init") == [], "a task opened a transaction"
    assert not (sink.commit_log / "_sink.json").exists()
    assert committed_report(kafka_bootstrap, sink.output, ids).exact
    assert len(read_topic(kafka_bootstrap, sink.output, "read_uncommitted")) == len(ids)


def test_deleted_checkpoint_is_refused_and_publishes_nothing(
    spark: SparkSession, signals: Path, kafka_bootstrap: str, tmp_path: Path
) -> None:
    name = uuid.uuid4().hex[:10]
    sink = new_sink(kafka_bootstrap, tmp_path, f"ckpt_in_{name}", f"ckpt_out_{name}")
    create_topics(kafka_bootstrap, 3, sink.input, sink.output)
    ids = produce_ids(kafka_bootstrap, sink.input, 30)
    assert run_query(source(spark, sink).selectExpr("key", "value"), sink.options()) == (None, "")
    shutil.rmtree(sink.checkpoint)
    more = produce_ids(kafka_bootstrap, sink.input, 20)
    clear(signals)

    # A new checkpoint: a new query id, and batch ids from 0 again over all the input.
    error = run_query(source(spark, sink).selectExpr("key", "value"), sink.options())

    assert_error(error, "QueryIdMismatchError", "checkpoint was deleted or replaced")
    assert reached(signals, "task.after_init") == [], "a task opened a transaction"
    report = committed_report(kafka_bootstrap, sink.output, ids + more)
    assert sorted(report.missing) == sorted(more), report.summary()
    assert not report.duplicated and not report.unexpected, report.summary()
    assert len(read_topic(kafka_bootstrap, sink.output, "read_uncommitted")) == len(ids)
    assert open_transactions(kafka_bootstrap, sink.sink_id) == []


# -- an S3 endpoint that ignores conditional writes ---------------------------------------------


@pytest.mark.s3
def test_s3_endpoint_ignoring_if_none_match_is_refused_at_start(
    spark: SparkSession,
    signals: Path,
    shared_topics: tuple[str, str],
    kafka_bootstrap: str,
    s3_endpoint: str,
    tmp_path: Path,
) -> None:
    sink = new_sink(kafka_bootstrap, tmp_path, *shared_topics)
    bucket = f"sinks-{uuid.uuid4().hex[:12]}"
    s3 = boto3.client(
        "s3",
        endpoint_url=s3_endpoint,
        region_name="us-east-1",
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
    )
    s3.create_bucket(Bucket=bucket)
    clear(signals)

    with HeaderDroppingProxy(s3_endpoint, drop=("If-None-Match",)) as proxy:
        options = sink.options(
            commitLog=f"s3://{bucket}/sinks/{sink.sink_id}/_log",
            **{
                "s3.endpoint": proxy.endpoint,
                "s3.region": "us-east-1",
                "s3.accessKeyId": "testing",
                "s3.secretAccessKey": "testing",
            },
        )
        error = run_query(source(spark, sink).selectExpr("key", "value"), options)

    assert proxy.dropped > 0, "the proxy never saw a conditional write"
    assert_error(
        error, "CommitLogError", f"S3 endpoint {proxy.endpoint} does not honour If-None-Match"
    )
    assert reached(signals, "task.after_init") == [], "a task opened a transaction"
    assert s3.list_objects_v2(Bucket=bucket).get("KeyCount") == 0
    assert read_topic(kafka_bootstrap, sink.output, "read_uncommitted") == []


# -- register(spark) -----------------------------------------------------------------------------

# A Spark application of its own: speculation is a setting of the SparkContext, fixed at start.
REGISTER = """
import json
from pyspark.sql import SparkSession
import kafka_txn_sink

def attempt(speculation):
    spark = (
        SparkSession.builder.master("local[1]")
        .config("spark.ui.enabled", "false")
        .config("spark.speculation", speculation)
        .getOrCreate()
    )
    try:
        kafka_txn_sink.register(spark)
        return None
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"
    finally:
        spark.stop()

print(json.dumps({"on": attempt("true"), "off": attempt("false")}))
"""


def test_register_refuses_speculation() -> None:
    done = subprocess.run(
        [sys.executable, "-c", REGISTER], capture_output=True, text=True, timeout=180
    )

    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["on"] is not None and result["on"].startswith("ConfigError: ")
    assert "spark.speculation=true is not supported" in result["on"]
    assert "set spark.speculation=false" in result["on"]
    assert result["off"] is None
