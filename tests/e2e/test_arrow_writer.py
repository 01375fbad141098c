"""The Arrow write path (PySpark 4.1+, `DataSourceStreamArrowWriter`) where it differs from the
row writer: a record the topic refuses, per-row topics, partitions and headers, and files mode
killed mid-batch. (The happy path, a retried task and the driver kill points run on the Arrow
path too: test_records_exactly_once.py and test_files_mode.py run them on both Spark lines.)

The queries run on the newest Spark line (PySpark 4.3 of `.venv-spark-newest`, made by
ci/setup_spark_newest.sh, which ci/setup.sh runs); this test process stays on the test bed's 4.0.
Their source is a directory of JSON-lines files, one per batch, which sets the rows of each batch
exactly. Every test checks that the query
really took the Arrow path.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from confluent_kafka import Consumer, TopicPartition

from kafka_txn_sink.testing.topics import compare_ids, read_topic
from tests.e2e.conftest import NEWEST, SparkLine
from tests.e2e.harness import (
    Outcome,
    Pipeline,
    create_small_topic,
    create_topics,
    kill_group,
    make_events,
    open_transactions,
    write_input_files,
)
from tests.e2e.test_files_mode import as_files_pipeline, assert_files_exactly_once

pytestmark = [pytest.mark.kafka, pytest.mark.spark]

ARROW_WRITER = "KafkaTxnStreamArrowWriter"


@pytest.fixture
def arrow_pipeline(pipeline: Pipeline, spark_newest: SparkLine) -> Pipeline:
    pipeline.python, pipeline.spark_line = spark_newest.python, NEWEST
    pipeline.input_dir = pipeline.workdir / "input"
    pipeline.jars = ""  # a file source and a Python sink need no connector jars
    return pipeline


def assert_took_arrow(outcome: Outcome) -> None:
    assert outcome.returncode == 0, outcome.error
    assert str(outcome.result["spark"]).startswith(NEWEST), outcome.result
    assert outcome.result["writer"] == ARROW_WRITER, outcome.result


def write_ids(pipeline: Pipeline, count: int, files: int) -> list[str]:
    assert pipeline.input_dir is not None
    return write_input_files(pipeline.input_dir, make_events(count), files)


# -- records mode ---------------------------------------------------------------------------


# CI: test_records_bad_input, a record above the topic's limit
@pytest.mark.full
def test_record_the_topic_refuses_fails_the_batch_and_publishes_nothing(
    arrow_pipeline: Pipeline,
) -> None:
    small = f"small_{arrow_pipeline.output}"
    create_small_topic(arrow_pipeline.bootstrap, small, max_message_bytes=20_000)
    arrow_pipeline.output = small
    rows = [(f"small-{i}", "x" * 100) for i in range(60)]
    rows[10:10] = [(f"big-{i}", "y" * 50_000) for i in range(3)]
    assert arrow_pipeline.input_dir is not None
    write_input_files(arrow_pipeline.input_dir, rows, files=1)

    outcome = arrow_pipeline.run()

    assert outcome.returncode == 3, outcome.error
    for fragment in ("InputError", "larger than the broker accepts", "max.message.bytes"):
        assert fragment in outcome.error, outcome.error
    assert read_topic(arrow_pipeline.bootstrap, small, "read_committed") == []
    assert open_transactions(arrow_pipeline.bootstrap, arrow_pipeline.sink_id) == []


def test_topic_partition_and_headers_columns_route_each_record(arrow_pipeline: Pipeline) -> None:
    even, odd = f"even_{arrow_pipeline.output}", f"odd_{arrow_pipeline.output}"
    create_topics(arrow_pipeline.bootstrap, 3, even, odd)
    arrow_pipeline.output = ""  # no topic option: every row names its topic
    arrow_pipeline.select = [
        "key",
        "value",
        f"IF(ascii(key) % 2 = 0, '{even}', '{odd}') AS topic",
        "CAST(ascii(key) % 3 AS INT) AS partition",
        "array(named_struct('key', 'id', 'value', CAST(key AS BINARY))) AS headers",
    ]
    ids = write_ids(arrow_pipeline, 300, files=2)

    outcome = arrow_pipeline.run()

    assert_took_arrow(outcome)
    seen = list(committed_records(arrow_pipeline.bootstrap, even, odd))
    assert compare_ids(ids, [key for key, _, _, _ in seen]).exact
    for key, topic, partition, headers in seen:
        assert topic == (even if ord(key[0]) % 2 == 0 else odd), key
        assert partition == ord(key[0]) % 3, key
        assert headers == [("id", key.encode())], key


def committed_records(
    bootstrap: str, *topics: str
) -> Iterator[tuple[str, str, int, list[tuple[str, bytes]]]]:
    """(key, topic, partition, headers) of every record read_committed sees in `topics`."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": "arrow-test",
            "isolation.level": "read_committed",
            "enable.partition.eof": True,
            "enable.auto.commit": False,
        }
    )
    try:
        assigned = [TopicPartition(t, p, 0) for t in topics for p in range(3)]
        consumer.assign(assigned)
        remaining = {(tp.topic, tp.partition) for tp in assigned}
        for _ in range(600):  # bounded: 600 polls of at most 1 s
            if not remaining:
                return
            message = consumer.poll(1.0)
            if message is None:
                continue
            if message.error():
                remaining.discard((message.topic(), message.partition()))
                continue
            key = (message.key() or b"").decode()
            raw: list[Any] = list(message.headers() or [])
            headers = [(str(name), bytes(value or b"")) for name, value in raw]
            yield key, str(message.topic()), int(message.partition() or 0), headers
        raise AssertionError(f"topics not read to their end: {sorted(remaining)}")
    finally:
        consumer.close()


# -- files mode ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "payload",
    [
        pytest.param(True, marks=pytest.mark.full, id="payload"),
        pytest.param(False, id="spark_schema"),
    ],
)
@pytest.mark.full
def test_files_mode_killed_mid_batch_then_restarted(
    arrow_pipeline: Pipeline, payload: bool
) -> None:
    files_pipeline = as_files_pipeline(arrow_pipeline)
    if not payload:  # the id and payload columns in the Spark schema: encoded natively
        del files_pipeline.options["payloadColumn"]
    ids = write_ids(files_pipeline, 400, files=4)

    process = files_pipeline.start("task.after_produce=block@1")
    files_pipeline.wait_reached("task.after_produce", process)
    kill_group(process)
    restarted = files_pipeline.run()

    assert_took_arrow(restarted)
    assert files_pipeline.open_log().decided_batches() == [0, 1, 2, 3]
    assert_files_exactly_once(files_pipeline, ids)
