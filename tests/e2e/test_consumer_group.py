"""Option consumerGroup through real Spark and a real broker: the query's input offsets are
committed to the group inside each batch's transactions, so `kafka-consumer-groups.sh --describe`
shows the query's lag, and the group never holds offsets of rows a read_committed consumer cannot
see yet, whatever the driver's kill point; a group with members or a source that is not Kafka is
refused at the start, with nothing published."""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable

import pytest
from confluent_kafka import Consumer

from kafka_txn_sink import cli
from kafka_txn_sink.kafka.txn_admin import TxnAdmin
from kafka_txn_sink.protocol.messages import PROGRESS_PARTITION
from kafka_txn_sink.protocol.txn_ids import group_id
from kafka_txn_sink.spark_checkpoint import batch_end_offsets
from kafka_txn_sink.testing import KafkaBroker
from kafka_txn_sink.testing.consumer_groups import describe_group, group_offsets
from kafka_txn_sink.testing.topics import read_topic
from tests.e2e.conftest import NEWEST, SPARK_LINES
from tests.e2e.harness import (
    PAST_TIMEOUT,
    Pipeline,
    assert_exactly_once,
    committed_report,
    create_topics,
    kill_group,
    open_transactions,
    produce_ids,
    wait_until_aborted,
    write_input_files,
)

pytestmark = [pytest.mark.kafka, pytest.mark.spark]

N = 1200  # three micro-batches of 400 over three input partitions


def _with_group(pipeline: Pipeline) -> str:
    group = f"g_{uuid.uuid4().hex[:8]}"
    pipeline.options["consumerGroup"] = group
    return group


def _described(pipeline: Pipeline, group: str) -> dict[str, dict[int, int]]:
    return group_offsets(describe_group(pipeline.bootstrap, group))


def _end_of(pipeline: Pipeline, batch: int) -> dict[str, dict[int, int]]:
    return batch_end_offsets(str(pipeline.checkpoint), batch)


def _records(offsets: dict[str, dict[int, int]]) -> int:
    """Input records up to `offsets` (every partition from 0)."""
    return sum(sum(parts.values()) for parts in offsets.values())


def _restart(pipeline: Pipeline, ids: list[str]) -> int:
    """Run the query again to its end: it succeeds, every id once; its last batch."""
    outcome = pipeline.run()
    assert outcome.returncode == 0, outcome.error
    assert_exactly_once(pipeline, ids)
    last = outcome.result["batches"]
    assert isinstance(last, list) and last
    return int(last[-1])


# CI: the progress aborted by the timeout, whose replay ends with the group at the last end
@pytest.mark.full
def test_the_group_holds_the_last_batch_end_offsets(
    pipeline: Pipeline, capsys: pytest.CaptureFixture[str]
) -> None:
    group = _with_group(pipeline)
    ids = produce_ids(pipeline.bootstrap, pipeline.input, N)

    outcome = pipeline.run()

    assert outcome.returncode == 0, outcome.error
    assert_exactly_once(pipeline, ids)
    batches = outcome.result["batches"]
    assert isinstance(batches, list) and len(batches) >= 3
    rows = describe_group(pipeline.bootstrap, group)
    assert group_offsets(rows) == _end_of(pipeline, batches[-1])
    assert sum(r.current or 0 for r in rows) == N and all(r.lag == 0 for r in rows), rows
    decision = pipeline.open_log().decision(0)
    assert decision is not None
    [progress] = [p for p in decision.participants if p.progress is not None]
    assert progress.transactional_id == f"{pipeline.sink_id}-0-g"
    assert progress.progress is not None and progress.progress.group == group
    assert progress.progress.offsets == _end_of(pipeline, 0)
    # The command that starts a new checkpoint where the group is.
    capsys.readouterr()
    code = cli.main(
        ["--json", "group-offsets", "--bootstrap", pipeline.bootstrap, "--group", group]
    )
    printed = json.loads(capsys.readouterr().out)
    assert code == 0
    end = _end_of(pipeline, batches[-1])
    assert printed["startingOffsets"] == {
        t: {str(p): o for p, o in parts.items()} for t, parts in end.items()
    }


# Kill points of the commit with the group set (the clean-up's runs only when due); the full
# tier runs every one on both lines.
KILLS = [
    "driver.before_prepare_check",  # the progress transaction is open, nothing decided
    "driver.before_decision",
    "driver.after_decision",
    "driver.after_first_endtxn",
    "driver.after_completion",  # the group holds batch 1's end already
    "driver.before_progress_endtxn",
]
GROUP_MOVED = {"driver.after_completion"}


def kill_matrix() -> list[object]:
    """Each kill point on both Spark lines, in the full tier. CI: the short crash suite's query
    has a consumer group, and its oracle checks the group is at a completed batch's end after
    every kill (tests/chaos/test_crash_suite.py)."""
    return [
        pytest.param(
            line, point, id=f"{point}-{line}",
            marks=(pytest.mark.full,),
        )
        for point in KILLS
        for line in SPARK_LINES
    ]  # fmt: skip


@pytest.mark.parametrize(("pipeline", "point"), kill_matrix(), indirect=["pipeline"])
def test_a_killed_driver_leaves_the_group_behind_the_visible_rows(
    pipeline: Pipeline, point: str
) -> None:
    group = _with_group(pipeline)
    ids = produce_ids(pipeline.bootstrap, pipeline.input, N)

    process = pipeline.start(f"{point}=block@1")
    pipeline.wait_reached(point, process)
    kill_group(process)

    # Killed in batch 1's commit: the group holds batch 0's end, batch 1's only once complete.
    assert _described(pipeline, group) == _end_of(pipeline, 1 if point in GROUP_MOVED else 0)
    visible = committed_report(pipeline.bootstrap, pipeline.output, ids).seen
    if point == "driver.before_progress_endtxn":  # batch 1's rows are out, its offsets not
        assert visible == _records(_end_of(pipeline, 1))
    last = _restart(pipeline, ids)

    assert _described(pipeline, group) == _end_of(pipeline, last)
    assert _records(_described(pipeline, group)) == N


@pytest.mark.full  # CI: tests/integration/test_group_start.py, without Spark
def test_a_group_with_an_active_member_is_refused(pipeline: Pipeline) -> None:
    group = _with_group(pipeline)
    ids = produce_ids(pipeline.bootstrap, pipeline.input, 300)
    member = Consumer(
        {
            "bootstrap.servers": pipeline.bootstrap,
            "group.id": group,
            "auto.offset.reset": "earliest",
        }
    )
    member.subscribe([pipeline.input])
    try:
        for _ in range(60):  # until the member has joined and holds its partitions
            member.poll(0.5)
            if member.assignment():
                break
        assert member.assignment(), "the member did not join its group"
        outcome = pipeline.run()
    finally:
        member.close()

    assert outcome.returncode != 0
    assert f"consumer group {group} has 1 active member" in outcome.error, outcome.error
    assert "consumerGroup" in outcome.error
    assert committed_report(pipeline.bootstrap, pipeline.output, ids).seen == 0
    assert read_topic(pipeline.bootstrap, pipeline.output, "read_uncommitted") == []
    assert open_transactions(pipeline.bootstrap, pipeline.sink_id) == []


@pytest.mark.full  # CI: tests/integration/test_group_start.py, without Spark
def test_a_source_that_is_not_kafka_is_refused(pipeline: Pipeline) -> None:
    _with_group(pipeline)
    pipeline.input_dir = pipeline.workdir / "input"
    rows = [(f"id-{i}", json.dumps({"n": i})) for i in range(20)]
    write_input_files(pipeline.input_dir, rows, files=2)

    outcome = pipeline.run()

    assert outcome.returncode != 0
    assert "names no Kafka topic" in outcome.error and "consumerGroup" in outcome.error, (
        outcome.error
    )
    assert read_topic(pipeline.bootstrap, pipeline.output, "read_uncommitted") == []
    assert open_transactions(pipeline.bootstrap, pipeline.sink_id) == []


@pytest.mark.parametrize(
    "point",
    [
        "driver.before_progress_endtxn",
        pytest.param("driver.after_decision", marks=pytest.mark.full),
    ],
)
def test_a_progress_aborted_by_the_timeout_is_committed_again_by_the_replay(
    pipeline: Pipeline, point: str
) -> None:
    """Killed in batch 1's commit and restarted after the transaction timeout: at the progress
    point only the group's offsets are lost (the rows are visible), after the decision both;
    the replay's repair writes what was lost, and the group then holds the last batch's end."""
    group = _with_group(pipeline)
    # The group's margin is 6 s more (2 x commitTimeoutMs): the timeout too, keeping a batch's
    # time to prepare as PAST_TIMEOUT gives it without the group.
    pipeline.options.update({**PAST_TIMEOUT, "transactionTimeoutMs": "41000"})
    ids = produce_ids(pipeline.bootstrap, pipeline.input, 500)  # batches of 400 and 100
    process = pipeline.start(f"{point}=block@1")
    pipeline.wait_reached(point, process)
    kill_group(process)
    decision = pipeline.open_log().decision(1)
    assert decision is not None
    txn_ids = [p.transactional_id for p in decision.participants]
    wait_until_aborted(pipeline.bootstrap, txn_ids, "the timeout abort of batch 1")
    assert _described(pipeline, group) == _end_of(pipeline, 0)

    outcome = pipeline.run()

    assert outcome.returncode == 0, outcome.error
    assert_exactly_once(pipeline, ids)
    log = pipeline.open_log()
    completion, repair = log.completion(1), log.repair(1, 1)
    assert completion is not None and repair is not None
    lost = sorted(x.partition for x in completion.lost)
    if point == "driver.before_progress_endtxn":
        assert lost == [PROGRESS_PARTITION]
        assert [p.partition for p in repair.participants] == [PROGRESS_PARTITION]
    else:
        assert PROGRESS_PARTITION in lost and len(lost) == len(decision.participants)
    assert _described(pipeline, group) == _end_of(pipeline, 1)
    assert _records(_described(pipeline, group)) == 500


@pytest.mark.full  # CI: tests/integration/test_group_across.py, each step without Spark
@pytest.mark.parametrize("pipeline", [NEWEST], indirect=True)
def test_a_group_on_the_inputs_own_cluster_follows_the_rows_after_a_kill(
    pipeline: Pipeline, make_kafka_broker: Callable[..., KafkaBroker]
) -> None:
    """Input and group on one broker, output on another: the offsets are committed after each
    batch's rows. Killed between batch 1's rows and its offsets, the group holds batch 0's end
    (behind the visible rows, never ahead); after the restart every id once and the group at the
    last batch's end, with nothing left open on the group's cluster."""
    source = make_kafka_broker()
    create_topics(source.bootstrap, 3, pipeline.input)
    pipeline.input_bootstrap = source.bootstrap
    group = _with_group(pipeline)
    pipeline.options["consumerGroup.kafka.bootstrap.servers"] = source.bootstrap
    ids = produce_ids(source.bootstrap, pipeline.input, N)

    process = pipeline.start("driver.before_group_commit=block@1")
    pipeline.wait_reached("driver.before_group_commit", process)
    kill_group(process)

    assert group_offsets(describe_group(source.bootstrap, group)) == _end_of(pipeline, 0)
    visible = committed_report(pipeline.bootstrap, pipeline.output, ids).seen
    assert visible == _records(_end_of(pipeline, 1))
    last = _restart(pipeline, ids)

    rows = describe_group(source.bootstrap, group)
    assert group_offsets(rows) == _end_of(pipeline, last)
    assert sum(r.current or 0 for r in rows) == N and all(r.lag == 0 for r in rows), rows
    with TxnAdmin(source.bootstrap, {}) as txn_admin:
        state = txn_admin.describe([group_id(pipeline.sink_id)])[group_id(pipeline.sink_id)]
    assert state.state != "Ongoing", state
    decision = pipeline.open_log().decision(1)
    assert decision is not None and all(p.progress is None for p in decision.participants)
