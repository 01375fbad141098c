"""The commit worker's writer (commit_worker.py): which run its commit() uses, and when it
starts a batch again first. The outcome in a real query (each batch starts once, rows seen
once) is tests/e2e/test_records_exactly_once.py's."""

from __future__ import annotations

from typing import Any

import pytest

from kafka_txn_sink import commit_worker
from kafka_txn_sink.commit_worker import CommitWorkerWriter, planner_start
from kafka_txn_sink.option_extras import checked_options
from kafka_txn_sink.protocol.runs import RunRef
from kafka_txn_sink.protocol.start import BatchStart
from kafka_txn_sink.protocol.task_commit import TaskCommit

RUN = RunRef(run=3, slot=1)
OPTIONS = {"kafka.bootstrap.servers": "127.0.0.1:9", "topic": "t", "sinkId": "s", "commitLog": "/x"}


def message(partition: int, run: RunRef | None = RUN, timeout: int | None = 60_000) -> TaskCommit:
    return TaskCommit("q", 7, partition, 0, "empty", run=run, transaction_timeout_ms=timeout)


def test_the_run_and_timeout_the_tasks_were_planned_with() -> None:
    assert planner_start([message(0), None, message(1)]) == (RUN, 60_000)


@pytest.mark.parametrize(
    "messages",
    [
        pytest.param([], id="no-task"),
        pytest.param([None, None], id="every-task-failed"),
        pytest.param([message(0, run=None, timeout=None)], id="a-task-of-an-older-version"),
        pytest.param([message(0), message(1, run=RunRef(4, 0))], id="two-runs"),
        pytest.param([message(0), message(1, timeout=30_000)], id="two-timeouts"),
    ],
)
def test_none_unless_the_messages_agree(messages: list[Any]) -> None:
    assert planner_start(messages) is None


class Calls:
    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.starts = 0
        self.decided: list[tuple[int | None, RunRef]] = []
        self.aborted: list[RunRef] = []
        monkeypatch.setattr(commit_worker, "start_batch", self.start)
        monkeypatch.setattr(commit_worker, "commit_batch", self.commit)
        monkeypatch.setattr(commit_worker, "abort_batch", self.abort)

    def start(self, options: Any, for_commit: bool) -> BatchStart:
        assert for_commit
        self.starts += 1
        return BatchStart(options.with_transaction_timeout(90_000), "q", 6, RunRef(5, 2))

    def commit(self, options: Any, messages: Any, batch_id: int, run: RunRef) -> None:
        self.decided.append((options.transaction_timeout_ms, run))

    def abort(self, options: Any, messages: Any, batch_id: int, run: RunRef) -> None:
        self.aborted.append(run)


def test_commit_takes_the_planners_run_without_a_start(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = Calls(monkeypatch)
    CommitWorkerWriter(checked_options(OPTIONS)).commit([message(0), message(1)], 7)
    assert calls.starts == 0
    assert calls.decided == [(60_000, RUN)]


def test_commit_starts_first_when_no_message_carries_the_run(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    calls = Calls(monkeypatch)
    CommitWorkerWriter(checked_options(OPTIONS)).commit([], 7)
    assert calls.starts == 1
    assert calls.decided == [(90_000, RunRef(5, 2))]


def test_abort_always_starts_first(monkeypatch: pytest.MonkeyPatch) -> None:
    """Its start refuses a run that was superseded or released (runs.py), as before."""
    calls = Calls(monkeypatch)
    CommitWorkerWriter(checked_options(OPTIONS)).abort([message(0)], 7)
    assert calls.starts == 1
    assert calls.aborted == [RunRef(5, 2)]
