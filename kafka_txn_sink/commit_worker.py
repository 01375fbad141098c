"""The writer Spark builds for a batch's `commit()` or `abort()`, in its commit worker.

PySpark builds a streaming query's writer twice per batch: in the planner, whose writer is sent
to the tasks, and again in the worker that runs the batch's `commit()` or `abort()` with the
tasks' messages (`pyspark.sql.worker.python_streaming_sink_runner`, in PySpark 4.0 to 4.3).
The second is built here, from the options alone. Its `commit()` takes what the planner's
start found (the driver's run, the transaction timeout fitted to the brokers) from the tasks'
messages, so a batch starts once: the commit checks itself that its run is current before it
decides (decide.py), and the planner rolled every earlier decision forward. Only when no
message carries them (every task failed, a task of an older version) does it start again
first, without the consumer group's member check. `abort()` always starts first, as before.
Neither uses the Schema Registry: a registry that does not answer, or a consumer that joined
the group at that moment, would otherwise leave the batch's prepared transactions open until
the brokers' timeout.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator, Sequence
from typing import Any

from pyspark.sql.datasource import DataSourceStreamWriter, WriterCommitMessage

from kafka_txn_sink.errors import KafkaTxnSinkError
from kafka_txn_sink.options import SinkOptions
from kafka_txn_sink.protocol.decide import abort_batch, commit_batch
from kafka_txn_sink.protocol.runs import RunRef
from kafka_txn_sink.protocol.start import start_batch
from kafka_txn_sink.protocol.task_commit import TaskCommit

COMMIT_RUNNER = "python_streaming_sink_runner"


def building_for_commit() -> bool:
    """Whether the caller runs inside PySpark's commit/abort runner (its module on the stack,
    imported by Spark's worker daemon or run as `__main__`)."""
    frame = sys._getframe(1)
    while frame is not None:
        module = str(frame.f_globals.get("__name__", ""))
        if module.rsplit(".", 1)[-1] == COMMIT_RUNNER or frame.f_code.co_filename.endswith(
            f"/{COMMIT_RUNNER}.py"
        ):
            return True
        frame = frame.f_back  # type: ignore[assignment]
    return False


class CommitWorkerWriter(DataSourceStreamWriter):
    """The commit worker's writer: the checked options, and no start until one is needed."""

    def __init__(self, options: SinkOptions):
        self.options = options

    def write(self, iterator: Iterator[Any]) -> WriterCommitMessage:
        """Never called: Spark's commit worker runs no task."""
        raise KafkaTxnSinkError("the commit worker's writer of kafka_txn writes no rows")

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        """Decide the batch and complete it (decide.py), with the planner's run."""
        planned = planner_start(messages)
        if planned is None:
            started = start_batch(self.options, for_commit=True)
            commit_batch(started.options, messages, batchId, started.run)
            return
        run, timeout_ms = planned
        commit_batch(self.options.with_transaction_timeout(timeout_ms), messages, batchId, run)

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        """Abort what the tasks prepared, unless the batch is decided; after a start of its
        own, which refuses a run that was superseded or released."""
        started = start_batch(self.options, for_commit=True)
        abort_batch(started.options, messages, batchId, started.run)


def planner_start(messages: Sequence[WriterCommitMessage | None]) -> tuple[RunRef, int] | None:
    """The run and fitted transaction timeout the batch's tasks were planned with, or None when
    no message carries them or two messages disagree."""
    found: set[tuple[RunRef, int]] = set()
    for message in messages:
        if isinstance(message, TaskCommit) and message.run and message.transaction_timeout_ms:
            found.add((message.run, message.transaction_timeout_ms))
    return found.pop() if len(found) == 1 else None
