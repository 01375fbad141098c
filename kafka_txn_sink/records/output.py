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

from kafka_txn_sink.errors import InputError
from kafka_txn_sink.protocol.messages import FileRef
from kafka_txn_sink.protocol.output import Transaction
from kafka_txn_sink.records.arrow import RecordColumns, record_columns, send_batch
from kafka_txn_sink.records.columns import (
    Columns,
    Routing,
    as_bytes,
    as_headers,
    bytes_cells,
    checked_timestamp,
)
from kafka_txn_sink.records.dead_letter import ROW_REASONS, DeadLetters
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
        dead_letters: DeadLetters | None = None,
    ):
        """`default_topic` is option topic; no row may go to `reserved_topic` (files mode's
        references topic); `encodings`: the key's and value's registry formats, if any;
        `provenance`: the task's, for option provenanceHeaders; `dead_letters`: where rows the
        sink cannot write go (option badRows=deadLetter; records/dead_letter.py)."""
        self._txn = DigestingTransaction(txn)
        self._columns = columns
        self._encoders = Encoders(encodings)
        self._routing = Routing(default_topic, reserved_topic)
        self._provenance = provenance
        self._dead_letters = dead_letters
        self.set_aside = 0  # rows written to the dead-letter topic
        bulk = columns.simple and provenance is None
        self._bulk_topic = default_topic if bulk else None
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
            self._send_one_by_one(rows)
            return
        if not rows:
            return
        columns = list(zip(*rows, strict=True))  # transposed in C
        cols = self._columns
        try:
            values = self._cells(columns[cols.value], "value")
            keys = None if cols.key is None else self._cells(columns[cols.key], "key")
            if self._dead_letters is not None:
                self._dead_letters.judge_all(self._bulk_topic, keys, values)
        except InputError as exc:
            if self._dead_letters is None or exc.reason not in ROW_REASONS:
                raise
            self._send_one_by_one(rows)  # nothing of the group was produced yet
            return
        self._txn.send_many(self._bulk_topic, values, keys)
        self._rows += len(rows)

    def _send_one_by_one(self, rows: Sequence[Any]) -> None:
        """Produce each row alone; with dead letters, a row that cannot be written goes to the
        dead-letter topic instead."""
        for position, row in enumerate(rows, self._rows):
            if self._dead_letters is None:
                self._send_row(row, position)
                continue
            try:
                self._send_row(row, position)
            except InputError as exc:
                if exc.reason not in ROW_REASONS:
                    raise
                cols = self._columns
                key = row[cols.key] if cols.key is not None else None
                self._set_aside(key, row[cols.value], exc, position)
        self._rows += len(rows)

    def _set_aside(self, key: Any, value: Any, fault: InputError, position: int) -> None:
        """Write the row number `position`, whose cells are `key` and `value`, to the
        dead-letter topic."""
        assert self._dead_letters is not None
        dead_key, dead_value, headers, where = self._dead_letters.record(
            key, value, fault, position
        )
        self._txn.send(
            self._dead_letters.topic, dead_value, dead_key, headers=headers, undigested=where
        )
        self.set_aside += 1

    def add_batch(self, batch: pa.RecordBatch) -> None:
        """Produce every row of an Arrow batch, column by column (see records/arrow.py).

        Raises:
            InputError: a column has a type the sink cannot write, or a row has no topic.
        """
        if self._dead_letters is not None:
            self._add_batch_setting_aside(batch)
            return
        records = record_columns(batch, self._columns, self._encoders, self._rows)
        send_batch(self._txn, records, self._routing, self._rows, self._provenance)
        self._rows += batch.num_rows

    def _add_batch_setting_aside(self, batch: pa.RecordBatch) -> None:
        """`add_batch` with dead letters: the whole batch at once when no row is at fault, else
        row by row, each faulty row to the dead-letter topic."""
        assert self._dead_letters is not None
        try:
            records = record_columns(batch, self._columns, self._encoders, self._rows)
            if records.simple and self._routing.default_topic is not None:
                self._dead_letters.judge_all(
                    self._routing.default_topic, records.keys, records.values
                )
        except InputError as exc:
            if exc.reason not in ROW_REASONS:
                raise
        else:
            if records.simple and self._routing.default_topic is not None:
                send_batch(self._txn, records, self._routing, self._rows, self._provenance)
                self._rows += batch.num_rows
                return
        cols = self._columns
        for index in range(batch.num_rows):
            position = self._rows + index
            row = batch.slice(index, 1)
            try:
                one = record_columns(row, cols, self._encoders, position)
                self._judge(one, position)
                send_batch(self._txn, one, self._routing, position, self._provenance)
            except InputError as exc:
                if exc.reason not in ROW_REASONS:
                    raise
                key = row.column(cols.key).to_pylist()[0] if cols.key is not None else None
                self._set_aside(key, row.column(cols.value).to_pylist()[0], exc, position)
        self._rows += batch.num_rows

    def _judge(self, one: RecordColumns, position: int) -> None:
        """Refuse the one record of `one` for what its topic would refuse: a topic that does
        not exist, a partition it lacks, a size it does not take."""
        assert self._dead_letters is not None
        key = one.keys[0] if one.keys is not None else None
        cell = one.topics[0] if one.topics is not None else None
        topic = self._routing.topic_of(cell, position, key)
        partition = one.partitions[0] if one.partitions is not None else None
        self._check_partition(topic, partition)
        headers = one.headers[0] if one.headers is not None else None
        self._dead_letters.judge(topic, key, one.values[0], headers)

    def _check_partition(self, topic: str, partition: int | None) -> None:
        """Raises InputError (reason `topic` or `partition`) unless `topic` exists and has
        `partition` (when given)."""
        count = self._txn.partition_count(topic)
        if partition is not None and not 0 <= partition < count:
            raise InputError(
                f"column partition holds {partition}, but topic {topic!r} has partitions 0 to "
                f"{count - 1}",
                reason="partition",
            )

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
        value = self._cells([row[cols.value]], "value", position)[0]
        partition = row[cols.partition] if cols.partition is not None else None
        timestamp_ms = self._timestamp_ms(row)
        if self._dead_letters is not None:  # what the brokers would refuse, judged before
            self._check_partition(topic, partition)
            self._dead_letters.judge(topic, key, value, headers)
        self._txn.send(
            topic,
            value=value,
            key=key,
            partition=partition,
            headers=headers,
            timestamp_ms=timestamp_ms,
            undigested=self._provenance.headers(position) if self._provenance else None,
        )

    def _timestamp_ms(self, row: Any) -> int | None:
        """The row's `timestamp` cell in ms since the epoch (None: the producer's clock)."""
        position = self._columns.timestamp
        if self._instant is None or position is None or row[position] is None:
            return None
        return checked_timestamp((self._instant(row[position]) - EPOCH) // MILLISECOND)
