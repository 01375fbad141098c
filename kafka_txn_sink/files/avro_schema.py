"""Avro schemas of files mode: derived from the Spark schema, or inferred from JSON payloads.

Spark schema -> Avro (`spark_to_avro`, rows through `row_converter`):

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
   for JSON payloads (note 3 below).

A nullable field is `["null", T]` with `"default": null` (null first, so the default is valid);
a non-nullable field is plain `T`, and a null in it is an InputError naming the column.
PySpark hands the writer `timestamp` values as naive datetimes in the Python worker's local time
zone, so naive values are read as local time; run the workers with `TZ=UTC` to avoid the
ambiguous hour at the end of daylight saving time, which PySpark's conversion already loses.

JSON payloads -> Avro (`infer`, `merge`, `SchemaAggregator`): the rules, applied at every
position of the payloads of one file.

| Seen at one position            | Aggregated Avro type                                        |
|---------------------------------|-------------------------------------------------------------|
| null                            | `"null"`                                                    |
| true / false                    | `"boolean"`, never widened to a number                      |
| integer                         | `"long"` (every integer; beyond 64 bits `"double"`)         |
| other number (NaN, Infinity)    | `"double"`                                                  |
| string                          | `"string"`; lone surrogates are written as U+FFFD           |
| object                          | record named after its path, fields in first-seen order     |
| `{}`                            | record with no fields                                       |
| array                           | array of the merged type of its elements                    |
| empty array `[]`                | array with no element type yet (1)                          |
| null and T                      | `["null", T]`; a field gets `"default": null`               |
| field missing in some objects   | `["null", T]`, `"default": null`                            |
| integer and other number        | `"double"` (int -> long -> double); ints written as floats  |
| object and object               | one record, fields merged by name (2)                       |
| array and array                 | one array, element types merged                             |
| invalid Avro field name         | sanitized, the original kept in `"originalName"` (3)        |
| any other mix of kinds          | union, or string with `irreconcilable="string"` (4)         |

1. `[]` infers as an array whose items are the empty union (no value yet); merged with any
   array it takes that array's element type, so `[]` and `["a"]` give array of `"string"`,
   not of `["null", "string"]`. A file whose arrays at one position were all empty gets
   array of `"null"` in its final schema.
2. A record is named after its path from the root record: `Payload_user_address`; array
   elements add `_item`. A name already used in the schema gets a suffix `_2`, `_3`, ...
3. Other characters become `_`, a leading digit gets a `_` prefix, the empty name becomes `_`;
   a name already taken in the record gets a suffix `_1`, `_2`, ... Valid names keep theirs
   first, so `a-b` never takes `a_b` from a real `a_b`. Spark field names follow the same rule.
4. With `irreconcilable="union"` (the default) the result is a union with one member per kind,
   in the order null, boolean, long or double, string, array, record (`true` and `1` give
   `["boolean", "long"]`; `"x"` and `{}` give `["string", record]`). Merging keeps at most one
   member per kind (arrays and records merge, long and double widen), which Avro always allows,
   so the string fallback is never forced. With `irreconcilable="string"` any two kinds other
   than null give `"string"` (or `["null", "string"]`), and the values of that position that
   are not strings are written JSON-encoded (`{"a":1}`, `true`, `3`).

`fingerprint` is the CRC-64-AVRO (Rabin) fingerprint of the schema's Parsing Canonical Form, as
Avro single-object encoding and schema registries use it. The canonical form keeps only what
decoding needs: it drops logical types, defaults and `originalName`, so schemas that differ only
there share a fingerprint. `schema_digest` (SHA-256 of the whole schema) tells them apart, for
naming schema files stored beside the data.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from collections.abc import Callable, Sequence
from datetime import datetime, timezone
from typing import Any, Literal, NoReturn

from fastavro.schema import fingerprint as _fastavro_fingerprint
from fastavro.schema import to_parsing_canonical_form
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

AvroType = str | dict[str, Any] | list[Any]
"""An Avro schema in its JSON form: a primitive name, a complex type, or a union."""

Irreconcilable = Literal["union", "string"]
Converter = Callable[[Any], Any]

ORIGINAL_NAME = "originalName"
"""Field attribute keeping a field's name when it had to be sanitized."""

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_NAMESPACE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*")
_INVALID_CHAR = re.compile(r"[^A-Za-z0-9_]")
_SURROGATE = re.compile("[\ud800-\udfff]")
_PRIMITIVES = frozenset({"null", "boolean", "int", "long", "float", "double", "bytes", "string"})
_LONG_MIN, _LONG_MAX = -(2**63), 2**63 - 1


# --- names -------------------------------------------------------------------------------


def avro_field_names(names: Sequence[str]) -> list[str]:
    """Valid, unique Avro names for the fields of one record, in the same order.

    Valid names are kept (the first of duplicates); the others are sanitized and, when taken,
    suffixed `_1`, `_2`, ... Valid names are placed first so that a sanitized name never takes
    a name the record really uses.
    """
    out: list[str | None] = [None] * len(names)
    taken: set[str] = set()
    for i, name in enumerate(names):
        if _NAME.fullmatch(name) and name not in taken:
            out[i] = name
            taken.add(name)
    for i, name in enumerate(names):
        if out[i] is None:
            sanitized = _suffixed(_sanitize(name), taken, first=1)
            out[i] = sanitized
            taken.add(sanitized)
    return [name for name in out if name is not None]


def _sanitize(name: str) -> str:
    base = _INVALID_CHAR.sub("_", name)
    return "_" + base if not base or base[0].isdigit() else base


def _suffixed(base: str, taken: set[str], first: int) -> str:
    if base not in taken:
        return base
    n = first
    while f"{base}_{n}" in taken:
        n += 1
    return f"{base}_{n}"


class _RecordNames:
    """Record names unique within one schema (Avro names every record once)."""

    def __init__(self) -> None:
        self._taken: set[str] = set()

    def unique(self, base: str) -> str:
        name = _suffixed(base, self._taken, first=2)
        self._taken.add(name)
        return name


def _check_names(name: str, namespace: str) -> None:
    if not _NAME.fullmatch(name) or name in _PRIMITIVES:
        raise ValueError(f"record name {name!r} is not a valid Avro name")
    if namespace and not _NAMESPACE.fullmatch(namespace):
        raise ValueError(f"namespace {namespace!r} is not a valid Avro namespace")


def _field(name: str, original: str, avro_type: AvroType) -> dict[str, Any]:
    field: dict[str, Any] = {"name": name, "type": avro_type}
    if _nullable(avro_type):
        field["default"] = None
    if name != original:
        field[ORIGINAL_NAME] = original
    return field


def _nullable(avro_type: AvroType) -> bool:
    return avro_type == "null" or (isinstance(avro_type, list) and "null" in avro_type)


def _key(field: dict[str, Any]) -> str:
    return str(field.get(ORIGINAL_NAME, field["name"]))


# --- fingerprints ------------------------------------------------------------------------


def fingerprint(schema: AvroType) -> str:
    """CRC-64-AVRO fingerprint of the Parsing Canonical Form, 16 hex digits.

    Logical types, defaults and attributes are not part of the canonical form.
    """
    return str(_fastavro_fingerprint(to_parsing_canonical_form(schema), "CRC-64-AVRO"))


def schema_digest(schema: AvroType) -> str:
    """SHA-256 of the whole schema (keys sorted), 64 hex digits: differs whenever anything does."""
    text = json.dumps(schema, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return hashlib.sha256(text.encode("ascii")).hexdigest()


# --- Spark schema -> Avro ----------------------------------------------------------------


def spark_to_avro(
    schema: StructType, name: str = "Row", namespace: str = "kafka_txn_sink"
) -> dict[str, Any]:
    """The Avro record schema of rows of `schema` (see the module docstring for the mapping).

    Raises:
        InputError: a column has a type Avro files cannot hold; the message names the column.
        ValueError: `name` or `namespace` is not a valid Avro name.
    """
    _check_names(name, namespace)
    record = _struct_to_avro(schema, name, "", _RecordNames())
    if namespace:
        return {
            "type": "record",
            "name": record["name"],
            "namespace": namespace,
            "fields": record["fields"],
        }
    return record


def _struct_to_avro(
    struct: StructType, owner: str, column: str, names: _RecordNames
) -> dict[str, Any]:
    record_name = names.unique(owner)
    avro_names = avro_field_names([f.name for f in struct.fields])
    fields = [
        _field(
            avro_name,
            f.name,
            _spark_type(
                f.dataType,
                f.nullable,
                f"{record_name}_{avro_name}",
                _column(column, f.name),
                names,
            ),
        )
        for avro_name, f in zip(avro_names, struct.fields, strict=True)
    ]
    return {"type": "record", "name": record_name, "fields": fields}


def _column(parent: str, name: str) -> str:
    return f"{parent}.{name}" if parent else name


def _spark_type(
    data_type: DataType, nullable: bool, owner: str, column: str, names: _RecordNames
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
    data_type: DataType, owner: str, column: str, names: _RecordNames
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


def row_converter(schema: StructType) -> Callable[[Any], dict[str, Any]]:
    """A function turning a row of `schema` into a record valid for `spark_to_avro(schema)`.

    Rows and structs are read by position, as PySpark's writer gives them (`Row` objects), or
    by Spark name when they are dicts.

    Raises (the returned function):
        InputError: a non-nullable value is null, or a row has the wrong number of values.
    """
    spark_to_avro(schema)  # the same type checks, raised when the converter is built
    return _struct_converter(schema, "")


def _struct_converter(struct: StructType, column: str) -> Callable[[Any], dict[str, Any]]:
    avro_names = avro_field_names([f.name for f in struct.fields])
    parts = [
        (
            avro_name,
            _converter(f.dataType, _column(column, f.name)),
            f.nullable or isinstance(f.dataType, NullType),
            _column(column, f.name),
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


def _converter(data_type: DataType, column: str) -> Converter | None:
    """Conversion of a non-null value, or None where fastavro takes PySpark's value as it is."""
    if isinstance(data_type, StructType):
        return _struct_converter(data_type, column)
    if isinstance(data_type, ArrayType):
        return _collection(
            _converter(data_type.elementType, f"{column}[]"),
            data_type.containsNull or isinstance(data_type.elementType, NullType),
            f"{column}[]",
            is_map=False,
        )
    if isinstance(data_type, MapType):
        return _collection(
            _converter(data_type.valueType, f"{column}{{}}"),
            data_type.valueContainsNull or isinstance(data_type.valueType, NullType),
            f"{column}{{}}",
            is_map=True,
        )
    if isinstance(data_type, TimestampType):
        return _utc
    if isinstance(data_type, UserDefinedType):
        return _udt_converter(data_type, column)
    return None


def _utc(value: datetime) -> datetime:
    # PySpark's naive datetimes are in the worker's local time; fastavro would read them as local
    # time with mktime on Unix but as UTC on Windows, so they are made aware here.
    return value.astimezone(timezone.utc) if value.tzinfo is None else value


def _udt_converter(udt: UserDefinedType, column: str) -> Converter:
    inner = _converter(udt.sqlType(), column)
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


# --- JSON payloads -> Avro ---------------------------------------------------------------

# Members of an aggregated union, at most one per slot, kept in slot order (null first).
_NULL, _BOOLEAN, _NUMBER, _STRING, _ARRAY, _RECORD = range(6)
_PRIMITIVE_SLOTS = {
    "null": _NULL,
    "boolean": _BOOLEAN,
    "long": _NUMBER,
    "double": _NUMBER,
    "string": _STRING,
}


def infer(value: Any, path: str = "Payload", irreconcilable: Irreconcilable = "union") -> AvroType:
    """The Avro type of one parsed JSON value; an object becomes a record named `path`.

    Raises:
        InputError: the value is not made of JSON values (dict, list, str, int, float, bool, None).
    """
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "long" if _LONG_MIN <= value <= _LONG_MAX else "double"
    if isinstance(value, float):
        return "double"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        items: AvroType = []  # the empty union: no element seen yet
        for element in value:
            items = merge(
                items,
                infer(element, f"{path}_item", irreconcilable),
                f"{path}_item",
                irreconcilable,
            )
        return {"type": "array", "items": items}
    if isinstance(value, dict):
        keys = list(value)
        names = avro_field_names(keys)
        fields = [
            _field(name, key, infer(value[key], f"{path}_{name}", irreconcilable))
            for name, key in zip(names, keys, strict=True)
        ]
        return {"type": "record", "name": path, "fields": fields}
    raise InputError(f"{path}: a {type(value).__name__} is not a JSON value")


def merge(
    a: AvroType, b: AvroType, path: str = "Payload", irreconcilable: Irreconcilable = "union"
) -> AvroType:
    """The aggregate of two inferred types (see the module docstring for the rules).

    A record keeps the name it has in `a`; `path` names what is merged in messages.
    """
    slots: dict[int, AvroType] = {}
    for member in (*_members(a), *_members(b)):
        slot = _slot(member, path)
        old = slots.get(slot)
        slots[slot] = member if old is None else _merge_same(old, member, path, irreconcilable)
    if irreconcilable == "string" and len(slots.keys() - {_NULL}) > 1:
        slots = {slot: t for slot, t in slots.items() if slot == _NULL} | {_STRING: "string"}
    members = [slots[slot] for slot in sorted(slots)]
    return members[0] if len(members) == 1 else members


def _members(avro_type: AvroType) -> list[AvroType]:
    return avro_type if isinstance(avro_type, list) else [avro_type]


def _slot(avro_type: AvroType, path: str) -> int:
    if isinstance(avro_type, str) and avro_type in _PRIMITIVE_SLOTS:
        return _PRIMITIVE_SLOTS[avro_type]
    if isinstance(avro_type, dict) and avro_type.get("type") == "array":
        return _ARRAY
    if isinstance(avro_type, dict) and avro_type.get("type") == "record":
        return _RECORD
    raise ValueError(f"{path}: {avro_type!r} is not a type JSON inference produces")


def _merge_same(a: AvroType, b: AvroType, path: str, irreconcilable: Irreconcilable) -> AvroType:
    if isinstance(a, str):
        return "double" if "double" in (a, b) else a
    assert isinstance(a, dict) and isinstance(b, dict)
    if a["type"] == "array":
        item_path = f"{path}_item"
        return {"type": "array", "items": merge(a["items"], b["items"], item_path, irreconcilable)}
    return _merge_records(a, b, path, irreconcilable)


def _merge_records(
    a: dict[str, Any], b: dict[str, Any], path: str, irreconcilable: Irreconcilable
) -> dict[str, Any]:
    b_fields = {_key(f): f for f in b["fields"]}
    keys: list[str] = []
    types: list[AvroType] = []
    for field in a["fields"]:
        key = _key(field)
        other = b_fields.pop(key, None)
        sub_path = f"{path}_{field['name']}"
        keys.append(key)
        types.append(
            merge(
                field["type"], "null" if other is None else other["type"], sub_path, irreconcilable
            )
        )
    for key, field in b_fields.items():
        keys.append(key)
        types.append(merge(field["type"], "null", f"{path}_{field['name']}", irreconcilable))
    fields = [_field(n, k, t) for n, k, t in zip(avro_field_names(keys), keys, types, strict=True)]
    return {"type": "record", "name": a["name"], "fields": fields}


def finalize(
    avro_type: AvroType, name: str = "Payload", namespace: str = "kafka_txn_sink"
) -> dict[str, Any]:
    """A parseable Avro record schema from an aggregated record type: records named after
    their path and unique, arrays that only ever were empty given `"null"` items.

    Raises:
        ValueError: `avro_type` is not a record, or the name or namespace is invalid.
    """
    _check_names(name, namespace)
    if not (isinstance(avro_type, dict) and avro_type.get("type") == "record"):
        raise ValueError(f"the aggregated type must be a record, not {avro_type!r}")
    record = _finalize(avro_type, name, _RecordNames())
    assert isinstance(record, dict)
    if namespace:
        record = {
            "type": "record",
            "name": record["name"],
            "namespace": namespace,
            "fields": record["fields"],
        }
    return record


def _finalize(avro_type: AvroType, owner: str, names: _RecordNames) -> AvroType:
    if isinstance(avro_type, str):
        return avro_type
    if isinstance(avro_type, list):
        if not avro_type:
            return "null"
        return [_finalize(member, owner, names) for member in avro_type]
    if avro_type["type"] == "array":
        return {"type": "array", "items": _finalize(avro_type["items"], f"{owner}_item", names)}
    record_name = names.unique(owner)
    fields = [
        {**f, "type": _finalize(f["type"], f"{record_name}_{f['name']}", names)}
        for f in avro_type["fields"]
    ]
    return {"type": "record", "name": record_name, "fields": fields}


class SchemaAggregator:
    """The merged record schema of the JSON objects of one file, added one at a time.

    Adding an object that the schema already covers costs one read-only walk of the object;
    the schema is merged again only when something new is seen. `count` is the number of
    objects added.
    """

    def __init__(
        self,
        name: str = "Payload",
        namespace: str = "kafka_txn_sink",
        irreconcilable: Irreconcilable = "union",
    ) -> None:
        _check_names(name, namespace)
        if irreconcilable not in ("union", "string"):
            raise ValueError(f"irreconcilable must be 'union' or 'string', not {irreconcilable!r}")
        self._name = name
        self._namespace = namespace
        self._irreconcilable: Irreconcilable = irreconcilable
        self._type: AvroType | None = None
        self._fits: Callable[[Any], bool] | None = None
        self._schema: dict[str, Any] | None = None
        self._conform: Callable[[Any], Any] | None = None
        self.count = 0

    def add(self, obj: Any) -> None:
        """Aggregate one parsed payload (a JSON object).

        Raises:
            InputError: the payload is not a JSON object.
        """
        if not isinstance(obj, dict):
            raise InputError(f"a payload must be a JSON object, not a {type(obj).__name__}")
        if self._type is None:
            self._type = infer(obj, self._name, self._irreconcilable)
            self._changed()
        else:
            if self._fits is None:
                self._fits = _fit_checker(self._type, self._irreconcilable)
            if not self._fits(obj):
                inferred = infer(obj, self._name, self._irreconcilable)
                self._type = merge(self._type, inferred, self._name, self._irreconcilable)
                self._changed()
        self.count += 1

    def _changed(self) -> None:
        self._fits = self._conform = None
        self._schema = None

    def schema(self) -> dict[str, Any]:
        """The Avro record schema of everything added so far (a record without fields if none)."""
        if self._schema is None:
            record = self._type or {"type": "record", "name": self._name, "fields": []}
            self._schema = finalize(record, self._name, self._namespace)
        return self._schema

    def conform(self, obj: Any) -> dict[str, Any]:
        """`obj` as a record valid under `schema()`; call it once every object is added.

        Raises:
            InputError: `obj` does not fit the schema (it was not added).
        """
        if self._conform is None:
            self._conform = conformer(self.schema(), self._irreconcilable)
        result: dict[str, Any] = self._conform(obj)
        return result


# --- fit check (does a value leave an aggregated type unchanged?) -------------------------


def _fit_checker(avro_type: AvroType, irreconcilable: Irreconcilable) -> Callable[[Any], bool]:
    """`check(v)` is true exactly when `merge(avro_type, infer(v)) == avro_type`."""
    members = _members(avro_type)
    checks = [_member_fit(m, irreconcilable) for m in members]
    if len(checks) == 1:
        return checks[0]
    return lambda value: any(check(value) for check in checks)


def _is_long(value: Any) -> bool:
    return (
        isinstance(value, int) and not isinstance(value, bool) and _LONG_MIN <= value <= _LONG_MAX
    )


def _member_fit(avro_type: AvroType, irreconcilable: Irreconcilable) -> Callable[[Any], bool]:
    if avro_type == "null":
        return lambda value: value is None
    if avro_type == "boolean":
        return lambda value: isinstance(value, bool)
    if avro_type == "long":
        return _is_long
    if avro_type == "double":
        return lambda value: isinstance(value, (int, float)) and not isinstance(value, bool)
    if avro_type == "string":
        if irreconcilable == "string":
            return lambda value: value is not None
        return lambda value: isinstance(value, str)
    assert isinstance(avro_type, dict)
    if avro_type["type"] == "array":
        element = _fit_checker(avro_type["items"], irreconcilable)
        return lambda value: isinstance(value, list) and all(element(e) for e in value)
    return _record_fit(avro_type, irreconcilable)


def _record_fit(record: dict[str, Any], irreconcilable: Irreconcilable) -> Callable[[Any], bool]:
    checks = {_key(f): _fit_checker(f["type"], irreconcilable) for f in record["fields"]}
    required = [_key(f) for f in record["fields"] if not _nullable(f["type"])]

    def check(value: Any) -> bool:
        if not isinstance(value, dict):
            return False
        for key, v in value.items():
            field_check = checks.get(key)
            if field_check is None or not field_check(v):
                return False
        return all(key in value for key in required)

    return check


# --- conform (a payload as a record of the final schema) ---------------------------------


def conformer(schema: dict[str, Any], irreconcilable: Irreconcilable = "union") -> Converter:
    """A function turning a parsed payload into a record valid under `schema`, an aggregated
    schema from `SchemaAggregator.schema()`: missing fields null, integers in a double field
    as floats, values of a field that became `string` JSON-encoded (with `"string"`).

    Raises (the returned function):
        InputError: the payload does not fit the schema.
    """
    return _conformer(schema, irreconcilable, "")


def _conformer(avro_type: AvroType, irreconcilable: Irreconcilable, path: str) -> Converter:
    if isinstance(avro_type, list):
        return _union_conformer(avro_type, irreconcilable, path)
    if avro_type == "null":
        return lambda value: None if value is None else _misfit(value, avro_type, path)
    if avro_type == "boolean":
        return lambda value: value if isinstance(value, bool) else _misfit(value, avro_type, path)
    if avro_type == "long":
        return lambda value: value if _is_long(value) else _misfit(value, avro_type, path)
    if avro_type == "double":
        return lambda value: _to_double(value, path)
    if avro_type == "string":
        return lambda value: _to_string(value, irreconcilable, path)
    assert isinstance(avro_type, dict)
    if avro_type["type"] == "array":
        element = _conformer(avro_type["items"], irreconcilable, f"{path}[]")
        return lambda value: (
            [element(e) for e in value]
            if isinstance(value, list)
            else _misfit(value, avro_type, path)
        )
    return _record_conformer(avro_type, irreconcilable, path)


def _record_conformer(
    record: dict[str, Any], irreconcilable: Irreconcilable, path: str
) -> Converter:
    parts = [
        (f["name"], _key(f), _conformer(f["type"], irreconcilable, _column(path, _key(f))))
        for f in record["fields"]
    ]
    keys = frozenset(key for _, key, _ in parts)

    def conform(value: Any) -> dict[str, Any]:
        if not isinstance(value, dict) or not keys.issuperset(value):
            _misfit(value, record, path)
        return {name: conv(value.get(key)) for name, key, conv in parts}

    return conform


def _union_conformer(members: list[Any], irreconcilable: Irreconcilable, path: str) -> Converter:
    by_slot = {_slot(m, path): _conformer(m, irreconcilable, path) for m in members}
    if irreconcilable == "string" and _STRING in by_slot:
        to_string = by_slot[_STRING]
        for slot in (_BOOLEAN, _NUMBER, _ARRAY, _RECORD):
            by_slot.setdefault(slot, to_string)

    if len(by_slot) == 2 and _NULL in by_slot:
        # The common nullable field: one type besides null, no dispatch needed.
        inner = by_slot[max(by_slot)]
        return lambda value: None if value is None else inner(value)

    def conform(value: Any) -> Any:
        conv = by_slot.get(_value_slot(value))
        return _misfit(value, members, path) if conv is None else conv(value)

    return conform


_SLOT_OF_TYPE: dict[type, int] = {
    type(None): _NULL,
    bool: _BOOLEAN,
    int: _NUMBER,
    float: _NUMBER,
    str: _STRING,
    list: _ARRAY,
    dict: _RECORD,
}


def _value_slot(value: Any) -> int:
    slot = _SLOT_OF_TYPE.get(type(value))
    if slot is not None:
        return slot
    if value is None:
        return _NULL
    if isinstance(value, bool):
        return _BOOLEAN
    if isinstance(value, (int, float)):
        return _NUMBER
    if isinstance(value, str):
        return _STRING
    if isinstance(value, list):
        return _ARRAY
    return _RECORD if isinstance(value, dict) else -1


def _to_double(value: Any, path: str) -> float:
    if isinstance(value, float):
        return value
    if isinstance(value, int) and not isinstance(value, bool):
        try:
            return float(value)
        except OverflowError:
            return math.inf if value > 0 else -math.inf
    return _misfit(value, "double", path)


def _to_string(value: Any, irreconcilable: Irreconcilable, path: str) -> str:
    if isinstance(value, str):
        return _utf8(value)
    if irreconcilable == "string" and value is not None:
        return _utf8(json.dumps(value, ensure_ascii=False, separators=(",", ":")))
    return _misfit(value, "string", path)


def _utf8(text: str) -> str:
    # Avro strings are UTF-8; json.loads turns a "\ud800" escape into a lone surrogate.
    if text.isascii():
        return text
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return _SURROGATE.sub("\ufffd", text)
    return text


def _misfit(value: Any, avro_type: AvroType, path: str) -> NoReturn:
    shown = json.dumps(avro_type, ensure_ascii=True)
    if len(shown) > 200:
        shown = shown[:200] + "..."
    raise InputError(
        f"payload value at {path or 'the root'} ({type(value).__name__}) does not fit the "
        f"aggregated schema {shown}; was the payload added to the aggregator?"
    )
