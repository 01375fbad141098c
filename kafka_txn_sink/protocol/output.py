"""What a task writes, as the protocol sees it: an output plugged into the task's transaction.

Records mode (`records.output.RecordsOutput`) and files mode (`files.output.FilesOutput`) are
the two outputs. The task (`prepare.py`) opens one transaction and hands it to each output it
uses; an output produces whatever it produces into that transaction, and reports back only what
the commit message must carry. So the protocol never imports an output's libraries: a records
sink never loads fastavro, and files mode is loaded only when option `path` is set.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    import pyarrow as pa

    from kafka_txn_sink.protocol.messages import FileRef

Headers = list[tuple[str, bytes | None]]


class Transaction(Protocol):
    """The task's open transaction, as outputs use it (`kafka.producer.TaskTransaction`)."""

    def send(
        self,
        topic: str,
        value: bytes | None,
        key: bytes | None = None,
        partition: int | None = None,
        headers: Headers | None = None,
        timestamp_ms: int | None = None,
    ) -> None:
        """Produce one record into the transaction (`timestamp_ms`: its timestamp, else the
        producer's clock)."""
        ...

    def send_many(
        self, topic: str, values: Sequence[bytes | None], keys: Sequence[bytes | None] | None
    ) -> None:
        """Produce `values[i]` with `keys[i]` to `topic`, for every i."""
        ...


class TaskOutput(Protocol):
    """One task attempt's share of one output, bound to the task's open transaction."""

    def add_rows(self, rows: Sequence[Any]) -> None:
        """Take input rows, as tuples in the order of the input's columns (the row writer,
        PySpark 4.0).

        Raises:
            InputError: a row cannot be written; the message names the column.
        """
        ...

    def add_batch(self, batch: pa.RecordBatch) -> None:
        """Take one Arrow record batch of input rows (the Arrow writer, PySpark 4.1+).

        Raises:
            InputError: a row cannot be written; the message names the column.
        """
        ...

    def close(self) -> tuple[FileRef, ...]:
        """Finish: everything is in the transaction now; the files the commit message lists.

        Raises:
            StagingError / KafkaTxnSinkError: the output could not be finished; the task fails
                and its transaction is aborted.
        """
        ...

    def abort(self) -> None:
        """Drop what was not finished (best effort, never raises)."""
        ...
