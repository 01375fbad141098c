"""The open Avro files of a task's `FileSet` (files/writer.py): one per partition directory.

- `_RecordFile`: rows of the Spark schema, one record at a time (fastavro's writer);
- `_BlockFile`: rows of the Spark schema, whole Avro blocks encoded natively (`arrow_avro`);
- `_PayloadFile`: JSON payloads spooled to a local file, the schema aggregated from them, and
  the Avro file written when the file closes;
- `_NativePayloadFile`: the same, spooled as Arrow chunks and encoded natively when it can be.

Each writes to a local file that the `FileSet` uploads when it finishes.
"""

from __future__ import annotations

import io
import json
import marshal
from abc import ABC, abstractmethod
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, cast

import pyarrow as pa
import pyarrow.compute as pc
from fastavro.write import Writer

from kafka_txn_sink.errors import InputError
from kafka_txn_sink.files.json_schema import SchemaAggregator
from kafka_txn_sink.files.partitioning import PartitionValues
from kafka_txn_sink.files.payload_spool import CHUNK_BYTES, Chunk
from kafka_txn_sink.files.plan import Codec


@dataclass(frozen=True)
class FileSlot:
    """Which file it is: its sequence number in the task, its name, its partition directory's
    values and path, and the local file it is written to."""

    seq: int
    name: str
    values: PartitionValues
    path: str
    local: Path


class OpenFile(ABC):
    """One file being written; `write` takes what the mode produced for one row (or, on the
    Arrow path, `native` files: what it produced for a part of a batch)."""

    native = False

    def __init__(self, slot: FileSlot):
        self.seq = slot.seq
        self.name = slot.name
        self.values = slot.values
        self.path = slot.path
        self.local = slot.local  # the Avro file, once finished
        self.records = 0
        self.encoded_natively = False  # its records went through the native encoder

    @abstractmethod
    def write(self, item: Any) -> None:
        """Add what the mode made of one row (native files: of a part of a batch)."""

    @abstractmethod
    def size(self) -> int:
        """The bytes the file holds so far, as its byte limit counts them."""

    def bytes_per_record(self) -> float | None:
        """The mean size of a record written so far, where a file knows it (native files,
        which roll by it)."""
        return None

    @abstractmethod
    def finish(self) -> dict[str, Any]:
        """Complete the local Avro file; returns its schema."""

    @abstractmethod
    def discard(self) -> None:
        """Close without completing (the spool directory is removed anyway)."""


_SYNC_SIZE = 16  # bytes of an Avro sync marker, which ends a file's header


def avro_header(schema: dict[str, Any], codec: Codec, marker: bytes) -> bytes:
    """The header fastavro writes for `schema`, `codec` and sync marker `marker`."""
    out = io.BytesIO()
    Writer(out, schema, codec=codec, sync_marker=marker)
    return out.getvalue()


class _CountingFile:
    """A binary file that counts what is written to it: the size without a tell() syscall."""

    def __init__(self, raw: IO[bytes]) -> None:
        self.raw = raw
        self.written = 0

    def write(self, data: bytes) -> int:
        self.written += len(data)
        return self.raw.write(data)

    def flush(self) -> None:
        self.raw.flush()

    def seekable(self) -> bool:
        return False  # fastavro would otherwise try to append to what it finds


class _RecordFile(OpenFile):
    """Spark-schema mode: records go straight into the Avro file, block by block."""

    def __init__(
        self,
        slot: FileSlot,
        schema: dict[str, Any],
        codec: Codec,
        marker: bytes,
    ):
        super().__init__(slot)
        self._schema = schema
        self._out = _CountingFile(open(slot.local, "wb"))  # noqa: SIM115 - closed in finish/discard
        # The schema as it is, not fastavro's parsed form: the header must hold the very schema
        # the reference carries (a parsed one is written with full names, no namespace).
        self._writer = Writer(cast(IO[bytes], self._out), schema, codec=codec, sync_marker=marker)

    def write(self, item: Any) -> None:
        self._writer.write(item)
        self.records += 1

    def size(self) -> int:
        return self._out.written

    def finish(self) -> dict[str, Any]:
        self._writer.flush()
        self._out.raw.close()
        return self._schema

    def discard(self) -> None:
        self._out.raw.close()


class _BlockFile(OpenFile):
    """Spark-schema mode on the Arrow path: natively encoded blocks behind the file's header."""

    native = True

    def __init__(
        self,
        slot: FileSlot,
        schema: dict[str, Any],
        header: bytes,
    ):
        super().__init__(slot)
        self._schema = schema
        self._marker = header[-_SYNC_SIZE:]
        self._out = open(slot.local, "wb")  # noqa: SIM115 - closed in finish/discard
        self._out.write(header)
        self._header_size = self._size = len(header)

    def write(self, item: Any) -> None:
        """Append one block, `(records, data)`."""
        from kafka_txn_sink.files.arrow_avro import block_bytes

        records, data = item
        block = block_bytes(records, data, self._marker)
        self._out.write(block)
        self._size += len(block)
        self.records += records

    def size(self) -> int:
        return self._size

    def bytes_per_record(self) -> float | None:
        """The mean size of a record in this file's blocks so far (None before the first)."""
        return (self._size - self._header_size) / self.records if self.records else None

    def finish(self) -> dict[str, Any]:
        self._out.close()
        return self._schema

    def discard(self) -> None:
        self._out.close()


class _PayloadFile(OpenFile):
    """Payload mode: payloads are aggregated and spooled; the Avro file is written at finish."""

    def __init__(self, slot: FileSlot, aggregator: SchemaAggregator, codec: Codec, marker: bytes):
        super().__init__(slot)
        self._aggregator = aggregator
        self._codec = codec
        self._marker = marker
        self._spool_path = slot.local.with_suffix(".spool")
        self._spool: IO[bytes] = open(self._spool_path, "w+b")  # noqa: SIM115 - closed in finish

    def write(self, item: Any) -> None:
        self._aggregator.add(item)
        # Length-prefixed: marshal.load straight from a file reads in tiny pieces (slow).
        data = marshal.dumps(item)
        self._spool.write(len(data).to_bytes(4, "little"))
        self._spool.write(data)
        self.records += 1

    def size(self) -> int:
        return self._spool.tell()

    def finish(self) -> dict[str, Any]:
        self._spool.seek(0)
        read = self._spool.read
        sizes = (int.from_bytes(read(4), "little") for _ in range(self.records))
        schema = self._write_records(marshal.loads(read(size)) for size in sizes)
        self.discard()
        return schema

    def discard(self) -> None:
        self._spool.close()
        self._spool_path.unlink(missing_ok=True)

    def _write_records(self, payloads: Iterable[Any]) -> dict[str, Any]:
        """Write the Avro file of payloads already added to the aggregator, with fastavro; its
        schema."""
        schema = self._aggregator.schema()
        with open(self.local, "wb") as out:
            writer = Writer(out, schema, codec=self._codec, sync_marker=self._marker)
            conform = self._aggregator.conform
            for payload in payloads:
                writer.write(conform(payload))
            writer.flush()
        return schema


class _NativePayloadFile(_PayloadFile):
    """Payload mode on the Arrow path: payloads spooled as text, one per line, and the file
    written at finish natively (`payload_arrow`) when Arrow's reading of them follows the rules,
    else by the row path from the same spool."""

    native = True

    def __init__(
        self,
        slot: FileSlot,
        aggregator: SchemaAggregator,
        codec: Codec,
        marker: bytes,
        column: str,
    ):
        super().__init__(slot, aggregator, codec, marker)
        self._column = column
        self._size = 0
        self._chunks: list[Chunk] = []
        self._chunk = Chunk(0, 0, 0)  # the chunk being spooled

    def write(self, item: Any) -> None:
        """Append the payloads of a part of a batch: a binary Arrow array, none with a line
        break."""
        payloads = cast(pa.Array, item)
        lines = pc.binary_join(pa.ListArray.from_arrays([0, len(payloads)], payloads), b"\n")
        data = lines[0].as_buffer()
        self._spool.write(data)
        self._spool.write(b"\n")
        self._size += data.size + 1
        self.records += len(payloads)
        self._chunk = Chunk(self._chunk.start, self._size, self._chunk.rows + len(payloads))
        if self._chunk.end - self._chunk.start >= CHUNK_BYTES:
            self._chunks.append(self._chunk)
            self._chunk = Chunk(self._size, self._size, 0)

    def size(self) -> int:
        return self._size

    def bytes_per_record(self) -> float | None:
        """The mean size of a spooled payload so far (None before the first)."""
        return self._size / self.records if self.records else None

    def finish(self) -> dict[str, Any]:
        self._spool.close()
        from kafka_txn_sink.files.payload_arrow import encode_file

        chunks = self._chunks + ([self._chunk] if self._chunk.rows else [])
        native = encode_file(self._spool_path, chunks, self._codec)
        if native is not None:
            try:
                self._write_blocks(native.schema, native.blocks)
                self.encoded_natively = True
                self.discard()
                return native.schema
            except ValueError:  # a chunk read otherwise the second time: the row path writes it
                pass
        for payload in self._parsed():  # the schema must be final before the header
            self._aggregator.add(payload)
        schema = self._write_records(self._parsed())
        self.discard()
        return schema

    def _write_blocks(self, schema: dict[str, Any], blocks: Iterable[tuple[int, bytes]]) -> None:
        from kafka_txn_sink.files.arrow_avro import block_bytes

        with open(self.local, "wb") as out:
            out.write(avro_header(schema, self._codec, self._marker))
            for records, data in blocks:
                out.write(block_bytes(records, data, self._marker))

    def _parsed(self) -> Iterator[Any]:
        """The spooled payloads, parsed (read again for each pass: none stays in memory)."""
        with open(self._spool_path, "rb") as spool:
            for number, line in enumerate(spool, start=1):
                yield self._parse(line, number)

    def _parse(self, line: bytes, number: int) -> Any:
        try:
            return parse_payload(line, self._column)
        except InputError as exc:
            where = f"payload {number} of the file for {self.path or 'the output directory'}"
            raise InputError(f"{exc} ({where})") from None


def parse_payload(text: str | bytes, column: str) -> dict[str, Any]:
    """One payload of `column`, parsed: a JSON object.

    Raises:
        InputError: it is not valid JSON, or not an object (the message names the column).
    """
    try:
        payload = json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise InputError(f"column {column} is not valid JSON: {exc}") from None
    if not isinstance(payload, dict):
        raise InputError(f"column {column} holds a JSON {type(payload).__name__}, not an object")
    return payload


def open_file(
    slot: FileSlot,
    *,
    codec: Codec,
    marker: bytes,
    native: bool,
    spark_schema: dict[str, Any] | None,
    aggregator: SchemaAggregator | None,
    payload_column: str | None,
) -> OpenFile:
    """The file of `slot`: of the Spark schema when `spark_schema` is given (whole blocks if
    `native`), else of JSON payloads (`aggregator`; spooled as Arrow chunks if `native`)."""
    if spark_schema is not None and native:
        header = avro_header(spark_schema, codec, marker)
        return _BlockFile(slot, spark_schema, header)
    if spark_schema is not None:
        return _RecordFile(slot, spark_schema, codec, marker)
    assert aggregator is not None
    if native:
        assert payload_column is not None
        return _NativePayloadFile(slot, aggregator, codec, marker, payload_column)
    return _PayloadFile(slot, aggregator, codec, marker)
