"""Files mode's Avro schema of Spark rows: `spark_to_avro`, and rows through `row_converter`.

Used when option `payloadColumn` is not set: every file of a sink has this one schema.

| Spark type                     | Avro type                                                  |
|--------------------------------|------------------------------------------------------------|
| struct                         | record named after its path (`Row_address`), unique (1)    |
| array<T>                       | array, items `["null", T]` when containsNull               |
| map<string, T>                 | map, values `["null", T]` when valueContainsNull           |
| map<K, T>, K not string        | InputError naming the column                               |
| decimal(p, s)                  | bytes, logicalType decimal, precision p, scale s           |
| date                           | int, logicalType date                                      |
| timestamp                      | long, logicalType timestamp-micros (UTC instant)           |
| timestamp_ntz                  | long, logicalType local-timestamp-micros                   |
| binary                         | bytes                                                      |
| string, char, varchar          | string                                                     |
| boolean                        | boolean                                                    |
| byte, short, int / long        | int / long                                                 |
| float / double                 | float / double                                             |
| void (NullType)                | null, default null                                         |
| user-defined type              | the Avro type of its sqlType, values serialized by the UDT |
| interval, variant, other       | InputError naming the column                               |

1. Array elements add `_item` to the path, map values `_value`; field names are sanitized as
   `avro_names` describes (the rule JSON payloads follow too).

A nullable field is `["null", T]` with `"default": null` (null first, so the default is valid);
a non-nullable field is plain `T`, and a null in it is an InputError naming the column.
A `timestamp` is written as its instant: PySpark's row writer hands it over as a naive local
time of the Python worker, read by the zone's rules (`serde/timestamps.py`, which also refuses
the local times the zone repeats, whose instant PySpark has lost); an aware one is exact. A
`timestamp_ntz` is its wall clock, whatever the worker's zone.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

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
    NullType,
    ShortType,
    StringType,
    StructType,
    TimestampNTZType,
    TimestampType,
    UserDefinedType,
    VarcharType,
)

from kafka_txn_sink.errors import InputError
from kafka_txn_sink.files.avro_names import (
    AvroType,
    Converter,
    RecordNames,
    avro_field,
    avro_field_names,
    check_names,
    column_path,
)
from kafka_txn_sink.serde.timestamps import Instant, instant_converter, wall_clock_as_utc

# --- Spark schema -> Avro ----------------------------------------------------------------


def spark_to_avro(
    schema: StructType, name: str = "Row", namespace: str = "kafka_txn_sink"
) -> dict[str, Any]:
    """The Avro record schema of rows of `schema` (see the module docstring for the mapping).

    Raises:
        InputError: a column has a type Avro files cannot hold; the message names the column.
        ValueError: `name` or `namespace` is not a valid Avro name.
    """
    check_names(name, namespace)
    record = _struct_to_avro(schema, name, "", RecordNames())
    if namespace:
        return {
            "type": "record",
            "name": record["name"],
            "namespace": namespace,
            "fields": record["fields"],
        }
    return record


def _struct_to_avro(
    struct: StructType, owner: str, column: str, names: RecordNames
) -> dict[str, Any]:
    record_name = names.unique(owner)
    avro_names = avro_field_names([f.name for f in struct.fields])
    fields = [
        avro_field(
            avro_name,
            f.name,
            _spark_type(
                f.dataType,
                f.nullable,
                f"{record_name}_{avro_name}",
                column_path(column, f.name),
                names,
            ),
        )
        for avro_name, f in zip(avro_names, struct.fields, strict=True)
    ]
    return {"type": "record", "name": record_name, "fields": fields}


def _spark_type(
    data_type: DataType, nullable: bool, owner: str, column: str, names: RecordNames
) -> AvroType:
    avro_type = _spark_type_not_null(data_type, owner, column, names)
    return ["null", avro_type] if nullable and avro_type != "null" else avro_type


_SPARK_PRIMITIVES: tuple[tuple[type[DataType], AvroType], ...] = (
    (StringType, "string"),
    (CharType, "string"),
    (VarcharType, "string"),
    (BooleanType, "boolean"),
    (ByteType, "int"),
    (ShortType, "int"),
    (IntegerType, "int"),
    (LongType, "long"),
    (FloatType, "float"),
    (DoubleType, "double"),
    (BinaryType, "bytes"),
    (NullType, "null"),
    (DateType, {"type": "int", "logicalType": "date"}),
    (TimestampType, {"type": "long", "logicalType": "timestamp-micros"}),
    (TimestampNTZType, {"type": "long", "logicalType": "local-timestamp-micros"}),
)


def _spark_type_not_null(
    data_type: DataType, owner: str, column: str, names: RecordNames
) -> AvroType:
    for spark_class, avro_type in _SPARK_PRIMITIVES:
        if isinstance(data_type, spark_class):
            return dict(avro_type) if isinstance(avro_type, dict) else avro_type
    if isinstance(data_type, DecimalType):
        return {
            "type": "bytes",
            "logicalType": "decimal",
            "precision": data_type.precision,
            "scale": data_type.scale,
        }
    if isinstance(data_type, StructType):
        return _struct_to_avro(data_type, owner, column, names)
    if isinstance(data_type, ArrayType):
        items = _spark_type(
            data_type.elementType, data_type.containsNull, f"{owner}_item", f"{column}[]", names
        )
        return {"type": "array", "items": items}
    if isinstance(data_type, MapType):
        if not isinstance(data_type.keyType, (StringType, CharType, VarcharType)):
            raise InputError(
                f"column {column} is a {data_type.simpleString()}; Avro maps need string keys"
            )
        values = _spark_type(
            data_type.valueType,
            data_type.valueContainsNull,
            f"{owner}_value",
            f"{column}{{}}",
            names,
        )
        return {"type": "map", "values": values}
    if isinstance(data_type, UserDefinedType):
        return _spark_type_not_null(data_type.sqlType(), owner, column, names)
    raise InputError(
        f"column {column} has type {data_type.simpleString()}, which Avro files cannot hold"
    )


# --- Spark rows -> Avro records ----------------------------------------------------------


class _Times(NamedTuple):
    """How a converter writes `timestamp` values, and `timestamp_ntz` ones (None: as they are)."""

    instant: Instant
    ntz: Converter | None


def row_converter(
    schema: StructType, *, from_row_writer: bool = False, ntz_as_utc: bool = False
) -> Callable[[Any], dict[str, Any]]:
    """A function turning a row of `schema` into a record valid for `spark_to_avro(schema)`.

    Rows and structs are read by position, as PySpark's writer gives them (`Row` objects), or
    by Spark name when they are dicts. `from_row_writer`: the rows are PySpark's row writer's,
    whose naive local timestamps of an hour the zone repeats are refused (`instant_converter`).
    `ntz_as_utc`: timestamp_ntz values become aware UTC datetimes of their wall clock, for a
    schema that may give them an instant's field (`timestamp-*`), which fastavro would
    otherwise read in the worker's zone.

    Raises (the returned function):
        InputError: a non-nullable value is null, or a row has the wrong number of values, or
            (`from_row_writer`) a timestamp's instant is lost.
    """
    spark_to_avro(schema)  # the same type checks, raised when the converter is built
    times = _Times(
        instant_converter(from_row_writer=from_row_writer),
        wall_clock_as_utc if ntz_as_utc else None,
    )
    return _struct_converter(schema, "", times)


def _struct_converter(
    struct: StructType, column: str, times: _Times
) -> Callable[[Any], dict[str, Any]]:
    avro_names = avro_field_names([f.name for f in struct.fields])
    parts = [
        (
            avro_name,
            _converter(f.dataType, column_path(column, f.name), times),
            f.nullable or isinstance(f.dataType, NullType),
            column_path(column, f.name),
        )
        for avro_name, f in zip(avro_names, struct.fields, strict=True)
    ]
    size = len(parts)
    spark_names = struct.names

    def convert(row: Any) -> dict[str, Any]:
        if isinstance(row, dict):
            row = [row.get(name) for name in spark_names]
        if len(row) != size:
            raise InputError(
                f"row{' ' + column if column else ''} has {len(row)} values, "
                f"its schema {size} columns"
            )
        record: dict[str, Any] = {}
        for (name, conv, nullable, col), value in zip(parts, row, strict=True):
            if value is None:
                if not nullable:
                    raise InputError(f"column {col} is null, but its type is not nullable")
                record[name] = None
            else:
                record[name] = value if conv is None else conv(value)
        return record

    return convert


def _converter(data_type: DataType, column: str, times: _Times) -> Converter | None:
    """Conversion of a non-null value, or None where fastavro takes PySpark's value as it is."""
    if isinstance(data_type, StructType):
        return _struct_converter(data_type, column, times)
    if isinstance(data_type, ArrayType):
        return _collection(
            _converter(data_type.elementType, f"{column}[]", times),
            data_type.containsNull or isinstance(data_type.elementType, NullType),
            f"{column}[]",
            is_map=False,
        )
    if isinstance(data_type, MapType):
        return _collection(
            _converter(data_type.valueType, f"{column}{{}}", times),
            data_type.valueContainsNull or isinstance(data_type.valueType, NullType),
            f"{column}{{}}",
            is_map=True,
        )
    if isinstance(data_type, TimestampType):
        return times.instant
    if isinstance(data_type, TimestampNTZType):
        return times.ntz
    if isinstance(data_type, UserDefinedType):
        return _udt_converter(data_type, column, times)
    return None


def _udt_converter(udt: UserDefinedType, column: str, times: _Times) -> Converter:
    inner = _converter(udt.sqlType(), column, times)
    if inner is None:
        return udt.serialize
    return lambda value: inner(udt.serialize(value))


def _collection(
    conv: Converter | None, contains_null: bool, column: str, is_map: bool
) -> Converter | None:
    if conv is None and contains_null:
        return None

    def element(value: Any) -> Any:
        if value is None:
            if not contains_null:
                raise InputError(f"column {column} holds a null, but its type is not nullable")
            return None
        return value if conv is None else conv(value)

    if is_map:
        return lambda value: {k: element(v) for k, v in value.items()}
    return lambda value: [element(v) for v in value]
