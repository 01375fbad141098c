"""Records mode on a real broker and real Spark: every input id is seen once by read_committed
consumers, whatever fails, and no transaction of the sink stays open afterwards. The happy path,
the retried task and the four kill points run on both Spark lines (4.0 rows, 4.3 Arrow batches),
reading Spark's Kafka source."""

from __future__ import annotations

import pytest
from kafka.partitioner.default import murmur2

from kafka_txn_sink import cli
from kafka_txn_sink.protocol.txn_ids import transactional_id
from kafka_txn_sink.testing.topics import read_topic
from tests.e2e.conftest import SPARK_LINES, on_the_newest_line_in_full
from tests.e2e.harness import (
    Pipeline,
    assert_exactly_once,
    committed_report,
    finish,
    kill_group,
    produce_ids,
)

pytestmark = [pytest.mark.kafka, pytest.mark.spark]

N = 1200  # three micro-batches of 400 over three Spark partitions


@pytest.mark.full  # CI: the crash suite and every kill test write several batches
@on_the_newest_line_in_full
def test_several_batches_over_several_partitions(pipeline: Pipeline) -> None:
    """Also: keys land where Spark's own sink puts them (the Java client's murmur2)."""
    ids = produce_ids(pipeline.bootstrap, pipeline.input, N)

    outcome = pipeline.run()

    assert outcome.returncode == 0, outcome.error
    if pipeline.spark_line != "4.0":  # Spark 4.1+ hands the sink Arrow batches
        assert outcome.result["writer"] == "KafkaTxnStreamArrowWriter", outcome.result
    batches = outcome.result["batches"]
    assert isinstance(batches, list) and len(batches) >= 3
    assert_exactly_once(pipeline, ids)
    commit_log = pipeline.open_log()
    assert commit_log.decided_batches() == batches
    first = commit_log.decision(0)
    assert first is not None
    assert {p.transactional_id for p in first.participants} == {
        transactional_id(pipeline.sink_id, p, slot=0) for p in range(3)
    }
    # One run from the first batch to the last: the planner's and the commit worker's steps,
    # each in a Python worker of its own, found the same driver without the process table
    # (protocol/runs.py: Spark's block manager directory, not the JVM's pid from /proc).
    owners = commit_log.owners()
    assert len(owners) == 1 and ":blockmgr-" in owners[0].driver, owners
    for record in read_topic(pipeline.bootstrap, pipeline.output):
        assert record.key is not None
        assert record.partition == (murmur2(record.key) & 0x7FFFFFFF) % 3, record.key


def test_each_batch_starts_once_on_the_driver(pipeline: Pipeline) -> None:
    """The commit worker's writer takes the planner's run from the tasks' messages
    (commit_worker.py): a batch runs the driver's start (owner, decisions, completions, the
    brokers' settings) in the planner only, not again before its commit."""
    ids = produce_ids(pipeline.bootstrap, pipeline.input, N)

    outcome = pipeline.run("driver.start=signal")

    assert outcome.returncode == 0, outcome.error
    batches = outcome.result["batches"]
    assert isinstance(batches, list) and len(batches) >= 3
    assert_exactly_once(pipeline, ids)
    assert pipeline.open_log().decided_batches() == batches
    starts = pipeline.reached_batches("driver.start")
    assert len(starts) == len(batches), f"{len(starts)} starts for batches {batches}"


@on_the_newest_line_in_full
def test_task_failing_after_part_of_its_rows_is_retried_once(
    pipeline: Pipeline, capsys: pytest.CaptureFixture[str]
) -> None:
    ids = produce_ids(pipeline.bootstrap, pipeline.input, N)

    outcome = pipeline.run("task.after_produce=raise-once")

    assert outcome.returncode == 0, outcome.error
    assert pipeline.reached_batches("task.after_produce") == [0]
    assert_exactly_once(pipeline, ids)
    # The failed attempt is counted by its kind (an injected error is no error of the sink's).
    args = ["metrics", "--log", str(pipeline.commit_log), "--bootstrap", pipeline.bootstrap]
    assert cli.main([*args, "--once", "--history", "100"]) == 0
    scrape = capsys.readouterr().out
    counted = f'kafka_txn_sink_task_errors_total{{kind="other",sink_id="{pipeline.sink_id}"}} 1.0'
    assert counted in scrape, scrape


# Each point is a moment of the driver's commit; the query's process group is killed there,
# then the query restarts from the same checkpoint.
KILL_POINTS = [
    "driver.before_decision",  # tasks prepared, no decision
    "driver.after_decision",  # decision written, no EndTxn sent
    "driver.after_first_endtxn",  # some EndTxns sent
    "driver.after_completion",  # all complete, Spark's commits/N not written
]


CI_KILLS: set[tuple[str, str]] = set()
"""The kill points CI runs here: none. CI kills drivers in the short crash suite (tests/chaos, at
random points), and after the decision with a Delta log, with the registry's formats, with dead
letters, MSK IAM, consumer groups (on the newest line), Spark Connect and the pipelines."""


def kill_matrix() -> list[object]:
    """Every kill point on both Spark lines; CI runs `CI_KILLS` (the full tier, ci/test_full.sh,
    runs all of them)."""
    return [
        pytest.param(line, point, id=f"{point}-{line}",
                     marks=() if (point, line) in CI_KILLS else (pytest.mark.full,))
        for point in KILL_POINTS
        for line in SPARK_LINES
    ]


@pytest.mark.parametrize(("pipeline", "point"), kill_matrix(), indirect=["pipeline"])
def test_query_killed_at_failpoint_then_restarted(pipeline: Pipeline, point: str) -> None:
    ids = produce_ids(pipeline.bootstrap, pipeline.input, N)

    process = pipeline.start(f"{point}=block@1")
    pipeline.wait_reached(point, process)
    kill_group(process)
    assert pipeline.reached_batches(point) == [1]

    outcome = pipeline.run()

    assert outcome.returncode == 0, outcome.error
    assert_exactly_once(pipeline, ids)


# CI: test_metrics_prometheus holds a prepared batch and sees its partitions held back
@pytest.mark.full
def test_prepared_batch_is_invisible_until_decided(pipeline: Pipeline) -> None:
    pipeline.max_offsets = 10_000  # one batch: Spark's per-partition rounding could split 400
    ids = produce_ids(pipeline.bootstrap, pipeline.input, 400)

    process = pipeline.start("driver.before_decision=block")
    pipeline.wait_reached("driver.before_decision", process)
    uncommitted = read_topic(pipeline.bootstrap, pipeline.output, "read_uncommitted")
    committed = committed_report(pipeline.bootstrap, pipeline.output, ids)
    assert len(uncommitted) == 400
    assert committed.seen == 0
    pipeline.release("driver.before_decision")
    outcome = finish(process)

    assert outcome.returncode == 0, outcome.error
    assert_exactly_once(pipeline, ids)
