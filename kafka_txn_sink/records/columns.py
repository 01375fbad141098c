"""The input columns of records mode, as Spark's own Kafka sink reads them, and two more.

`value` (string or binary, required), `key` (string or binary), `topic` (string), `partition`
(int) and `headers` (array<struct<key: string, value: binary>>) are used as Spark's sink uses
them; other columns are ignored, as Spark's sink does. Option `topic` wins over a `topic`
column, as in Spark's sink (its KafkaWriter.topicExpression): with the option, the column is not
read at all. Beyond Spark's sink: a `timestamp` column of type timestamp sets each record's
timestamp (null: the producer's clock; a column of another type is ignored, as before), and the
columns option `headerColumns` names (string or binary) become headers of their names, after
the `headers` column's.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Any

from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    DataType,
    IntegerType,
    StringType,
    StructType,
    TimestampType,
)

from kafka_txn_sink.errors import ConfigError, InputError

_BYTES_TYPES = (BinaryType, StringType)
_BYTES_OR_NONE = {bytes, type(None)}


@dataclass(frozen=True)
class Columns:
    """Positions of the used columns in the input rows (None when absent)."""

    value: int
    key: int | None
    topic: int | None
    partition: int | None
    headers: int | None
    timestamp: int | None = None
    header_columns: tuple[tuple[str, int], ...] = ()  # (header name, position), in option order

    @property
    def simple(self) -> bool:
        """Only a key and a value: rows can go to `send_many` (one topic, no record fields)."""
        return (
            self.topic is None
            and self.partition is None
            and self.headers is None
            and self.timestamp is None
            and not self.header_columns
        )


def plan_columns(
    schema: StructType,
    default_topic: str | None,
    encoded: Collection[str] = (),
    header_columns: Sequence[str] = (),
) -> Columns:
    """Check the input schema once, on the driver. With option topic (`default_topic`) a
    `topic` column is left unread, whatever its type: the option wins. The `encoded` columns
    (`key`, `value`) are written in a registry format (serde/), so they may have any type.
    `header_columns` are option headerColumns' names.

    Raises:
        InputError: a column has a type the sink cannot write, or a header column is missing.
        ConfigError: there is neither a `topic` option nor a `topic` column.
    """
    fields = {f.name.lower(): (i, f.dataType) for i, f in enumerate(schema.fields)}
    named = _header_columns(fields, header_columns)
    if "value" not in fields:
        raise InputError(
            f"column value is required; the input has "
            f"{', '.join(f.name for f in schema.fields) or 'no columns'}"
        )
    for column in ("key", "value"):
        if column not in encoded:
            _require(fields, column, _BYTES_TYPES, "string or binary")
    if default_topic is not None:
        fields.pop("topic", None)  # the option wins: the column is never read
    _require(fields, "topic", (StringType,), "string")
    _require(fields, "partition", (IntegerType,), "int")
    if "headers" in fields and not _is_headers(fields["headers"][1]):
        raise InputError(
            f"column headers must be array<struct<key: string, value: binary>>, "
            f"found {fields['headers'][1].simpleString()}"
        )
    if default_topic is None and "topic" not in fields:
        raise ConfigError("option topic is required when the input has no topic column")
    return Columns(
        value=fields["value"][0],
        key=_position(fields, "key"),
        topic=_position(fields, "topic"),
        partition=_position(fields, "partition"),
        headers=_position(fields, "headers"),
        timestamp=timestamp_column(schema),
        header_columns=named,
    )


def timestamp_column(schema: StructType) -> int | None:
    """The position of the column that sets the records' timestamps: `timestamp`, of type
    timestamp (a `timestamp` column of another type is ignored, as Spark's sink ignores it)."""
    for position, field in enumerate(schema.fields):
        if field.name.lower() == "timestamp" and isinstance(field.dataType, TimestampType):
            return position
    return None


def _header_columns(
    fields: dict[str, tuple[int, DataType]], names: Sequence[str]
) -> tuple[tuple[str, int], ...]:
    named = []
    for name in names:
        found = fields.get(name.lower())
        if found is None:
            raise InputError(
                f"option headerColumns names column {name}, which the input does not have "
                f"(it has {', '.join(sorted(fields)) or 'no columns'})"
            )
        if not isinstance(found[1], _BYTES_TYPES):
            raise InputError(
                f"column {name} of option headerColumns must be string or binary, found "
                f"{found[1].simpleString()}"
            )
        named.append((name, found[0]))
    return tuple(named)


@dataclass(frozen=True)
class Routing:
    """Where records mode sends a row: the `topic` option when set (the column is not read
    then), else the row's `topic` column; never to `reserved`, files mode's references topic,
    whose messages consumers take as committed file references."""

    default_topic: str | None
    reserved: str | None = None

    def topic_of(self, cell: str | None, row: int, key: bytes | None) -> str:
        """The topic of the `row`-th row of the task (counted from 0), whose `topic` cell is
        `cell` (None without the column).

        Raises:
            InputError: the row has no topic, or its column names the references topic.
        """
        if not cell:
            if self.default_topic is None:
                raise InputError(
                    "column topic is null and there is no topic option", reason="topic"
                )
            return self.default_topic
        if cell == self.reserved:
            shown = key if key is None or len(key) <= 40 else key[:40] + b"..."
            raise InputError(
                f"column topic of row {row} of this task (key {shown!r}) names topic {cell!r}, "
                f"the references topic of files mode (option referencesTopic): no row may be "
                f"written there; set option topic (which wins over the column) or change the "
                f"column",
                reason="topic",
            )
        return cell


def as_bytes(value: Any, column: str) -> bytes | None:
    """A key or value cell as bytes (None stays None).

    Raises:
        InputError: the cell is neither string nor binary.
    """
    if value is None or isinstance(value, bytes):
        return value
    if isinstance(value, str):
        return value.encode("utf-8")
    if isinstance(value, (bytearray, memoryview)):
        return bytes(value)
    raise InputError(
        f"column {column} holds a {type(value).__name__}, not string or binary",
        reason=encoding_reason(column),
    )


def bytes_cells(cells: Sequence[Any], column: str) -> Sequence[bytes | None]:
    """A column's cells as bytes (None stays None), converted in one C-level pass when they
    are all of one kind (PySpark's rows carry binary as bytearray); `as_bytes` otherwise.

    Raises:
        InputError: a cell is neither string nor binary.
    """
    kinds = set(map(type, cells))
    if kinds <= _BYTES_OR_NONE:
        return cells
    if kinds == {bytearray}:
        return list(map(bytes, cells))
    if kinds == {str}:
        return list(map(str.encode, cells))
    return [as_bytes(cell, column) for cell in cells]


def checked_timestamp(millis: int) -> int:
    """A `timestamp` cell in ms since the epoch, as a record's timestamp.

    Raises:
        InputError: it is not after the epoch: Kafka's record timestamps are positive (-1 means
            none, and librdkafka writes its own clock for 0).
    """
    if millis < 1:
        raise InputError(
            f"column timestamp holds {millis} ms since the epoch: a Kafka record's timestamp "
            f"must be after 1970-01-01T00:00:00Z (null takes the producer's clock)",
            reason="timestamp",
        )
    return millis


def encoding_reason(column: str) -> str:
    """The reason a cell of `column` that cannot be turned into bytes gives: the key's or the
    value's encoding, else a header's."""
    return {"key": "key_encoding", "value": "value_encoding"}.get(column, "header")


def as_headers(value: Any) -> list[tuple[str, bytes | None]] | None:
    """A headers cell as confluent-kafka takes it (None when empty).

    Raises:
        InputError: a header has no key, or a value that is not string or binary.
    """
    if not value:
        return None
    headers = []
    for item in value:
        if item is None or item[0] is None:
            raise InputError("column headers holds a header without a key", reason="header")
        headers.append((str(item[0]), as_bytes(item[1], "headers.value")))
    return headers


def _require(
    fields: dict[str, tuple[int, DataType]], name: str, types: tuple[type, ...], wanted: str
) -> None:
    if name in fields and not isinstance(fields[name][1], types):
        raise InputError(f"column {name} must be {wanted}, found {fields[name][1].simpleString()}")


def _position(fields: dict[str, tuple[int, DataType]], name: str) -> int | None:
    return fields[name][0] if name in fields else None


def _is_headers(data_type: DataType) -> bool:
    if not isinstance(data_type, ArrayType) or not isinstance(data_type.elementType, StructType):
        return False
    inner = data_type.elementType.fields
    return (
        len(inner) == 2
        and isinstance(inner[0].dataType, StringType)
        and isinstance(inner[1].dataType, _BYTES_TYPES)
    )
