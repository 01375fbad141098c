"""Records mode as an output of the task: each input row becomes one Kafka record.

Rows come as Spark `Row`s (the row writer) or as Arrow record batches (the Arrow writer,
PySpark 4.1+); either way each record is produced into the task's transaction, with the
columns `value`, `key`, `topic`, `partition` and `headers` as Spark's own Kafka sink reads them.
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa

from kafka_txn_sink.errors import InputError
from kafka_txn_sink.protocol.messages import FileRef
from kafka_txn_sink.protocol.output import Transaction
from kafka_txn_sink.records.arrow import record_columns, send_batch
from kafka_txn_sink.records.columns import Columns, as_bytes, as_headers

# Rows with only a key and a value are produced this many at a time through `send_many` (one
# delivery report callback per partition, not per record); the first row of a task goes alone,
# so that a record is in the transaction as soon as the first row is taken.
ROW_BATCH = 4096


class RecordsOutput:
    """One task's records, produced into its transaction (a `protocol.output.TaskOutput`)."""

    def __init__(self, txn: Transaction, columns: Columns, default_topic: str | None):
        self._txn = txn
        self._columns = columns
        self._default_topic = default_topic
        simple = columns.topic is None and columns.partition is None and columns.headers is None
        self._batched = simple and default_topic is not None
        self._values: list[bytes | None] = []
        self._keys: list[bytes | None] = []
        self._rows = 0

    def add_row(self, row: Any) -> None:
        """Produce one row as one record (rows with only a key and a value in groups of
        `ROW_BATCH`; `close` produces the rest).

        Raises:
            InputError: a column holds what a record cannot carry, or the row has no topic.
        """
        cols = self._columns
        self._rows += 1
        if self._batched and self._rows > 1:
            self._values.append(as_bytes(row[cols.value], "value"))
            if cols.key is not None:
                self._keys.append(as_bytes(row[cols.key], "key"))
            if len(self._values) >= ROW_BATCH:
                self._send_rows()
            return
        topic = (row[cols.topic] if cols.topic is not None else None) or self._default_topic
        if topic is None:
            raise InputError("column topic is null and there is no topic option")
        self._txn.send(
            topic,
            value=as_bytes(row[cols.value], "value"),
            key=as_bytes(row[cols.key], "key") if cols.key is not None else None,
            partition=row[cols.partition] if cols.partition is not None else None,
            headers=as_headers(row[cols.headers]) if cols.headers is not None else None,
        )

    def add_batch(self, batch: pa.RecordBatch) -> None:
        """Produce every row of an Arrow batch, column by column (see records/arrow.py).

        Raises:
            InputError: a column has a type the sink cannot write, or a row has no topic.
        """
        send_batch(self._txn, record_columns(batch, self._columns), self._default_topic)

    def close(self) -> tuple[FileRef, ...]:
        """Produce the rows still held; no files."""
        self._send_rows()
        return ()

    def abort(self) -> None:
        """Drop the rows still held: the task aborts the transaction itself."""
        self._values, self._keys = [], []

    def _send_rows(self) -> None:
        if self._values:
            assert self._default_topic is not None
            keys = self._keys if self._columns.key is not None else None
            self._txn.send_many(self._default_topic, self._values, keys)
            self._values, self._keys = [], []
