"""The Avro files one Spark task attempt writes in files mode (executor side).

A `FileSet` writes by the driver's `plan.FilePlan`: it routes each row to the open file of its
partition directory, rolls files at a record or byte limit, and keeps at most `max_open_files`
open, closing the least recently used one when a new directory needs a file (a later row of
that directory starts another file). So memory and file handles stay bounded however many
distinct keys (`user`) a task sees; the price is more, smaller files when rows of many keys
interleave. Spark refuses to sort a streaming DataFrame (`sortWithinPartitions` too), so a
larger `max_open_files`, or `repartition(n, <partition columns>)` giving each task fewer keys,
is the remedy.

Two modes:

- Spark schema: the record is the row minus its partition columns (as Spark's file sink writes
  them), in the schema of `spark_avro.spark_to_avro`, written block by block with fastavro.
  Arrow batches (`add_batch`) are split by directory with Arrow compute (`arrow_split`) and
  encoded natively (`arrow_avro`) whenever that encoding is exactly the schema's (`accepts`).
- Payload: the record is the JSON object in `payload_column`; each file's schema is aggregated
  from that file's payloads (`json_schema.SchemaAggregator`). The schema must be final before
  the header is written, so payloads are spooled to a local file (parsed, in `marshal` form)
  and the Avro file is written when its file closes; no file's rows are ever held in memory.

A finished file is uploaded at once and its local copy deleted. Byte limits count the written
Avro file (Spark schema: compressed blocks flushed so far) or the spooled payloads (payload
mode: the Avro file is not written yet); either may be exceeded by one block or one row. On the
Arrow path a directory's rows are cut into chunks sized from the file's mean record so far, so
a file ends within a few records of the byte limit.

Files are named by `naming.FileNaming`: unique per batch, Spark partition, attempt and file. The
sync marker derives from (batch, partition, seq), so rewriting the same rows gives the same
bytes.
"""

from __future__ import annotations

import contextlib
import json
import math
import shutil
import tempfile
from collections import OrderedDict
from collections.abc import Callable, Sequence
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from kafka_txn_sink.errors import InputError, StagingError
from kafka_txn_sink.files.avro_names import fingerprint
from kafka_txn_sink.files.json_schema import SchemaAggregator
from kafka_txn_sink.files.naming import FileNaming, stored_name
from kafka_txn_sink.files.open_file import FileSlot, OpenFile, open_file, parse_payload
from kafka_txn_sink.files.partitioning import PartitionValues
from kafka_txn_sink.files.plan import FilePlan
from kafka_txn_sink.files.references import WrittenFile
from kafka_txn_sink.files.spark_avro import row_converter
from kafka_txn_sink.files.spark_rows import RowsOfBatch, arrow_rows
from kafka_txn_sink.protocol.messages import FileRef
from kafka_txn_sink.storage.files import FileSink

if TYPE_CHECKING:
    from kafka_txn_sink.files.arrow_avro import NativeEncoder


class FileSet:
    """The files of one Spark task attempt: `add` every row, then `close` (or `abort`).

    Rows are pyspark Rows (or tuples) in the order of the plan's schema.
    """

    def __init__(
        self,
        plan: FilePlan,
        sink: FileSink,
        naming: FileNaming,
        spool_dir: str | Path | None = None,
    ) -> None:
        self._plan = plan
        self._sink = sink
        self._naming = naming
        self._values = plan.spec.extractor(plan.schema)
        self._item = self._payload_reader() if plan.payload_column else self._record_builder()
        # Spark-schema mode: one schema for every file, fingerprinted once.
        self._spark: tuple[dict[str, Any], str] | None = None
        if plan.payload_column is None:
            schema = plan.avro_schema()
            self._spark = (schema, fingerprint(schema))
        self._encoders: dict[pa.Schema, NativeEncoder | None] = {}
        self._rows_of_batch: RowsOfBatch | None = None
        self._open: OrderedDict[PartitionValues, OpenFile] = OrderedDict()
        self._written: list[WrittenFile] = []
        self._schemas: dict[str, tuple[dict[str, Any], str]] = {}
        self._seq = 0
        self._spool = Path(tempfile.mkdtemp(prefix="kafka-txn-sink-files-", dir=spool_dir))
        self._closed = False
        self.rows = 0
        self.native_rows = 0  # of `rows`, those encoded natively (the rest went row by row)
        self.peak_open_files = 0

    def __enter__(self) -> FileSet:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.abort()

    @property
    def open_files(self) -> int:
        """How many files are open now (at most the plan's `max_open_files`)."""
        return len(self._open)

    def add(self, row: Sequence[Any]) -> None:
        """Write one row into the file of its partition directory.

        Raises:
            InputError: the row cannot be written (message names the column and row).
            StagingError: a finished file could not be uploaded.
        """
        if self._closed:
            raise StagingError("this FileSet is closed")
        try:
            item = self._item(row)
            values = self._values(row)
        except InputError as exc:
            raise self._row_error(exc) from None
        out = self._file_for(values, native=False)
        try:
            out.write(item)
        except InputError as exc:
            raise self._row_error(exc) from None
        self.rows += 1
        self._roll_if_full(out)

    def accepts(self, schema: pa.Schema) -> bool:
        """True when Arrow batches of `schema` are encoded natively (`add_batch`); otherwise
        their rows go through `add` (types the native encoder would write otherwise than the
        schema says; in payload mode, a payload column neither string nor binary)."""
        if self._plan.payload_column is not None:
            payloads = schema.field(self._plan.payload_column).type
            return pa.types.is_string(payloads) or pa.types.is_binary(payloads)
        if schema not in self._encoders:
            self._encoders[schema] = self._native_encoder(schema)
        return self._encoders[schema] is not None

    def add_batch(self, batch: pa.RecordBatch) -> None:
        """Write every row of an Arrow batch (columns as the plan's schema), each into the file
        of its partition directory, rolled as rows are: natively encoded where this set
        `accepts` the batch's schema, else row by row as PySpark's row writer sees them.

        Raises:
            InputError: a row cannot be written (a null time or a null where none may be).
            StagingError: a finished file could not be uploaded.
        """
        if self._closed:
            raise StagingError("this FileSet is closed")
        if self._plan.payload_column is not None:
            payloads = _spoolable(batch, self._plan.payload_column)
            if payloads is None:
                self._add_rows(batch)
                return
            for values, rows in self._split(batch):
                self._write_payloads(values, payloads if rows is None else payloads.take(rows))
            return
        if not self.add_native(batch):
            self._add_rows(batch)

    def add_native(self, batch: pa.RecordBatch) -> bool:
        """Write an Arrow batch (columns as the plan's schema) natively encoded, as `add_batch`
        does where it can; False, with nothing written, where it cannot (payload mode, a schema
        this set does not `accept`, a null the native encoder cannot place).

        Raises:
            InputError: a row cannot be written (a null time of a partition column).
            StagingError: a finished file could not be uploaded.
        """
        if self._closed:
            raise StagingError("this FileSet is closed")
        if self._plan.payload_column is not None or not self.accepts(batch.schema):
            return False
        encoder = self._encoders[batch.schema]
        data = encoder.prepare(batch.select(self._plan.data_indexes)) if encoder else None
        if encoder is None or data is None:
            return False
        for values, rows in self._split(batch):
            self._write_part(values, data if rows is None else data.take(rows), encoder)
        return True

    def close(self) -> list[WrittenFile]:
        """Finish and upload every open file; every file this task wrote, in write order."""
        if self._closed:
            return list(self._written)
        try:
            while self._open:
                _, out = self._open.popitem(last=False)
                self._finish(out)
        except BaseException:
            self.abort()
            raise
        self._closed = True
        self._remove_spool()
        return list(self._written)

    def abort(self) -> None:
        """Drop open files and the local spool; uploaded files stay (vacuum removes them)."""
        if self._closed:
            return
        self._closed = True
        for out in self._open.values():
            with contextlib.suppress(OSError):
                out.discard()
        self._open.clear()
        self._remove_spool()

    # -- internals -------------------------------------------------------------------------

    def _row_error(self, exc: InputError) -> InputError:
        return InputError(f"row {self.rows} of task partition {self._naming.partition}: {exc}")

    def _batch_error(self, exc: InputError) -> InputError:
        return InputError(
            f"a batch of task partition {self._naming.partition} (after row {self.rows}): {exc}"
        )

    def _native_encoder(self, schema: pa.Schema) -> NativeEncoder | None:
        if self._spark is None:
            return None
        from kafka_txn_sink.files.arrow_avro import NativeEncoder

        if len(schema) != len(self._plan.schema.fields):
            return None
        data = [schema.field(i) for i in self._plan.data_indexes]
        return NativeEncoder.for_(
            pa.schema(data), self._plan.data_schema(), self._spark[0], self._plan.codec
        )

    def _add_rows(self, batch: pa.RecordBatch) -> None:
        """Every row of `batch` through `add`, as PySpark's row writer would give them, but
        timestamps as the instants Arrow holds (its local times would lose the repeated hour)."""
        if self._rows_of_batch is None:
            self._rows_of_batch = arrow_rows(self._plan.schema, instants=True)
        for row in self._rows_of_batch(batch):
            self.add(row)

    def _split(self, batch: pa.RecordBatch) -> list[tuple[PartitionValues, pa.Array | None]]:
        from kafka_txn_sink.files.arrow_split import split_batch

        try:
            return split_batch(batch, self._plan.spec)
        except InputError as exc:
            raise self._batch_error(exc) from None

    def _write_part(self, values: PartitionValues, part: pa.Table, encoder: NativeEncoder) -> None:
        """Rows of one directory, natively encoded into blocks."""

        def write(out: OpenFile, offset: int, count: int) -> None:
            for block in encoder.blocks(part.slice(offset, count)):
                out.write(block)
            self.native_rows += count

        self._write_native(values, part.num_rows, part.nbytes / part.num_rows, write)

    def _write_payloads(self, values: PartitionValues, payloads: pa.Array) -> None:
        """Payloads of one directory, spooled as text."""

        def write(out: OpenFile, offset: int, count: int) -> None:
            out.write(payloads.slice(offset, count))

        self._write_native(values, len(payloads), payloads.nbytes / len(payloads), write)

    def _write_native(
        self,
        values: PartitionValues,
        rows: int,
        mean: float,
        write: Callable[[OpenFile, int, int], None],
    ) -> None:
        """`rows` rows of one directory (`mean`: their mean Arrow size) to its native file, in
        slices that end where the file must roll; `write(out, offset, count)` writes a slice."""
        offset = 0
        while offset < rows:
            out = self._file_for(values, native=True)
            count = self._rows_to_fill(out, rows - offset, mean)
            write(out, offset, count)
            offset += count
            self.rows += count
            self._roll_if_full(out)

    def _rows_to_fill(self, out: OpenFile, left: int, mean: float) -> int:
        """How many of the `left` rows fill `out` to its record or byte limit (an estimate for
        bytes: the file's mean record so far, else `mean`, the rows' mean Arrow size)."""
        count = left
        limit = self._plan.max_records_per_file
        if limit:
            count = min(count, limit - out.records)
        per_record = out.bytes_per_record() or mean
        room = self._plan.max_bytes_per_file - out.size()
        return max(1, min(count, math.ceil(room / max(per_record, 1.0))))

    def _file_for(self, values: PartitionValues, native: bool) -> OpenFile:
        """The open file of `values` (most recently used now), started if there is none or
        if the one open is of the other path."""
        out = self._open.get(values)
        if out is not None and out.native != native:
            del self._open[values]
            self._finish(out)
            out = None
        if out is None:
            return self._start(values, native)
        self._open.move_to_end(values)
        return out

    def _roll_if_full(self, out: OpenFile) -> None:
        limit = self._plan.max_records_per_file
        if (limit and out.records >= limit) or out.size() >= self._plan.max_bytes_per_file:
            del self._open[out.values]
            self._finish(out)

    def _record_builder(self) -> Callable[[Sequence[Any]], Any]:
        convert = row_converter(self._plan.data_schema(), from_row_writer=True)
        indexes = self._plan.data_indexes
        if len(indexes) == len(self._plan.schema.fields):
            return convert
        return lambda row: convert([row[i] for i in indexes])

    def _payload_reader(self) -> Callable[[Sequence[Any]], Any]:
        column = self._plan.payload_column
        assert column is not None
        index = self._plan.schema.names.index(column)

        def read(row: Sequence[Any]) -> Any:
            text = row[index]
            if text is None:
                raise InputError(f"column {column} is null; every row needs a JSON object")
            return parse_payload(text, column)

        return read

    def _start(self, values: PartitionValues, native: bool = False) -> OpenFile:
        if len(self._open) >= self._plan.max_open_files:
            _, oldest = self._open.popitem(last=False)
            self._finish(oldest)
        seq = self._seq
        self._seq += 1
        name = self._naming.name(seq)
        local = self._spool / f"{seq:05d}.avro"
        path = self._plan.spec.path(values)
        marker = self._naming.sync_marker(seq)
        spark = self._spark[0] if self._spark is not None else None
        aggregator = (
            None
            if spark is not None
            else SchemaAggregator(irreconcilable=self._plan.irreconcilable)
        )
        try:
            out = open_file(
                FileSlot(seq, name, values, path, local),
                codec=self._plan.codec,
                marker=marker,
                native=native,
                spark_schema=spark,
                aggregator=aggregator,
                payload_column=self._plan.payload_column,
            )
        except OSError as exc:
            raise StagingError(f"cannot create a local file in {self._spool}: {exc}") from exc
        self._open[values] = out
        self.peak_open_files = max(self.peak_open_files, len(self._open))
        return out

    def _finish(self, out: OpenFile) -> None:
        try:
            schema, schema_fingerprint = self._shared(out.finish())
            size = out.local.stat().st_size
            if out.encoded_natively:
                self.native_rows += out.records
        except OSError as exc:
            raise StagingError(f"cannot write the local file {out.local}: {exc}") from exc
        name = stored_name(out.path, out.name)
        location = self._sink.upload(out.local, name)
        out.local.unlink(missing_ok=True)
        ref = FileRef(
            location=location,
            partition_path=out.path,
            partition_values=dict(out.values),
            records=out.records,
            bytes=size,
            schema_fingerprint=schema_fingerprint,
        )
        self._written.append(WrittenFile(ref, schema, name))

    def _shared(self, schema: dict[str, Any]) -> tuple[dict[str, Any], str]:
        """One object per distinct schema, with its fingerprint: a task may write thousands of
        files, and fastavro computes the Rabin fingerprint in Python (~1 ms)."""
        if self._spark is not None:
            return self._spark
        key = json.dumps(schema, sort_keys=True)
        found = self._schemas.get(key)
        if found is None:
            found = self._schemas[key] = (schema, fingerprint(schema))
        return found

    def _remove_spool(self) -> None:
        shutil.rmtree(self._spool, ignore_errors=True)


def _spoolable(batch: pa.RecordBatch, column: str) -> pa.Array | None:
    """The payloads of `batch` as binary, when every one can be spooled as one line of a JSON
    object: none null, none with a line break, each starting with `{` (after spaces). Else
    None: the batch goes row by row, which names the bad row or takes the line breaks."""
    payloads = batch.column(column)
    if payloads.null_count:
        return None
    try:
        text = payloads if pa.types.is_string(payloads.type) else payloads.cast(pa.string())
    except pa.ArrowInvalid:  # not UTF-8: the row path decides (json.loads reads UTF-16/32)
        return None
    binary = text.view(pa.binary())
    first = binary.offset
    offsets = np.frombuffer(binary.buffers()[1], np.int32)[first : first + len(binary) + 1]
    data = np.frombuffer(binary.buffers()[2], np.uint8)
    if offsets[-1] > offsets[0] and (data[offsets[0] : offsets[-1]] == ord("\n")).any():
        return None
    starts = offsets[:-1]
    if (offsets[1:] > starts).all() and (data[starts] == ord("{")).all():
        return binary
    if pc.all(pc.starts_with(pc.utf8_ltrim_whitespace(text), "{")).as_py():
        return binary  # some begin with spaces
    return None
