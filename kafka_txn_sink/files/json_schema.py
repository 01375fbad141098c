"""Files mode's Avro schemas of JSON payloads: inferred per file (`SchemaAggregator`).

Used when option `payloadColumn` is set: each file's schema is aggregated from that file's
payloads (`infer` each, `merge` them, `finalize`) by these rules, applied at every position.

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
   first, so `a-b` never takes `a_b` from a real `a_b` (`avro_names`; Spark field names follow
   the same rule).
4. With `irreconcilable="union"` (the default) the result is a union with one member per kind,
   in the order null, boolean, long or double, string, array, record (`true` and `1` give
   `["boolean", "long"]`; `"x"` and `{}` give `["string", record]`). Merging keeps at most one
   member per kind (arrays and records merge, long and double widen), which Avro always allows,
   so the string fallback is never forced. With `irreconcilable="string"` any two kinds other
   than null give `"string"` (or `["null", "string"]`), and the values of that position that
   are not strings are written JSON-encoded (`{"a":1}`, `true`, `3`).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable
from typing import Any, Literal, NoReturn

from kafka_txn_sink.errors import InputError
from kafka_txn_sink.files.avro_names import (
    AvroType,
    Converter,
    RecordNames,
    avro_field,
    avro_field_names,
    check_names,
    column_path,
    field_key,
    is_nullable,
)

Irreconcilable = Literal["union", "string"]
"""How a position whose payloads hold different kinds of value is typed (note 4)."""

_SURROGATE = re.compile("[\ud800-\udfff]")
_LONG_MIN, _LONG_MAX = -(2**63), 2**63 - 1


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
            avro_field(name, key, infer(value[key], f"{path}_{name}", irreconcilable))
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
    b_fields = {field_key(f): f for f in b["fields"]}
    keys: list[str] = []
    types: list[AvroType] = []
    for field in a["fields"]:
        key = field_key(field)
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
    fields = [
        avro_field(n, k, t) for n, k, t in zip(avro_field_names(keys), keys, types, strict=True)
    ]
    return {"type": "record", "name": a["name"], "fields": fields}


def finalize(
    avro_type: AvroType, name: str = "Payload", namespace: str = "kafka_txn_sink"
) -> dict[str, Any]:
    """A parseable Avro record schema from an aggregated record type: records named after
    their path and unique, arrays that only ever were empty given `"null"` items.

    Raises:
        ValueError: `avro_type` is not a record, or the name or namespace is invalid.
    """
    check_names(name, namespace)
    if not (isinstance(avro_type, dict) and avro_type.get("type") == "record"):
        raise ValueError(f"the aggregated type must be a record, not {avro_type!r}")
    record = _finalize(avro_type, name, RecordNames())
    assert isinstance(record, dict)
    if namespace:
        record = {
            "type": "record",
            "name": record["name"],
            "namespace": namespace,
            "fields": record["fields"],
        }
    return record


def _finalize(avro_type: AvroType, owner: str, names: RecordNames) -> AvroType:
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
        check_names(name, namespace)
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
    checks = {field_key(f): _fit_checker(f["type"], irreconcilable) for f in record["fields"]}
    required = [field_key(f) for f in record["fields"] if not is_nullable(f["type"])]

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
        (
            f["name"],
            field_key(f),
            _conformer(f["type"], irreconcilable, column_path(path, field_key(f))),
        )
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
