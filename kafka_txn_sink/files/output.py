"""Files mode as one output of a task (`protocol.output.TaskOutput`): rows in, Avro files out.

The task hands every row (or Arrow batch) to `FilesOutput`, which writes them into the files of
its attempt (`writer.FileSet`). At `close` the files are finished and uploaded, and one
reference message per file (`references.reference`) is produced into the task's open
transaction; the refs returned go into the task's commit message, so the decision lists every
file. `abort` drops what is not uploaded; uploaded files of a failed attempt stay until vacuum.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from kafka_txn_sink.errors import InputError
from kafka_txn_sink.files.naming import FileNaming
from kafka_txn_sink.files.plan import FilePlan
from kafka_txn_sink.files.references import reference
from kafka_txn_sink.files.rows_arrow import RowsToArrow
from kafka_txn_sink.files.writer import FileSet
from kafka_txn_sink.files_options import FilesOptions
from kafka_txn_sink.options import SinkOptions
from kafka_txn_sink.protocol.messages import FileRef
from kafka_txn_sink.protocol.output import Transaction
from kafka_txn_sink.storage import open_file_sink

if TYPE_CHECKING:
    import pyarrow as pa


class FilesOutput:
    """One task attempt's files: written from its rows, referenced in its transaction."""

    def __init__(
        self,
        options: SinkOptions,
        plan: FilePlan,
        txn: Transaction,
        batch_id: int,
        partition: int,
        attempt: int,
    ) -> None:
        """Start the attempt's files (nothing is uploaded before the first file is finished).

        Raises:
            ValueError: files mode is off in `options` (no option `path`).
            ConfigError: option `path` is not a path or an `s3://` location.
        """
        if options.files is None:
            raise ValueError("files mode is off: option path is not set")
        self._files_options: FilesOptions = options.files
        self._sink_id = options.sink_id
        self._txn = txn
        self._batch_id = batch_id
        self._sink = open_file_sink(options.files.path, options.s3)
        self._files = FileSet(plan, self._sink, FileNaming(batch_id, partition, attempt))
        self._plan = plan
        self._arrow: RowsToArrow | None = None  # made by the first add_rows (the row writer)

    def add_rows(self, rows: Sequence[Any]) -> None:
        """Write rows (tuples in the order of the plan's schema), in order: as one Arrow batch
        through the native encoder where it can (files/rows_arrow.py), else one by one.

        Raises:
            InputError: a row cannot be written; the message names the column and row.
            StagingError: a finished file could not be uploaded.
        """
        if self._arrow is None and self._plan.payload_column is None:
            self._arrow = RowsToArrow(self._plan.schema)
        batch = self._arrow.batch(rows) if self._arrow and self._arrow.usable else None
        try:
            if batch is not None and self._files.add_native(batch):
                return
        except InputError:
            pass  # nothing was written: the rows below name the row at fault
        for row in rows:
            self._files.add(row)

    def add_batch(self, batch: pa.RecordBatch) -> None:
        """Write every row of one Arrow record batch (`FileSet.add_batch`).

        Raises:
            InputError: a row cannot be written; the message names the column and row.
            StagingError: a finished file could not be uploaded.
        """
        self._files.add_batch(batch)

    def close(self) -> tuple[FileRef, ...]:
        """Finish and upload every file, produce one reference per file into the transaction;
        the files, in write order.

        Raises:
            StagingError: a file could not be finished, uploaded, or its schema stored.
            KafkaTxnSinkError: a reference could not be produced.
        """
        written = self._files.close()
        files = self._files_options
        for item in written:
            ref = reference(
                item,
                sink=self._sink,
                sink_id=self._sink_id,
                batch_id=self._batch_id,
                codec=files.codec,
                inline_max_bytes=files.schema_inline_max_bytes,
            )
            self._txn.send(files.references_topic, value=ref.value, key=ref.key)
        return tuple(w.ref for w in written)

    def abort(self) -> None:
        """Drop open files and the local spool; uploaded files stay (vacuum removes them)."""
        self._files.abort()
