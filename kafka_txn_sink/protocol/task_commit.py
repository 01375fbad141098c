"""The message a task attempt returns from `write()`: what it prepared, for the driver's decision.

It travels from the executor to `commit()` pickled by Spark, which requires Spark's
`WriterCommitMessage` as its base; this module is the protocol's only one that imports PySpark
at import time besides the writers, so the command line and the commit log run without it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from pyspark.sql.datasource import WriterCommitMessage

from kafka_txn_sink.protocol.messages import (
    FileRef,
    OffsetRanges,
    Participant,
    SchemaUse,
    TaskStatus,
    Triple,
)
from kafka_txn_sink.protocol.runs import RunRef
from kafka_txn_sink.protocol.stats import TaskCost


@dataclass(frozen=True)
class TaskCommit(WriterCommitMessage):
    """The message one task attempt returns from `write()`."""

    query_id: str
    batch_id: int
    partition: int
    attempt: int
    status: TaskStatus
    rows: int = 0
    triple: Triple | None = None  # the prepared transaction; None unless status is prepared
    offsets: OffsetRanges = field(default_factory=dict)
    prepared_at_ms: int = 0
    files: tuple[FileRef, ...] = ()
    digest: str = ""  # of its records (records/digest.py); "" without records
    level: int = 0  # the repair level it wrote at (protocol/repair.py); 0: the batch itself
    schemas: tuple[SchemaUse, ...] = ()  # the registry's schemas its records carry (serde/)
    started_at_ms: int = 0  # when the attempt began (protocol/stats.py)
    bytes: int = 0  # what its producer sent for its records (protocol/stats.py)
    dead_lettered: int = 0  # of its rows, those it wrote to the dead-letter topic
    # What the planner's start found, for the commit worker's writer (commit_worker.py): the
    # driver's run and the transaction timeout fitted to the brokers. None from an older task.
    run: RunRef | None = None
    transaction_timeout_ms: int | None = None

    @property
    def prepared_triple(self) -> Triple:
        """The prepared transaction.

        Raises:
            ValueError: this task prepared none (it was empty or skipped).
        """
        if self.triple is None:
            raise ValueError(f"task {self.partition} of batch {self.batch_id} has no transaction")
        return self.triple

    def participant(self) -> Participant:
        """The participant this prepared task's message describes.

        Raises:
            ValueError: the task did not prepare a transaction.
        """
        return Participant(
            partition=self.partition,
            attempt=self.attempt,
            triple=self.prepared_triple,
            rows=self.rows,
            offsets=self.offsets,
            files=self.files,
            digest=self.digest,
            dead_lettered=self.dead_lettered,
        )

    def cost(self) -> TaskCost:
        """What the attempt cost, for its batch's statistics."""
        return TaskCost(self.started_at_ms, self.prepared_at_ms, self.bytes)
