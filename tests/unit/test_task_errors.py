"""A task attempt that fails leaves the kind of its error (never its message) next to the commit
log, and the metrics count each attempt once by kind; a record that cannot be written never
hides the task's own error."""

from __future__ import annotations

import logging
from dataclasses import replace
from pathlib import Path

import pytest
from pyspark import TaskContext

from kafka_txn_sink.commit_log import JsonCommitLog
from kafka_txn_sink.errors import InputError, QueryIdMismatchError
from kafka_txn_sink.metrics.batches import LogReader
from kafka_txn_sink.metrics.exporter import SinkMetrics
from kafka_txn_sink.protocol import task_errors
from kafka_txn_sink.protocol.causes import cause_of
from kafka_txn_sink.protocol.prepare import prepare_task
from kafka_txn_sink.protocol.run_records import SinkMeta
from kafka_txn_sink.protocol.task_errors import TaskError
from kafka_txn_sink.storage import LocalStorage
from tests.unit.test_cli import decision
from tests.unit.test_metrics import value
from tests.unit.test_speculation import plan, task_context

__all__ = ["task_context"]  # the fixture, used by name


def error(
    batch_id: int, partition: int = 0, attempt: int = 0, kind: str = "InputError"
) -> TaskError:
    return TaskError(batch_id, 1, partition, attempt, kind, 1_000)


def test_a_failed_task_leaves_its_error_kind_and_nothing_of_its_message(
    task_context: TaskContext, tmp_path: Path
) -> None:
    task_context._partitionId, task_context._attemptNumber = 3, 2
    other = replace(plan(tmp_path), log_query_id="another-query")

    with pytest.raises(QueryIdMismatchError):
        prepare_task(other, iter([("v",)]), arrow=False)

    storage = LocalStorage(tmp_path / "log")
    [name] = storage.list(task_errors.PREFIX)
    assert name == task_errors.name_of(0, 1, 3, 2)
    text = (storage.get(name) or b"").decode()
    assert '"error": "QueryIdMismatchError"' in text
    assert "another-query" not in text and "spec" not in text  # no message, no option value
    [found] = task_errors.TaskErrorReader(storage, lambda: -1).read()
    assert (found.batch_id, found.run, found.partition, found.attempt) == (0, 1, 3, 2)
    assert found.kind == "QueryIdMismatchError"


def test_a_record_that_cannot_be_written_leaves_the_tasks_own_error(
    task_context: TaskContext, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    (tmp_path / "log").write_text("a file where the log's folder should be")
    other = replace(plan(tmp_path), log_query_id="another-query")

    with caplog.at_level(logging.WARNING), pytest.raises(QueryIdMismatchError):
        prepare_task(other, iter([("v",)]), arrow=False)

    assert "could not" in caplog.text and "another-query" not in caplog.text


def test_the_reader_counts_each_record_once_and_starts_from_a_baseline(tmp_path: Path) -> None:
    storage = LocalStorage(tmp_path / "log")
    for batch_id in (3, 4):
        task_errors.leave(storage, error(batch_id))
    task_errors.leave(storage, error(4))  # the same attempt again: the first record stays
    fresh = task_errors.TaskErrorReader(storage)  # no history: what is there is the baseline
    back = task_errors.TaskErrorReader(storage, lambda: 3)  # batches above 3

    assert fresh.read() == []
    assert [e.batch_id for e in back.read()] == [4]
    task_errors.leave(storage, error(5, partition=1, attempt=1, kind="other"))
    storage.put(f"{task_errors.PREFIX}not-a-record.json", b"{}")
    assert [(e.batch_id, e.kind) for e in fresh.read()] == [(5, "other")]
    assert fresh.read() == []


def test_a_record_with_a_kind_that_is_no_class_name_counts_as_other(tmp_path: Path) -> None:
    storage = LocalStorage(tmp_path / "log")
    task_errors.leave(storage, error(0, kind="password=hunter2"))
    [found] = task_errors.TaskErrorReader(storage, lambda: -1).read()
    assert found.kind == "other"


def test_the_metrics_count_task_errors_by_kind(tmp_path: Path) -> None:
    commit_log = JsonCommitLog(LocalStorage(tmp_path / "log"))
    commit_log.create(SinkMeta("orders", created_at_ms=1))
    commit_log.put_decision(decision(0))
    storage = LocalStorage(tmp_path / "log")
    task_errors.leave(storage, error(0))  # before the exporter: the baseline
    metrics = SinkMetrics("orders", LogReader(commit_log), guard=None, task_errors=storage)
    metrics.refresh()
    assert value(metrics, "kafka_txn_sink_task_errors_total", kind="InputError") is None

    task_errors.leave(storage, error(1))
    task_errors.leave(storage, error(1, attempt=1))
    task_errors.leave(storage, error(1, attempt=2, kind=cause_of(KeyError("x"))))
    task_errors.leave(storage, error(1, attempt=3, kind=cause_of(InputError("y"))))
    metrics.refresh()
    metrics.refresh()

    assert value(metrics, "kafka_txn_sink_task_errors_total", kind="InputError") == 3
    assert value(metrics, "kafka_txn_sink_task_errors_total", kind="other") == 1
    assert value(metrics, "kafka_txn_sink_log_up") == 1
