"""The thin Spark adapters: a `DataSourceStreamWriter` whose methods are the protocol's steps.

Spark builds the writer on the driver just before a batch's tasks (planner.py), pickles it to
the tasks and calls `write()` in each task (prepare.py). It carries only the `TaskPlan`. The
batch's `commit()` or `abort()` runs on the writer Spark builds again in its commit worker
(commit_worker.py); this writer's own `commit()` and `abort()` (decide.py) serve a Spark that
would call them on the planner's writer instead.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pyspark.sql.datasource as _datasource
from pyspark.sql.datasource import DataSourceStreamWriter, WriterCommitMessage

from kafka_txn_sink.protocol.decide import abort_batch, commit_batch
from kafka_txn_sink.protocol.task_commit import TaskCommit
from kafka_txn_sink.protocol.task_plan import TaskPlan

# PySpark 4.1+ has it; on 4.0 this is None and the row writer is used.
ArrowStreamWriterBase: Any = getattr(_datasource, "DataSourceStreamArrowWriter", None)
ARROW_WRITER_AVAILABLE = ArrowStreamWriterBase is not None


class KafkaTxnStreamWriter(DataSourceStreamWriter):
    """The sink's writer, fed Spark `Row`s."""

    def __init__(self, plan: TaskPlan):
        self.plan = plan

    def write(self, iterator: Iterator[Any]) -> TaskCommit:
        """In each task: prepare the task's transaction (prepare.py)."""
        return prepare_in_task(self.plan, iterator, arrow=False)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        """On the driver: decide the batch and complete it (decide.py)."""
        commit_batch(self.plan.options, messages, batchId, self.plan.run)

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        """On the driver: abort what the tasks prepared, unless the batch is decided."""
        abort_batch(self.plan.options, messages, batchId, self.plan.run)


class KafkaTxnStreamArrowWriter(KafkaTxnStreamWriter):
    """The same writer, fed Spark's Arrow record batches instead of rows (PySpark 4.1+).

    Registered as a `DataSourceStreamArrowWriter` where PySpark has that class, which is what
    makes Spark hand `write()` the batches: PySpark then skips building one `Row` per row (a
    Python call per cell, about 2 us a row, measured), and records mode produces from whole
    columns (records/arrow.py).
    """

    def write(self, iterator: Iterator[Any]) -> TaskCommit:
        """In each task: prepare the task's transaction from Arrow batches (prepare.py)."""
        return prepare_in_task(self.plan, iterator, arrow=True)


if ArrowStreamWriterBase is not None:
    ArrowStreamWriterBase.register(KafkaTxnStreamArrowWriter)


def prepare_in_task(plan: TaskPlan, iterator: Iterator[Any], arrow: bool) -> TaskCommit:
    """prepare.py's `prepare_task`, loaded in the task that runs it: the driver, which builds,
    pickles and commits these writers, never loads the tasks' modules (pyarrow, the producer)."""
    from kafka_txn_sink.protocol.prepare import prepare_task

    return prepare_task(plan, iterator, arrow)


def stream_writer_class() -> type[KafkaTxnStreamWriter]:
    """The Arrow writer where PySpark offers it (4.1+), else the row writer.

    KTS_ARROW_WRITER=0 in the driver's environment forces the row writer (for comparisons).
    """
    if ARROW_WRITER_AVAILABLE and os.environ.get("KTS_ARROW_WRITER") != "0":
        return KafkaTxnStreamArrowWriter
    return KafkaTxnStreamWriter
