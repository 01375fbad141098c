"""`spark.speculation=true` with the sink found by its short name, without `register(spark)`,
on a real broker and real Spark: speculative copies of a task would share its transactional id
and fence each other, so every task refuses to start before it touches Kafka, and the query or
write fails with an error naming the setting.

The setting is the application's (a SparkContext setting, fixed at start), given as spark-submit
gives it: `--conf` in PYSPARK_SUBMIT_ARGS of the job's process.
"""

from __future__ import annotations

import pytest

from kafka_txn_sink.kafka.txn_admin import TxnAdmin
from kafka_txn_sink.protocol.txn_ids import owns
from kafka_txn_sink.testing.topics import read_topic
from tests.e2e.conftest import on_the_newest_line_in_full
from tests.e2e.harness import Outcome, Pipeline, produce_ids
from tests.e2e.test_batch_writes import run_write

pytestmark = [pytest.mark.kafka, pytest.mark.spark]

SPECULATION = {"PYSPARK_SUBMIT_ARGS": "--conf spark.speculation=true pyspark-shell"}


def sink_ids(bootstrap: str, sink_id: str) -> list[str]:
    """Every transactional id of the sink the brokers know, in any state."""
    with TxnAdmin(bootstrap, {}) as txn_admin:
        return [i for i in txn_admin.list_ids() if owns(sink_id, i)]


def assert_refused_before_kafka(pipeline: Pipeline, outcome: Outcome) -> None:
    assert outcome.returncode == 3, outcome.error
    assert "spark.speculation=true is not supported" in outcome.error
    assert "set spark.speculation=false" in outcome.error
    assert pipeline.reached_batches("task.after_init") == [], "a task opened a transaction"
    assert read_topic(pipeline.bootstrap, pipeline.output, "read_uncommitted") == []
    assert sink_ids(pipeline.bootstrap, pipeline.sink_id) == []


# CI: the batch write's refusal (the same task check), tests/unit/test_speculation.py
@pytest.mark.full
@on_the_newest_line_in_full
def test_a_streaming_query_found_by_its_short_name_refuses_speculation(
    pipeline: Pipeline, monkeypatch: pytest.MonkeyPatch
) -> None:
    produce_ids(pipeline.bootstrap, pipeline.input, 50)
    for name, value in SPECULATION.items():
        monkeypatch.setenv(name, value)

    outcome = pipeline.run("task.after_init=signal")

    assert_refused_before_kafka(pipeline, outcome)


def test_a_batch_write_found_by_its_short_name_refuses_speculation(pipeline: Pipeline) -> None:
    outcome = run_write(pipeline, "speculative", "task.after_init=signal", env=SPECULATION)

    assert_refused_before_kafka(pipeline, outcome)
