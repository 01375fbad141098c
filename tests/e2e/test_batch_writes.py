"""Atomic batch writes, `df.write.format("kafka_txn")...save()`, on a real broker and real Spark:
a read_committed consumer sees every row of the DataFrame exactly once or none of it, whatever
fails and however often the job is run again with the same writeId.

Each job is tests/e2e/batch_job.py in a process group of its own (600 generated rows, 4 Spark
partitions), so a test can hold its driver at a failpoint and SIGKILL the whole job. The sink
is the `pipeline` fixture's (topics, sinkId, commit log), so the helpers of the streaming tests
check the outcome.
"""

from __future__ import annotations

import os
import subprocess
import uuid
from pathlib import Path

import pytest

from kafka_txn_sink import failpoints
from kafka_txn_sink.protocol.messages import Decision
from kafka_txn_sink.testing.topics import read_topic
from tests.e2e.harness import (
    PAST_TIMEOUT,
    ROOT,
    Outcome,
    Pipeline,
    assert_exactly_once,
    committed_report,
    create_small_topic,
    create_topics,
    finish,
    kill_group,
    open_transactions,
    produce_ids,
    wait_until_aborted,
)
from tests.e2e.test_files_mode import assert_files_exactly_once

pytestmark = [pytest.mark.kafka, pytest.mark.spark]

BATCH_JOB = Path(__file__).with_name("batch_job.py")
ROWS = 600
IDS = [f"row-{n:06d}" for n in range(ROWS)]
WRITTEN_BEFORE = "was committed before (batch 0, "


def start_write(
    pipeline: Pipeline,
    write_id: str,
    failpoint_spec: str = "",
    master: str = "local[2]",
    env: dict[str, str] | None = None,
    partitions: int = 4,
) -> subprocess.Popen[str]:
    """Start the batch job writing ROWS rows in `partitions` Spark partitions to `pipeline`'s
    sink with option writeId."""
    args = [
        pipeline.python,
        str(BATCH_JOB),
        "--bootstrap",
        pipeline.bootstrap,
        "--topic",
        pipeline.output,
        "--sink-id",
        pipeline.sink_id,
        "--commit-log",
        str(pipeline.commit_log),
        "--write-id",
        write_id,
        "--rows",
        str(ROWS),
        "--partitions",
        str(partitions),
        "--master",
        master,
    ]
    for key, value in pipeline.options.items():
        args += ["--option", f"{key}={value}"]
    for expression in pipeline.select:
        args += ["--select", expression]
    environment = {
        **os.environ,
        "PYSPARK_PYTHON": pipeline.python,
        "PYSPARK_DRIVER_PYTHON": pipeline.python,
        "SPARK_LOCAL_IP": "127.0.0.1",
        **failpoints.environment(failpoint_spec, pipeline.signals, max_s=300),
        **(env or {}),
    }
    return subprocess.Popen(
        args,
        env=environment,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        cwd=ROOT,
    )


def run_write(
    pipeline: Pipeline,
    write_id: str,
    failpoint_spec: str = "",
    master: str = "local[2]",
    env: dict[str, str] | None = None,
    partitions: int = 4,
) -> Outcome:
    """Run the batch job to its end (see `start_write`)."""
    return finish(start_write(pipeline, write_id, failpoint_spec, master, env, partitions))


def kill_at(pipeline: Pipeline, write_id: str, failpoint: str) -> None:
    """Run the write until its driver blocks at `failpoint`, then SIGKILL the whole job."""
    process = start_write(pipeline, write_id, f"{failpoint}=block")
    pipeline.wait_reached(failpoint, process)
    kill_group(process)


def the_decision(pipeline: Pipeline) -> Decision:
    """The log's only decision, checked to be the write's."""
    log = pipeline.open_log()
    assert log.decided_batches() == [0]
    decision = log.decision(0)
    assert decision is not None
    return decision


def decided_query_ids(pipeline: Pipeline) -> list[str]:
    """The query ids of the log's decisions, in batch order."""
    log = pipeline.open_log()
    decisions = (log.decision(batch_id) for batch_id in log.decided_batches())
    return [decision.query_id for decision in decisions if decision is not None]


def with_files(pipeline: Pipeline) -> Pipeline:
    """`pipeline` writing Avro files (partitioned by user, of the JSON payloads) beside its
    records: one write, both outputs."""
    references = f"refs_{uuid.uuid4().hex[:8]}"
    create_topics(pipeline.bootstrap, 3, references)
    pipeline.select = ["key", "value", "key AS id", "user", "value AS payload"]
    pipeline.options.update(
        {
            "path": str(pipeline.workdir / "files"),
            "referencesTopic": references,
            "partitionBy": "user",
            "payloadColumn": "payload",
        }
    )
    return pipeline


# -- exactly once ----------------------------------------------------------------------------------


@pytest.mark.full  # CI: the batch write killed after its decision, rerun
@pytest.mark.parametrize("writer", ["arrow", "rows"])
def test_a_write_is_visible_exactly_once(pipeline: Pipeline, writer: str) -> None:
    arrow = "1" if writer == "arrow" else "0"

    outcome = run_write(pipeline, "nightly", env={"KTS_ARROW_WRITER": arrow})

    assert outcome.returncode == 0, outcome.error
    expected = "KafkaTxnBatchArrowWriter" if writer == "arrow" else "KafkaTxnBatchWriter"
    assert outcome.result["writer"] == expected
    assert_exactly_once(pipeline, IDS)
    decision = the_decision(pipeline)
    assert (decision.query_id, decision.rows) == ("write:nightly", ROWS)
    assert pipeline.open_log().completion(0) is not None


def test_files_mode_references_every_row_once(pipeline: Pipeline) -> None:
    pipeline.output = ""  # files mode alone
    with_files(pipeline)
    pipeline.select = ["key AS id", "user", "value AS payload"]

    outcome = run_write(pipeline, "files")

    assert outcome.returncode == 0, outcome.error
    named = assert_files_exactly_once(pipeline, IDS)
    directories = {Path(location).parent.name for location in named}
    assert directories == {"user=user0", "user=user1", "user=user2"}


@pytest.mark.full  # CI: the streaming query's task failing once (test_records_exactly_once)
def test_a_task_failing_once_is_retried_and_written_once(pipeline: Pipeline) -> None:
    outcome = run_write(pipeline, "retried", "task.after_flush=raise-once@0", master="local[2,4]")

    assert outcome.returncode == 0, outcome.error
    assert pipeline.reached_batches("task.after_flush").count(0) >= 1
    assert_exactly_once(pipeline, IDS)
    # The failed attempt prepared a transaction too; the retry fenced it.
    assert any(p.attempt == 1 for p in the_decision(pipeline).participants)


@pytest.mark.full
def test_a_rerun_after_a_success_writes_nothing_and_says_so(pipeline: Pipeline) -> None:
    first = run_write(pipeline, "monday")
    assert first.returncode == 0, first.error

    again = run_write(pipeline, "monday", "task.after_init=signal")

    assert again.returncode == 0, again.error
    assert f"write 'monday' of sink {pipeline.sink_id} {WRITTEN_BEFORE}" in again.stderr
    assert "nothing is written again" in again.stderr
    assert pipeline.reached_batches("task.after_init") == [], "a task opened a transaction"
    assert_exactly_once(pipeline, IDS)

    # The next write, with an id of its own, is the log's next batch: every row once more.
    tuesday = run_write(pipeline, "tuesday")

    assert tuesday.returncode == 0, tuesday.error
    assert WRITTEN_BEFORE not in tuesday.stderr
    report = committed_report(pipeline.bootstrap, pipeline.output, IDS + IDS)
    assert report.exact, report.summary()
    assert decided_query_ids(pipeline) == ["write:monday", "write:tuesday"]


# -- the driver killed, the job run again with the same writeId ------------------------------------


@pytest.mark.full  # CI: the kill after the decision below, the harder re-run
def test_killed_before_the_decision_the_rerun_writes_once(pipeline: Pipeline) -> None:
    with_files(pipeline)
    kill_at(pipeline, "redo", "driver.before_decision")
    assert pipeline.open_log().decided_batches() == []
    assert len(open_transactions(pipeline.bootstrap, pipeline.sink_id)) == 4  # prepared

    # In fewer partitions: two of the killed run's transactions are not fenced by a new task.
    outcome = run_write(pipeline, "redo", partitions=2)

    assert outcome.returncode == 0, outcome.error
    assert WRITTEN_BEFORE not in outcome.stderr
    assert_exactly_once(pipeline, IDS)
    assert_files_exactly_once(pipeline, IDS)
    assert the_decision(pipeline).query_id == "write:redo"


def test_killed_after_the_decision_the_rerun_completes_it(pipeline: Pipeline) -> None:
    with_files(pipeline)
    kill_at(pipeline, "complete", "driver.after_decision")
    log = pipeline.open_log()
    assert log.decided_batches() == [0] and log.completion(0) is None
    assert open_transactions(pipeline.bootstrap, pipeline.sink_id) != []  # decided, not committed

    outcome = run_write(pipeline, "complete")

    assert outcome.returncode == 0, outcome.error
    assert f"write 'complete' of sink {pipeline.sink_id} {WRITTEN_BEFORE}" in outcome.stderr
    assert_exactly_once(pipeline, IDS)
    assert_files_exactly_once(pipeline, IDS)
    assert log.completion(0) is not None


# The full tier (90 s of waiting for the brokers' timeout): the CI tier has the re-run's repair
# planned and refused on the real broker (tests/integration/test_batch_write_lost.py).
@pytest.mark.full
def test_killed_after_the_decision_past_the_timeout_the_rerun_repairs_it(
    pipeline: Pipeline,
) -> None:
    with_files(pipeline)
    pipeline.options.update(PAST_TIMEOUT)
    kill_at(pipeline, "late", "driver.after_decision")
    decision = the_decision(pipeline)
    txn_ids = [p.transactional_id for p in decision.participants]
    wait_until_aborted(
        pipeline.bootstrap, txn_ids, "the coordinators' timeout abort of the write's transactions"
    )

    outcome = run_write(pipeline, "late")

    assert outcome.returncode == 0, outcome.error
    assert "were aborted by the brokers: this run writes their rows again (repair 1)" in (
        outcome.stderr
    )
    assert_exactly_once(pipeline, IDS)
    assert_files_exactly_once(pipeline, IDS)  # the references republished, no file repaired
    log = pipeline.open_log()
    completion, repair = log.completion(0), log.repair(0, 1)
    assert completion is not None and repair is not None
    assert len(completion.lost) == len(repair.repaired) == len(decision.participants)
    assert repair.refused == ()
    assert open_transactions(pipeline.bootstrap, pipeline.sink_id) == []


# -- what fails, fails whole -----------------------------------------------------------------------


@pytest.mark.full  # CI: test_records_bad_input, a record above the topic's limit
def test_a_record_above_the_topics_limit_fails_the_write_and_publishes_nothing(
    pipeline: Pipeline,
) -> None:
    pipeline.output = f"small_{uuid.uuid4().hex[:8]}"
    create_small_topic(pipeline.bootstrap, pipeline.output, max_message_bytes=20_000)
    # Rows of 50 kB in the last two of the four tasks: the first two prepare, and must be
    # aborted with the rest.
    pipeline.select = ["key", "IF(n >= 300 AND n % 100 = 57, repeat('y', 50000), value) AS value"]

    outcome = run_write(pipeline, "too_big", "task.after_flush=signal")

    assert outcome.returncode != 0
    assert "max.message.bytes" in outcome.error, outcome.error
    assert pipeline.reached_batches("task.after_flush") != [], "no task prepared"
    assert read_topic(pipeline.bootstrap, pipeline.output, "read_committed") == []
    assert open_transactions(pipeline.bootstrap, pipeline.sink_id) == []
    assert pipeline.open_log().decided_batches() == []


# -- a sinkId is a streaming query's or batch writes', not both ------------------------------


@pytest.mark.full  # CI: the batch writes' unit tests of the log's owner
def test_a_streaming_query_on_a_sink_of_batch_writes_is_refused(pipeline: Pipeline) -> None:
    written = run_write(pipeline, "batch")
    assert written.returncode == 0, written.error
    produce_ids(pipeline.bootstrap, pipeline.input, 20)

    streaming = pipeline.run()

    assert streaming.returncode != 0
    assert "holds batch writes (df.write, option writeId" in streaming.error, streaming.error
    assert "use another sinkId and commitLog for the streaming query" in streaming.error
    assert_exactly_once(pipeline, IDS)


@pytest.mark.full
def test_a_batch_write_on_a_streaming_query_s_sink_is_refused(pipeline: Pipeline) -> None:
    streamed = produce_ids(pipeline.bootstrap, pipeline.input, 20)
    assert pipeline.run().returncode == 0

    outcome = run_write(pipeline, "batch", "task.after_init=signal")

    assert outcome.returncode != 0
    assert f"of sink {pipeline.sink_id} belongs to streaming query" in outcome.error
    assert "use another sinkId and commitLog for batch writes" in outcome.error, outcome.error
    assert pipeline.reached_batches("task.after_init") == [], "a task opened a transaction"
    assert_exactly_once(pipeline, streamed)
