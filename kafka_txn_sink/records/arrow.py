"""Records mode on the Arrow write path: records taken from whole columns (PySpark 4.1+).

For a row writer PySpark turns each Arrow batch into one `Row` per row first (a Python call per
cell, then one per row: about 2 us a row, measured). The Arrow writer skips that, and here the
used columns of each batch are converted in one `to_pylist()` call each, in C; string columns are
reinterpreted as binary (`Array.view`, no copy, no decoding). What remains is one Python `bytes`
per key and per value, which confluent-kafka's `produce()` takes: records with only keys and
values go to `send_many`, which partitions the whole batch at once and collects delivery reports
without a Python call per record (kafka/producer.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import pyarrow as pa

from kafka_txn_sink.errors import InputError
from kafka_txn_sink.records.columns import Columns, Routing, checked_timestamp, encoding_reason
from kafka_txn_sink.records.digest import DigestingTransaction
from kafka_txn_sink.records.provenance import Provenance
from kafka_txn_sink.serde.encode import Encoders

Headers = list[tuple[str, bytes | None]]


@dataclass(frozen=True)
class RecordColumns:
    """One batch's records, column by column (None: the column is absent)."""

    values: list[bytes | None]
    keys: list[bytes | None] | None
    topics: list[str | None] | None
    partitions: list[int | None] | None
    headers: list[Headers | None] | None
    timestamps: list[int | None] | None = None  # ms since the epoch

    def __len__(self) -> int:
        return len(self.values)

    @property
    def simple(self) -> bool:
        """Only keys and values: every record goes to the default topic, partitioner's choice."""
        return (
            self.topics is None
            and self.partitions is None
            and self.headers is None
            and self.timestamps is None
        )


def record_columns(
    batch: pa.RecordBatch, columns: Columns, encoders: Encoders | None = None, first_row: int = 0
) -> RecordColumns:
    """The used columns of `batch` (positions as in `columns`) as Python lists; the key and
    value through their `encoders` when they have a registry format (the batch's first row is
    row `first_row` of the task).

    Raises:
        InputError: a column has a type the sink cannot write, or a cell does not fit its
            schema.
    """
    encoders = encoders or Encoders()
    value = batch.column(columns.value)
    key = batch.column(columns.key) if columns.key is not None else None
    return RecordColumns(
        values=(
            encoders.value.array(value, first_row) if encoders.value else bytes_list(value, "value")
        ),
        keys=(
            None
            if key is None
            else encoders.key.array(key, first_row)
            if encoders.key
            else bytes_list(key, "key")
        ),
        topics=_topics(batch.column(columns.topic)) if columns.topic is not None else None,
        partitions=(
            _partitions(batch.column(columns.partition)) if columns.partition is not None else None
        ),
        headers=_all_headers(batch, columns),
        timestamps=(
            _timestamps(batch.column(columns.timestamp)) if columns.timestamp is not None else None
        ),
    )


def bytes_list(array: pa.Array, column: str) -> list[bytes | None]:
    """A binary or string column as `bytes` (None for null), without decoding strings."""
    kind = array.type
    if pa.types.is_string(kind):
        array = array.view(pa.binary())
    elif pa.types.is_large_string(kind):
        array = array.view(pa.large_binary())
    elif not (pa.types.is_binary(kind) or pa.types.is_large_binary(kind)):
        raise InputError(
            f"column {column} holds {kind}, not string or binary", reason=encoding_reason(column)
        )
    values: list[bytes | None] = array.to_pylist()
    return values


def send_batch(
    txn: DigestingTransaction,
    records: RecordColumns,
    routing: Routing,
    first_row: int = 0,
    provenance: Provenance | None = None,
) -> None:
    """Produce every record of one batch in the task's transaction `txn`, each to the topic
    `routing` gives it; the batch's first row is row `first_row` of the task. With
    `provenance`, each record gets its provenance headers (records/provenance.py).

    Raises:
        InputError: a record has no topic (null `topic` column and no `topic` option), or its
            `topic` column names the references topic.
    """
    if records.simple and routing.default_topic is not None and provenance is None:
        txn.send_many(routing.default_topic, records.values, records.keys)
        return
    for index, value in enumerate(records.values):
        key = records.keys[index] if records.keys is not None else None
        cell = records.topics[index] if records.topics is not None else None
        txn.send(
            routing.topic_of(cell, first_row + index, key),
            value=value,
            key=key,
            partition=records.partitions[index] if records.partitions is not None else None,
            headers=records.headers[index] if records.headers is not None else None,
            timestamp_ms=records.timestamps[index] if records.timestamps is not None else None,
            undigested=provenance.headers(first_row + index) if provenance is not None else None,
        )


def _topics(array: pa.Array) -> list[str | None]:
    if not (pa.types.is_string(array.type) or pa.types.is_large_string(array.type)):
        raise InputError(f"column topic holds {array.type}, not string")
    topics: list[str | None] = array.to_pylist()
    return topics


def _partitions(array: pa.Array) -> list[int | None]:
    if not pa.types.is_integer(array.type):
        raise InputError(f"column partition holds {array.type}, not int")
    partitions: list[int | None] = array.to_pylist()
    return partitions


def _timestamps(array: pa.Array) -> list[int | None]:
    """A timestamp column (an instant: Spark hands it with its session's zone) in ms since the
    epoch, truncated towards the past as Kafka's record timestamps are ms."""
    kind = array.type
    if not pa.types.is_timestamp(kind):
        raise InputError(f"column timestamp holds {kind}, not timestamp")
    per_ms = {"s": None, "ms": 1, "us": 1_000, "ns": 1_000_000}[kind.unit]
    counts: list[int | None] = array.cast(pa.int64()).to_pylist()
    if per_ms is None:
        millis = [None if c is None else c * 1000 for c in counts]
    else:
        millis = [None if c is None else c // per_ms for c in counts]
    earliest = min((m for m in millis if m is not None), default=1)
    checked_timestamp(earliest)
    return millis


def _all_headers(batch: pa.RecordBatch, columns: Columns) -> list[Headers | None] | None:
    """Each record's headers: the `headers` column's, then one per column of option
    headerColumns, named as the option names it (None: no header at all)."""
    given = _headers(batch.column(columns.headers)) if columns.headers is not None else None
    if not columns.header_columns:
        return given
    named = [(name, bytes_list(batch.column(i), name)) for name, i in columns.header_columns]
    rows = range(batch.num_rows)
    return [
        [*((given[row] or []) if given is not None else []), *((n, c[row]) for n, c in named)]
        for row in rows
    ]


def _headers(array: pa.Array) -> list[Headers | None]:
    result: list[Headers | None] = []
    for items in array.to_pylist():
        if not items:
            result.append(None)
            continue
        headers: Headers = []
        for item in items:
            key = item.get("key") if item is not None else None
            if key is None:
                raise InputError("column headers holds a header without a key", reason="header")
            value = item.get("value")
            headers.append((key, value.encode() if isinstance(value, str) else value))
        result.append(headers)
    return result
