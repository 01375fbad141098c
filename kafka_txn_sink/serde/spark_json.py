"""Spark values as JSON for `json-schema` keys and values: the schema derived from a Spark type,
and each value made JSON (what `json.dumps` takes) the way Spark's `to_json` writes it.

| Spark type                  | JSON Schema                     | value                          |
|-----------------------------|---------------------------------|--------------------------------|
| struct                      | object, properties, required    | object of its fields           |
| array<T>                    | array of T                      | array                          |
| map<string, T>              | object, additionalProperties T  | object                         |
| string, char, varchar       | string                          | string                         |
| binary                      | string (contentEncoding base64) | base64 text                    |
| boolean                     | boolean                         | true / false                   |
| byte, short, int, long      | integer                         | number                         |
| float, double               | number                          | number                         |
| decimal(p, s)               | number                          | number (a float if fractional) |
| date / timestamp(_ntz)      | string, format date / date-time | ISO 8601 text                  |

A timestamp is its instant in UTC (`2025-11-02T06:30:00.123000+00:00`, `serde/timestamps.py`);
a timestamp_ntz its wall clock without an offset, or with `Z` where a protobuf `Timestamp`
takes it (`utc_walls`). A nullable field's type also allows null; a field that is not nullable
is required. Other types (intervals, variants, maps with keys that are not strings) are
refused, naming the column.
"""

from __future__ import annotations

import base64
from collections.abc import Callable, Collection
from datetime import date, datetime
from decimal import Decimal
from typing import Any

from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    BooleanType,
    ByteType,
    CharType,
    DataType,
    DateType,
    DecimalType,
    DoubleType,
    FloatType,
    IntegerType,
    LongType,
    MapType,
    ShortType,
    StringType,
    StructType,
    TimestampNTZType,
    TimestampType,
    VarcharType,
)

from kafka_txn_sink.errors import InputError
from kafka_txn_sink.serde.timestamps import instant_converter

JsonConverter = Callable[[Any], Any]

_INTEGERS = (ByteType, ShortType, IntegerType, LongType)
_STRINGS = (StringType, CharType, VarcharType)


def spark_to_json_schema(data_type: DataType, title: str) -> dict[str, Any]:
    """The JSON Schema (draft 7) of values of `data_type`, titled `title`.

    Raises:
        InputError: a type JSON cannot carry; the message names the column.
    """
    return {
        "$schema": "http://json-schema.org/draft-07/schema#",
        "title": title,
        **_schema(data_type, title.lower()),
    }


def json_converter(
    data_type: DataType,
    column: str,
    *,
    from_row_writer: bool = False,
    utc_walls: Collection[str] = (),
) -> JsonConverter:
    """A function turning a non-null value of `data_type` (as PySpark's rows carry it) into
    JSON values, as `spark_to_json_schema` describes them.

    `from_row_writer`: the values are PySpark's row writer's, whose naive local timestamps of
    an hour the zone repeats are refused (InputError, `timestamps.instant_converter`).
    `utc_walls`: the timestamp_ntz fields (paths as in errors: `value.at`, `value.items[].at`)
    written as UTC (`Z`), for a protobuf `Timestamp`.
    """
    return _converter(data_type, column, _Times(from_row_writer, frozenset(utc_walls)))


class _Times:
    """The timestamp settings of one converter: one instant function for all its fields."""

    def __init__(self, from_row_writer: bool, utc_walls: frozenset[str]) -> None:
        self.instant = instant_converter(from_row_writer=from_row_writer)
        self.utc_walls = utc_walls


def _converter(data_type: DataType, column: str, times: _Times) -> JsonConverter:
    if isinstance(data_type, StructType):
        parts = [(f.name, _converter(f.dataType, f"{column}.{f.name}", times)) for f in data_type]

        def struct(value: Any) -> dict[str, Any]:
            cells = [value.get(n) for n, _ in parts] if isinstance(value, dict) else value
            return {
                name: None if cell is None else convert(cell)
                for (name, convert), cell in zip(parts, cells, strict=True)
            }

        return struct
    if isinstance(data_type, ArrayType):
        item = _converter(data_type.elementType, f"{column}[]", times)
        return lambda value: [None if v is None else item(v) for v in value]
    if isinstance(data_type, MapType):
        inner = _converter(data_type.valueType, f"{column}{{}}", times)
        return lambda value: {
            str(k): None if v is None else inner(v) for k, v in dict(value).items()
        }
    return _scalar_converter(data_type, column, times)


def _scalar_converter(data_type: DataType, column: str, times: _Times) -> JsonConverter:
    if isinstance(data_type, BinaryType):
        return lambda value: base64.b64encode(bytes(value)).decode("ascii")
    if isinstance(data_type, DecimalType):
        return _decimal
    if isinstance(data_type, TimestampType):
        instant = times.instant
        return lambda value: instant(value).isoformat()
    if isinstance(data_type, TimestampNTZType) and column in times.utc_walls:
        return _utc_wall
    if isinstance(data_type, (DateType, TimestampNTZType)):
        return _iso
    if isinstance(data_type, (*_STRINGS, BooleanType, *_INTEGERS, FloatType, DoubleType)):
        return _same
    raise _refused(data_type, column)


def _schema(data_type: DataType, column: str) -> dict[str, Any]:
    if isinstance(data_type, StructType):
        return {
            "type": "object",
            "properties": {
                f.name: _nullable(_schema(f.dataType, f"{column}.{f.name}"), f.nullable)
                for f in data_type
            },
            "required": [f.name for f in data_type if not f.nullable],
        }
    if isinstance(data_type, ArrayType):
        item = _schema(data_type.elementType, f"{column}[]")
        return {"type": "array", "items": _nullable(item, data_type.containsNull)}
    if isinstance(data_type, MapType):
        if not isinstance(data_type.keyType, _STRINGS):
            raise InputError(
                f"column {column} is a map with {data_type.keyType.simpleString()} keys: JSON "
                f"objects have string keys"
            )
        inner = _schema(data_type.valueType, f"{column}{{}}")
        values = _nullable(inner, data_type.valueContainsNull)
        return {"type": "object", "additionalProperties": values}
    return _scalar_schema(data_type, column)


def _scalar_schema(data_type: DataType, column: str) -> dict[str, Any]:
    if isinstance(data_type, BinaryType):
        return {"type": "string", "contentEncoding": "base64"}
    if isinstance(data_type, _STRINGS):
        return {"type": "string"}
    if isinstance(data_type, BooleanType):
        return {"type": "boolean"}
    if isinstance(data_type, _INTEGERS):
        return {"type": "integer"}
    if isinstance(data_type, (FloatType, DoubleType, DecimalType)):
        return {"type": "number"}
    if isinstance(data_type, DateType):
        return {"type": "string", "format": "date"}
    if isinstance(data_type, (TimestampType, TimestampNTZType)):
        return {"type": "string", "format": "date-time"}
    raise _refused(data_type, column)


def _refused(data_type: DataType, column: str) -> InputError:
    return InputError(f"column {column} has type {data_type.simpleString()}: JSON cannot carry it")


def _nullable(schema: dict[str, Any], nullable: bool) -> dict[str, Any]:
    return {"oneOf": [{"type": "null"}, schema]} if nullable else schema


def _same(value: Any) -> Any:
    return value


def _decimal(value: Decimal) -> int | float:
    return int(value) if value == value.to_integral_value() else float(value)


def _iso(value: date | datetime) -> str:
    return value.isoformat()


def _utc_wall(value: datetime) -> str:
    return value.replace(tzinfo=None).isoformat() + "Z"
