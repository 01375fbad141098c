"""Records mode as an output of the task: each input row becomes one Kafka record.

Rows come from the row writer (as tuples, a group at a time) or as Arrow record batches (the
Arrow writer, PySpark 4.1+); either way each record is produced into the task's transaction,
with the columns `value`, `key`, `topic`, `partition` and `headers` as Spark's own Kafka sink
reads them (option `topic` wins over the column; no row goes to files mode's references topic),
and with option provenanceHeaders the record's provenance (records/provenance.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta, timezone
from typing import Any

import pyarrow as pa

from kafka_txn_sink.protocol.messages import FileRef
from kafka_txn_sink.protocol.output import Transaction
from kafka_txn_sink.records.arrow import record_columns, send_batch
from kafka_txn_sink.records.columns import (
    Columns,
    Routing,
    as_bytes,
    as_headers,
    bytes_cells,
    checked_timestamp,
)
from kafka_txn_sink.records.digest import DigestingTransaction
from kafka_txn_sink.records.provenance import Provenance
from kafka_txn_sink.serde.encode import Encoders
from kafka_txn_sink.serde.resolve import Encodings
from kafka_txn_sink.serde.timestamps import instant_converter

EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)
MILLISECOND = timedelta(milliseconds=1)


class RecordsOutput:
    """One task's records, produced into its transaction (a `protocol.output.TaskOutput`)."""

    def __init__(
        self,
        txn: Transaction,
        columns: Columns,
        default_topic: str | None,
        reserved_topic: str | None = None,
        encodings: Encodings | None = None,
        provenance: Provenance | None = None,
    ):
        """`default_topic` is option topic; no row may go to `reserved_topic` (files mode's
        references topic); `encodings`: the key's and value's registry formats, if any;
        `provenance`: the task's, for option provenanceHeaders."""
        self._txn = DigestingTransaction(txn)
        self._columns = columns
        self._encoders = Encoders(encodings)
        self._routing = Routing(default_topic, reserved_topic)
        self._provenance = provenance
        self._bulk_topic = default_topic if columns.simple and provenance is None else None
        stamped = columns.timestamp is not None
        self._instant = instant_converter(from_row_writer=True) if stamped else None
        self._rows = 0  # rows taken so far: a failing row's position in the task's input

    def add_rows(self, rows: Sequence[Any]) -> None:
        """Produce each row as one record, in order: rows with only a key and a value all at
        once through `send_many`, other rows one by one.

        Raises:
            InputError: a column holds what a record cannot carry, or a row has no topic.
        """
        if self._bulk_topic is None:
            for position, row in enumerate(rows, self._rows):
                self._send_row(row, position)
            self._rows += len(rows)
            return
        if not rows:
            return
        columns = list(zip(*rows, strict=True))  # transposed in C
        cols = self._columns
        values = self._cells(columns[cols.value], "value")
        keys = None if cols.key is None else self._cells(columns[cols.key], "key")
        self._txn.send_many(self._bulk_topic, values, keys)
        self._rows += len(rows)

    def add_batch(self, batch: pa.RecordBatch) -> None:
        """Produce every row of an Arrow batch, column by column (see records/arrow.py).

        Raises:
            InputError: a column has a type the sink cannot write, or a row has no topic.
        """
        records = record_columns(batch, self._columns, self._encoders, self._rows)
        send_batch(self._txn, records, self._routing, self._rows, self._provenance)
        self._rows += batch.num_rows

    def close(self) -> tuple[FileRef, ...]:
        """Nothing is held back; no files."""
        return ()

    def digest(self) -> str:
        """The digest of every record produced so far (records/digest.py)."""
        return self._txn.digest()

    def abort(self) -> None:
        """Nothing is held back: the task aborts the transaction itself."""

    def _cells(
        self, cells: Sequence[Any], column: str, first_row: int | None = None
    ) -> Sequence[bytes | None]:
        """A column's cells as bytes: encoded in its registry format, or as given."""
        encoder = self._encoders.key if column == "key" else self._encoders.value
        if encoder is None:
            return bytes_cells(cells, column)
        return encoder.cells(cells, self._rows if first_row is None else first_row)

    def _send_row(self, row: Any, position: int) -> None:
        cols = self._columns
        key = self._cells([row[cols.key]], "key", position)[0] if cols.key is not None else None
        topic = self._routing.topic_of(
            row[cols.topic] if cols.topic is not None else None, position, key
        )
        headers = as_headers(row[cols.headers]) if cols.headers is not None else None
        if cols.header_columns:
            named = [(n, as_bytes(row[i], n)) for n, i in cols.header_columns]
            headers = [*(headers or []), *named]
        self._txn.send(
            topic,
            value=self._cells([row[cols.value]], "value", position)[0],
            key=key,
            partition=row[cols.partition] if cols.partition is not None else None,
            headers=headers,
            timestamp_ms=self._timestamp_ms(row),
            undigested=self._provenance.headers(position) if self._provenance else None,
        )

    def _timestamp_ms(self, row: Any) -> int | None:
        """The row's `timestamp` cell in ms since the epoch (None: the producer's clock)."""
        position = self._columns.timestamp
        if self._instant is None or position is None or row[position] is None:
            return None
        return checked_timestamp((self._instant(row[position]) - EPOCH) // MILLISECOND)
