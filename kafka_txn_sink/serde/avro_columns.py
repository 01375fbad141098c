"""Avro datums of a whole Arrow column at once: the Arrow writer's Avro keys and values.

Avro's binary encoding of a record is its fields' encodings one after the other, so a column of
records can be encoded field by field over all rows with pyarrow and numpy, without a Python
call per row: `int` and `long` as zig-zag varints, `float` and `double` as little-endian IEEE
754, `boolean` as one byte, `string` and `bytes` as a varint length and the bytes, a nullable
`["null", T]` as the branch index then T, a record as its fields in order. Dates, timestamps
(micros) and local timestamps are the int or long Arrow already holds.

It is used only for the schema derived from the column's Spark type (so fields are matched by
position, and no value needs a range check) and only for the types above; for any other type
(arrays, maps, decimals) `datums` gives None, and so it does when a field that is not
nullable holds a null under a valid parent: the caller then takes the row path, which encodes
with fastavro or names the row at fault. The bytes are the ones fastavro writes (tested).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

_EMPTY = pa.scalar(b"", pa.binary())
_NULL_BRANCH = pa.scalar(b"\x00", pa.binary())
_VALUE_BRANCH = pa.scalar(b"\x02", pa.binary())  # branch 1, zig-zag encoded


class Unsupported(Exception):
    """The column holds a type or a value the vectorized encoder leaves to the row path."""


def datums(array: pa.Array, schema: Any, prefix: bytes) -> list[bytes | None] | None:
    """`prefix` + the Avro datum of each row of `array` under `schema` (parsed Avro JSON); None
    for a null row; None instead of the list when the row path must encode the column."""
    if isinstance(array, pa.ChunkedArray):
        array = array.combine_chunks()
    try:
        encoded = _encode(array, schema)
    except Unsupported:
        return None
    joined = pc.binary_join_element_wise(pa.scalar(prefix, pa.binary()), encoded, _EMPTY)
    if array.null_count:
        joined = pc.if_else(array.is_valid(), joined, pa.scalar(None, pa.binary()))
    result: list[bytes | None] = joined.to_pylist()
    return result


def _encode(array: pa.Array, schema: Any) -> pa.Array:
    """The datums of `array` under `schema`, never null (a null row's bytes are left unused)."""
    if isinstance(schema, list):
        return _union(array, schema)
    kind = schema["type"] if isinstance(schema, dict) else schema
    if kind == "record":
        return _record(array, schema)
    if isinstance(schema, dict) and isinstance(kind, (dict, list)):
        return _encode(array, kind)
    if isinstance(schema, dict) and "logicalType" in schema:
        return _logical(array, schema)
    return _primitive(array, kind)


def _record(array: pa.Array, schema: dict[str, Any]) -> pa.Array:
    if not pa.types.is_struct(array.type) or array.type.num_fields != len(schema["fields"]):
        raise Unsupported
    parts = []
    for index, field in enumerate(schema["fields"]):
        child = _child(array, index)
        if not _allows_null(field["type"]) and _has_visible_null(child, array):
            raise Unsupported  # the row path names the column and the row
        parts.append(_encode(child, field["type"]))
    if not parts:
        return pa.array([b""] * len(array), pa.binary())
    return pc.binary_join_element_wise(*parts, _EMPTY)


def _union(array: pa.Array, branches: list[Any]) -> pa.Array:
    if len(branches) != 2 or "null" not in branches:
        raise Unsupported
    if branches[0] != "null":
        raise Unsupported  # ["T", "null"]: not what the derived schemas write
    value = pc.binary_join_element_wise(_VALUE_BRANCH, _encode(array, branches[1]), _EMPTY)
    return pc.if_else(array.is_valid(), value, _NULL_BRANCH) if array.null_count else value


def _primitive(array: pa.Array, kind: str) -> pa.Array:
    arrow = array.type
    if kind in ("int", "long") and pa.types.is_integer(arrow):
        return _varints(_zigzag(_int64(array)))
    if kind == "boolean" and pa.types.is_boolean(arrow):
        flags = _filled(array, False).to_numpy(zero_copy_only=False).astype(np.uint8)
        return _fixed(flags.reshape(-1, 1))
    if kind == "double" and pa.types.is_floating(arrow):
        return _fixed(_filled(array, 0.0).to_numpy().astype("<f8").view(np.uint8).reshape(-1, 8))
    if kind == "float" and pa.types.is_floating(arrow):
        return _fixed(_filled(array, 0.0).to_numpy().astype("<f4").view(np.uint8).reshape(-1, 4))
    if kind in ("string", "bytes") and _is_bytes(arrow):
        return _length_prefixed(array)
    if kind == "null" and pa.types.is_null(arrow):
        return pa.array([b""] * len(array), pa.binary())
    raise Unsupported


def _logical(array: pa.Array, schema: dict[str, Any]) -> pa.Array:
    logical, arrow = schema["logicalType"], array.type
    if logical == "date" and pa.types.is_date32(arrow):
        return _varints(_zigzag(_filled(array.view(pa.int32()), 0).to_numpy().astype(np.int64)))
    micros = logical in ("timestamp-micros", "local-timestamp-micros")
    if micros and pa.types.is_timestamp(arrow) and arrow.unit == "us":
        return _varints(_zigzag(_filled(array.view(pa.int64()), 0).to_numpy()))
    raise Unsupported


def _length_prefixed(array: pa.Array) -> pa.Array:
    try:
        data = array if pa.types.is_binary(array.type) else array.cast(pa.binary())
    except pa.ArrowInvalid:
        raise Unsupported from None  # a large column beyond 32-bit offsets
    data = _filled(data, b"")
    lengths = pc.binary_length(data).to_numpy().astype(np.int64)
    return pc.binary_join_element_wise(_varints(_zigzag(lengths)), data, _EMPTY)


def _varints(values: np.ndarray) -> pa.Array:
    """Unsigned 64-bit values as Avro varints (7 bits a byte, low first, high bit: more)."""
    n = len(values)
    groups = np.empty((n, 10), dtype=np.uint8)
    lengths = np.ones(n, dtype=np.int32)
    rest = values.copy()
    for k in range(10):
        groups[:, k] = (rest & np.uint64(0x7F)).astype(np.uint8)
        rest = rest >> np.uint64(7)
        more = rest != 0
        groups[:, k] |= more.astype(np.uint8) << 7
        lengths += more
    mask = np.arange(10, dtype=np.int32) < lengths[:, None]
    return _binary(np.concatenate(([0], np.cumsum(lengths, dtype=np.int64))), groups[mask])


def _fixed(matrix: np.ndarray) -> pa.Array:
    """Each row of a (n, width) byte matrix as one binary value."""
    n, width = matrix.shape
    return _binary(np.arange(0, (n + 1) * width, width, dtype=np.int64), matrix)


def _binary(offsets: np.ndarray, data: np.ndarray) -> pa.Array:
    """A binary array of `data`'s bytes cut at `offsets` (one more than the values)."""
    if offsets[-1] >= 2**31:
        raise Unsupported  # beyond 32-bit offsets: the row path has no such limit
    starts = pa.py_buffer(offsets.astype(np.int32))
    return pa.Array.from_buffers(
        pa.binary(), len(offsets) - 1, [None, starts, pa.py_buffer(np.ascontiguousarray(data))]
    )


def _zigzag(values: np.ndarray) -> np.ndarray:
    signed = values.astype(np.int64)
    return ((signed << 1) ^ (signed >> 63)).view(np.uint64)


def _int64(array: pa.Array) -> np.ndarray:
    return _filled(array.cast(pa.int64()), 0).to_numpy()


def _filled(array: pa.Array, value: Any) -> pa.Array:
    return pc.fill_null(array, value) if array.null_count else array


def _child(array: pa.StructArray, index: int) -> pa.Array:
    # field() ignores the struct's offset in older pyarrow; flatten() applies it, and the
    # parent's nulls too, which only the null branch of the parent then covers.
    return array.flatten()[index] if array.offset else array.field(index)


def _allows_null(schema: Any) -> bool:
    return schema == "null" or (isinstance(schema, list) and "null" in schema)


def _has_visible_null(child: pa.Array, parent: pa.Array) -> bool:
    if not child.null_count:
        return False
    visible = pc.and_(child.is_null(), parent.is_valid())
    return bool(pc.any(visible).as_py())


def _is_bytes(arrow: pa.DataType) -> bool:
    # Spark 4 sends strings and binary as the large types by default
    # (spark.sql.execution.arrow.useLargeVarTypes).
    return any(
        check(arrow)
        for check in (
            pa.types.is_string,
            pa.types.is_binary,
            pa.types.is_large_string,
            pa.types.is_large_binary,
        )
    )
