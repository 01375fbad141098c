"""The thin Spark adapters of a batch write (`df.write`): a `DataSourceWriter` whose methods are
the protocol's steps, on the batch of the commit log the driver chose for the write.

Spark builds the writer once on the driver (`writer()`, which ran start.py's `start_write`),
pickles it to the tasks, calls `write()` in each task (prepare.py) and then `commit()` or
`abort()` on the driver (decide.py) with the same pickled writer. It carries only the
`TaskPlan`, whose `write` names the write and its batch.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

from pyspark.sql.datasource import DataSourceArrowWriter, DataSourceWriter, WriterCommitMessage

from kafka_txn_sink.protocol.decide import abort_batch, commit_batch
from kafka_txn_sink.protocol.stream_writer import prepare_in_task
from kafka_txn_sink.protocol.task_commit import TaskCommit
from kafka_txn_sink.protocol.task_plan import TaskPlan
from kafka_txn_sink.protocol.write_ids import BatchWrite


class KafkaTxnBatchWriter(DataSourceWriter):
    """The sink's batch writer, fed Spark `Row`s."""

    def __init__(self, plan: TaskPlan):
        if plan.write is None:
            raise ValueError("a batch writer needs the plan of a batch write")
        self.plan = plan
        self.batch: BatchWrite = plan.write

    def write(self, iterator: Iterator[Any]) -> TaskCommit:
        """In each task: prepare the task's transaction (prepare.py)."""
        return prepare_in_task(self.plan, iterator, arrow=False)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        """On the driver: decide the write's batch and complete it (decide.py); for a write
        decided before, complete it if need be and write nothing more."""
        commit_batch(self.plan.options, messages, self.batch.batch_id, self.plan.run, self.batch)

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        """On the driver: abort what the tasks prepared, unless the batch is decided."""
        abort_batch(self.plan.options, messages, self.batch.batch_id, self.plan.run)


class KafkaTxnBatchArrowWriter(KafkaTxnBatchWriter, DataSourceArrowWriter):
    """The same writer, fed Spark's Arrow record batches instead of rows (PySpark 4.0+): no
    `Row` per row, and records mode produces from whole columns (records/arrow.py)."""

    def write(self, iterator: Iterator[Any]) -> TaskCommit:
        """In each task: prepare the task's transaction from Arrow batches (prepare.py)."""
        return prepare_in_task(self.plan, iterator, arrow=True)


def batch_writer_class() -> type[KafkaTxnBatchWriter]:
    """The Arrow writer, unless KTS_ARROW_WRITER=0 in the driver's environment forces the row
    writer (for comparisons), as for streaming queries."""
    if os.environ.get("KTS_ARROW_WRITER") != "0":
        return KafkaTxnBatchArrowWriter
    return KafkaTxnBatchWriter
