"""A task's view of the commit log (issue 24, defect 6): a task that cannot see the log the
driver claimed fails with an error naming the location, instead of reading "not decided"."""

from __future__ import annotations

from pathlib import Path

import pytest

from kafka_txn_sink.commit_log import open_commit_log
from kafka_txn_sink.errors import CommitLogError
from kafka_txn_sink.options import parse_options
from kafka_txn_sink.protocol.messages import Abort, Triple
from kafka_txn_sink.protocol.prepare import decided
from kafka_txn_sink.protocol.run_records import SinkMeta
from kafka_txn_sink.protocol.runs import RunRef
from kafka_txn_sink.protocol.task_plan import TaskPlan
from tests.commit_log_races import make_decision

SINK = "orders"


def _plan(log_dir: Path, fmt: str = "json") -> TaskPlan:
    options = parse_options(
        {
            "kafka.bootstrap.servers": "h:1",
            "topic": "out",
            "sinkId": SINK,
            "commitLog": str(log_dir),
            "commitLogFormat": fmt,
        }
    )
    return TaskPlan(options, None, None, None, None, RunRef(0, 0))


@pytest.mark.parametrize("fmt", ["json", "delta"])
def test_a_task_that_cannot_see_the_log_fails_naming_the_location(
    tmp_path: Path, fmt: str
) -> None:
    # The driver claimed its log on its own disk; the executor's path holds nothing.
    executor_view = tmp_path / "driver-only" / "log"

    with pytest.raises(CommitLogError) as info:
        decided(_plan(executor_view, fmt), 3)

    message = str(info.value)
    assert f"commitLog={executor_view}" in message
    assert "Executors must reach the same commitLog location as the driver" in message


@pytest.mark.parametrize("fmt", ["json", "delta"])
def test_a_task_reads_decided_undecided_and_aborted_batches(tmp_path: Path, fmt: str) -> None:
    plan = _plan(tmp_path / "log", fmt)
    log = open_commit_log(plan.options.commit_log, fmt=plan.options.commit_log_format)
    log.create(SinkMeta(SINK, created_at_ms=1))
    log.put_decision(make_decision(2))
    log.put_abort(Abort(SINK, 3, 0, (Triple("orders-0-0", 1, 0),), 5, run=0))

    assert decided(plan, 2)
    assert not decided(plan, 3)  # round 0 aborted: the replay prepares again
    assert not decided(plan, 4)


@pytest.mark.parametrize("fmt", ["json", "delta"])
def test_a_replay_task_that_cannot_see_the_log_fails_instead_of_taking_its_repair_level(
    tmp_path: Path, fmt: str
) -> None:
    """N9: on the repair path the batch is known decided from the plan; a task that cannot see
    the log must not read "this level is free" there either (it would write the level again
    after another attempt's repair was recorded, fencing a repair participant)."""
    from dataclasses import replace

    from kafka_txn_sink.protocol.prepare import repair_level
    from kafka_txn_sink.protocol.repair import RepairPlan

    executor_view = tmp_path / "driver-only" / "log"
    plan = replace(
        _plan(executor_view, fmt),
        columns=object(),  # type: ignore[arg-type]
        last_decided=3,
        repair=RepairPlan(3, 1, ()),
    )
    assert decided(plan, 3)

    with pytest.raises(CommitLogError, match="Executors must reach the same commitLog"):
        repair_level(plan, 3)
