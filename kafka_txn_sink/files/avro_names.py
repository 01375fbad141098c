"""What both schema engines of files mode share: Avro names, fields, and a schema's identity.

Both `spark_avro` (Spark schema -> Avro) and `json_schema` (JSON payloads -> Avro) name records
after their path and sanitize field names by one rule: other characters become `_`, a leading
digit gets a `_` prefix, the empty name becomes `_`; a name already taken in the record gets a
suffix `_1`, `_2`, ... Valid names keep theirs first, so `a-b` never takes `a_b` from a real
`a_b`. A sanitized field keeps its original name in `"originalName"`.

`fingerprint` is the CRC-64-AVRO (Rabin) fingerprint of the schema's Parsing Canonical Form, as
Avro single-object encoding and schema registries use it. The canonical form keeps only what
decoding needs: it drops logical types, defaults and `originalName`, so schemas that differ only
there share a fingerprint. `schema_digest` (SHA-256 of the whole schema) tells them apart, for
naming schema files stored beside the data.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable, Sequence
from typing import Any

from fastavro.schema import fingerprint as _fastavro_fingerprint
from fastavro.schema import to_parsing_canonical_form

AvroType = str | dict[str, Any] | list[Any]
"""An Avro schema in its JSON form: a primitive name, a complex type, or a union."""

Converter = Callable[[Any], Any]
"""Turns one value into what fastavro writes for it."""

ORIGINAL_NAME = "originalName"
"""Field attribute keeping a field's name when it had to be sanitized."""

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_NAMESPACE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*")
_INVALID_CHAR = re.compile(r"[^A-Za-z0-9_]")
_PRIMITIVES = frozenset({"null", "boolean", "int", "long", "float", "double", "bytes", "string"})


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


class RecordNames:
    """Record names unique within one schema (Avro names every record once)."""

    def __init__(self) -> None:
        self._taken: set[str] = set()

    def unique(self, base: str) -> str:
        """`base`, or `base_2`, `base_3`, ... when taken; the name is taken from now on."""
        name = _suffixed(base, self._taken, first=2)
        self._taken.add(name)
        return name


def check_names(name: str, namespace: str) -> None:
    """Raises ValueError when `name` or `namespace` (empty: none) is not valid Avro."""
    if not _NAME.fullmatch(name) or name in _PRIMITIVES:
        raise ValueError(f"record name {name!r} is not a valid Avro name")
    if namespace and not _NAMESPACE.fullmatch(namespace):
        raise ValueError(f"namespace {namespace!r} is not a valid Avro namespace")


def column_path(parent: str, name: str) -> str:
    """The dotted path of a nested column, as error messages name it (`user.address`)."""
    return f"{parent}.{name}" if parent else name


# --- fields ------------------------------------------------------------------------------


def avro_field(name: str, original: str, avro_type: AvroType) -> dict[str, Any]:
    """A record field: a null default when nullable, the original name when sanitized."""
    field: dict[str, Any] = {"name": name, "type": avro_type}
    if is_nullable(avro_type):
        field["default"] = None
    if name != original:
        field[ORIGINAL_NAME] = original
    return field


def is_nullable(avro_type: AvroType) -> bool:
    """True when `avro_type` is `"null"` or a union with `"null"`."""
    return avro_type == "null" or (isinstance(avro_type, list) and "null" in avro_type)


def field_key(field: dict[str, Any]) -> str:
    """The name a field has in the data: its original name when it was sanitized."""
    return str(field.get(ORIGINAL_NAME, field["name"]))


# --- identity ----------------------------------------------------------------------------


def fingerprint(schema: AvroType) -> str:
    """CRC-64-AVRO fingerprint of the Parsing Canonical Form, 16 hex digits.

    Logical types, defaults and attributes are not part of the canonical form.
    """
    return str(_fastavro_fingerprint(to_parsing_canonical_form(schema), "CRC-64-AVRO"))


def schema_digest(schema: AvroType) -> str:
    """SHA-256 of the whole schema (keys sorted), 64 hex digits: differs whenever anything does."""
    text = json.dumps(schema, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return hashlib.sha256(text.encode("ascii")).hexdigest()
