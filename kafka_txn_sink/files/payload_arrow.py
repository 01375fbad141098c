"""Payload mode on the Arrow write path: a file's JSON payloads read by Arrow's JSON reader and
encoded natively, when that gives exactly what the row path gives.

Arrow's reader (`pyarrow.json`) types JSON almost by `json_schema`'s rules: integers widen to
double, integers beyond 64 bits are doubles, objects become structs whose fields are merged by
name in first-seen order, arrays merge their elements, a field missing from an object is null.
Where the rules make a union (a string and a number at one position, a boolean and a number),
it fails; it also fails on duplicate keys, lone surrogates, numbers beyond a double and (across
its blocks) a null before an object at one position. It builds a list whose first element is
null before a number as an invalid array, which validation finds. It reads ISO-like strings as
timestamps, which the rules keep as strings.

A file's spool is read in chunks of about `CHUNK_BYTES`, so memory stays bounded whatever the
file's size. First each chunk's types give the rules' aggregated type of its objects
(from the Arrow types and where the nulls are), merged over the chunks by
`json_schema.merge` and finalized by `json_schema.finalize`: names, defaults and nullability
are the row path's own. Then each chunk is encoded natively: as first read when its types are
the file's (its top-level timestamp columns read again as text) and the first pass kept it (up
to `KEEP_BYTES`), else read again under the explicit Arrow schema of the file's type.
`encode_file` gives None where the result would differ from the row path's: a union,
a record without fields, an array of nulls, a reader's failure. The caller writes such a file
by the row path from the same spool. The spool holds one payload per line, so a payload with a
line break never comes here.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.json as pa_json
from polars_avro import AvroError

from kafka_txn_sink.files.arrow_avro import NativeEncoder, all_valid, list_parts, shape
from kafka_txn_sink.files.avro_names import AvroType, avro_field, avro_field_names, is_nullable
from kafka_txn_sink.files.json_schema import finalize, merge
from kafka_txn_sink.files.payload_spool import CHUNK_BYTES, Chunk
from kafka_txn_sink.files.plan import Codec

ROOT = "Payload"
KEEP_BYTES = 2 * CHUNK_BYTES  # of Arrow data read in the first pass and encoded without a reread
_READ_FAILURES = (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError)


class _Unsupported(Exception):
    """The native path cannot write this file as the rules say; the row path will."""


@dataclass(frozen=True)
class NativeFile:
    """A file the native path writes: its Avro schema and the blocks `(records, data)`."""

    schema: dict[str, Any]
    blocks: Iterator[tuple[int, bytes]]


def encode_file(spool: Path, chunks: Sequence[Chunk], codec: Codec) -> NativeFile | None:
    """The file of the payloads in `spool`, natively encoded; None when the row path must write
    it. The blocks may read the spool again: iterating them may raise `ValueError` (a chunk
    Arrow read once and not under the file's schema; the caller then takes the row path)."""
    aggregated: AvroType | None = None
    kept: list[pa.Table] = []  # the first chunks as read, while they fit in KEEP_BYTES
    for index, chunk in enumerate(chunks):
        table = _read(spool, chunk)
        if table is None:
            return None
        try:
            kind = _record(ROOT, table.schema.names, [c.chunks for c in table.columns])
        except _Unsupported:
            return None
        aggregated = kind if aggregated is None else merge(aggregated, kind, ROOT)
        if len(kept) == index and sum(t.nbytes for t in kept) + table.nbytes <= KEEP_BYTES:
            kept.append(table)  # the first chunks only: the rest are read again
    if not isinstance(aggregated, dict):
        return None
    schema = finalize(aggregated)
    try:
        target = pa.schema(_target_fields(schema["fields"]))
        arrow = pa.schema(_arrow_fields(schema["fields"]))
    except _Unsupported:
        return None
    encoder = NativeEncoder(target, codec)
    try:
        if shape(encoder.derived_schema()) != shape(_encoded_form(schema)):
            return None
    except (AvroError, ValueError, pa.ArrowException):
        return None
    return NativeFile(schema, _blocks(spool, chunks, kept, arrow, schema, encoder))


def _blocks(
    spool: Path,
    chunks: Sequence[Chunk],
    kept: list[pa.Table],
    arrow: pa.Schema,
    schema: dict[str, Any],
    encoder: NativeEncoder,
) -> Iterator[tuple[int, bytes]]:
    for index, chunk in enumerate(chunks):
        table = _reusable(kept[index], spool, chunk, arrow) if index < len(kept) else None
        if table is None:
            table = _read(spool, chunk, arrow)
        if table is None:
            raise ValueError("a chunk of payloads does not read under the file's schema")
        data = _conformed(table, schema["fields"])
        for batch in data.to_batches():
            yield from encoder.blocks(pa.Table.from_batches([batch]))


def _reusable(table: pa.Table, spool: Path, chunk: Chunk, arrow: pa.Schema) -> pa.Table | None:
    """A chunk as first read, when it has the file's types: its top-level timestamp columns are
    read again as their JSON text (a cheaper read than all of it)."""
    temporal = [i for i, t in enumerate(table.schema.types) if pa.types.is_temporal(t)]
    if temporal:
        names = [table.schema.field(i).name for i in temporal]
        text = pa.schema([pa.field(name, pa.string()) for name in names])
        strings = _read(spool, chunk, text, others="ignore")
        if strings is None:
            return None
        for index, name in zip(temporal, names, strict=True):
            table = table.set_column(index, text.field(name), strings.column(name))
    return table if table.schema == arrow else None


def _read(
    spool: Path, chunk: Chunk, explicit: pa.Schema | None = None, others: str = "error"
) -> pa.Table | None:
    """The payloads of `chunk`, typed by Arrow, or under `explicit` with `others` ("error" or
    "ignore") for fields it lacks; None when Arrow's reader fails or reads another number of
    rows (the row path then parses and reports)."""
    with open(spool, "rb") as f:
        f.seek(chunk.start)
        data = f.read(chunk.end - chunk.start)
    options = pa_json.ParseOptions(
        explicit_schema=explicit, unexpected_field_behavior=others if explicit else "infer"
    )
    try:
        table = pa_json.read_json(pa.BufferReader(data), parse_options=options)
        # pyarrow 26's reader builds `[null, 0]` as an invalid list (offsets beyond its values).
        table.validate()
    except _READ_FAILURES:
        return None
    return table if table.num_rows == chunk.rows else None


# --- the rules' type, from Arrow types and nulls ---------------------------------------------


def _record(path: str, keys: list[str], children: list[list[pa.Array]]) -> AvroType:
    names = avro_field_names(keys)
    fields = [
        avro_field(name, key, _position(f"{path}_{name}", arrays))
        for name, key, arrays in zip(names, keys, children, strict=True)
    ]
    return {"type": "record", "name": path, "fields": fields}


def _position(path: str, arrays: list[pa.Array]) -> AvroType:
    """The aggregated type of every value at one position (`arrays`: its chunks)."""
    kind = _kind(path, arrays)
    if kind != "null" and any(a.null_count for a in arrays):
        return merge(kind, "null", path)
    return kind


def _kind(path: str, arrays: list[pa.Array]) -> AvroType:
    arrow = arrays[0].type
    if pa.types.is_temporal(arrow):
        return "string"  # an ISO-like string: the rules keep the text
    simple = _SIMPLE.get(arrow)
    if simple is not None:
        return simple
    if pa.types.is_struct(arrow):
        valid = [a.filter(a.is_valid()) if a.null_count else a for a in arrays]
        keys = [arrow.field(i).name for i in range(arrow.num_fields)]
        children = [[a.field(i) for a in valid] for i in range(arrow.num_fields)]
        return _record(path, keys, children)
    if pa.types.is_list(arrow):
        elements = [e for e in (a.flatten() for a in arrays) if len(e)]
        items: AvroType = _position(f"{path}_item", elements) if elements else []
        if items == "null":
            raise _Unsupported(f"{path}: an array of nulls")  # Avro "null" items: not encoded
        return {"type": "array", "items": items}
    raise _Unsupported(f"{path}: Arrow type {arrow}")


_SIMPLE: dict[pa.DataType, str] = {
    pa.null(): "null",
    pa.bool_(): "boolean",
    pa.int64(): "long",
    pa.float64(): "double",
    pa.string(): "string",
}
_ARROW: dict[str, pa.DataType] = {avro: arrow for arrow, avro in _SIMPLE.items()}


# --- Arrow schemas of the final type: to read under, and to encode ------------------------------
#
# A field of type "null" takes no bytes in Avro, so it is left out of what is encoded (arrow-avro
# would write it as a union). An array whose items were never seen ("null" items, every array
# empty) encodes as counts alone, like an empty array of longs.


def _arrow_fields(fields: list[dict[str, Any]]) -> list[pa.Field]:
    """The fields as Arrow's reader must type them (original names, every field)."""
    return [pa.field(_key(f), _arrow_type(f["type"])) for f in fields]


def _arrow_type(avro_type: AvroType) -> pa.DataType:
    inner = _non_null(avro_type)
    if isinstance(inner, str):
        return _ARROW[inner]
    if inner["type"] == "array":
        return pa.list_(_arrow_type(inner["items"]))
    return pa.struct(_arrow_fields(inner["fields"]))


def _target_fields(fields: list[dict[str, Any]]) -> list[pa.Field]:
    """The fields as the encoder is given them: Avro names, the schema's nullability, no
    "null" fields."""
    kept = [
        pa.field(f["name"], _target_type(f["type"]), nullable=is_nullable(f["type"]))
        for f in fields
        if f["type"] != "null"
    ]
    if not kept:
        raise _Unsupported("a record without fields to encode")
    return kept


def _target_type(avro_type: AvroType) -> pa.DataType:
    inner = _non_null(avro_type)
    if isinstance(inner, str):
        return _ARROW[inner]
    if inner["type"] == "array":
        items = inner["items"]
        if items == "null":
            return pa.list_(pa.field("item", pa.int64(), nullable=False))
        return pa.list_(pa.field("item", _target_type(items), nullable=is_nullable(items)))
    return pa.struct(_target_fields(inner["fields"]))


def _non_null(avro_type: AvroType) -> Any:
    if isinstance(avro_type, list):
        members = [m for m in avro_type if m != "null"]
        if len(members) != 1:
            raise _Unsupported(f"union {avro_type}")
        return members[0]
    return avro_type


def _key(field: dict[str, Any]) -> str:
    return str(field.get("originalName", field["name"]))


def _encoded_form(avro_type: Any) -> Any:
    """`avro_type` as the encoder is given it: "null" fields left out, never-seen items long."""
    if isinstance(avro_type, list):
        return [_encoded_form(m) for m in avro_type]
    if not isinstance(avro_type, dict):
        return avro_type
    if avro_type["type"] == "array":
        items = avro_type["items"]
        return {**avro_type, "items": "long" if items == "null" else _encoded_form(items)}
    fields = [
        {**f, "type": _encoded_form(f["type"])} for f in avro_type["fields"] if f["type"] != "null"
    ]
    return {**avro_type, "fields": fields}


# --- the data, rebuilt for the encoder ---------------------------------------------------------


def _conformed(table: pa.Table, fields: list[dict[str, Any]]) -> pa.Table:
    """`table` (read under the file's schema) as the encoder's target table."""
    columns = [
        pa.chunked_array([_conform(chunk, f["type"]) for chunk in column.chunks])
        for column, f in zip(table.columns, fields, strict=True)
        if f["type"] != "null"
    ]
    return pa.Table.from_arrays(columns, schema=pa.schema(_target_fields(fields)))


def _conform(array: pa.Array, avro_type: AvroType) -> pa.Array:
    """`array` rebuilt as the encoder's target type of `avro_type` (Avro names, the schema's
    nullability, "null" fields left out)."""
    inner = _non_null(avro_type)
    if isinstance(inner, str):
        return array
    if inner["type"] == "array":
        offsets, values = list_parts(array)
        items = inner["items"]
        # Items never seen: every array is empty (`_kind` refuses arrays of nulls).
        values = pa.array([], pa.int64()) if items == "null" else _conform(values, items)
        return pa.ListArray.from_arrays(
            offsets, values, type=_target_type(inner), mask=_nulls(array)
        )
    children = []
    for index, field in enumerate(inner["fields"]):
        if field["type"] == "null":
            continue
        child = _conform(array.field(index), field["type"])
        if child.null_count and not is_nullable(field["type"]):
            child = all_valid(child)  # its nulls are all under null structs (see _kind)
        children.append(child)
    target = _target_type(inner)
    return pa.StructArray.from_arrays(children, fields=list(target), mask=_nulls(array))


def _nulls(array: pa.Array) -> pa.Array | None:
    return array.is_null() if array.null_count else None
