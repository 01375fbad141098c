"""Avro blocks encoded natively from Arrow columns: Spark-schema mode on the Arrow write path.

The rows of an Arrow batch are encoded by arrow-avro (Rust, through polars-avro's sink), in C
speed and without one Python object per row. polars-avro derives the file's schema from the
Arrow types and writes a header and sync markers of its own; the sink's files must carry
`spark_avro.spark_to_avro`'s schema (names, `originalName`, defaults, the namespace) and the
sync marker of `naming.FileNaming`. So each chunk is encoded into a small Avro file in memory,
its blocks are taken out (count, size, compressed data: the format of the block does not
depend on the header) and appended to the sink's file behind its own header and marker.

The encoding is only used when it is exactly the one of the sink's schema: `NativeEncoder.for_`
compares the schema arrow-avro derives for the batch's types (with Spark's nullability and the
Avro field names) with the sink's, names aside, and gives None when they differ (a `void`
column: arrow-avro writes `["null", "null"]`; a nanosecond timestamp; a user-defined type); the
caller then takes the row path. Spark writes the fields of a null struct as nulls, even
fields its type says are not nullable, which Arrow refuses under such a type: `prepare` then
rebuilds those fields without their hidden nulls, and gives None (the row path, which names the
column and row) only for a null where Spark's type allows none and no null struct hides it.

Direct use of `polars_avro._avro_rs` (its sink takes any Arrow stream) avoids a round trip
through a polars DataFrame, which has no map type and would write maps as arrays.
"""

from __future__ import annotations

import io
import json
from collections.abc import Iterator
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from polars_avro import AvroError
from polars_avro import Codec as NativeCodec
from polars_avro._avro_rs import AvroBuffSink
from pyspark.sql.types import ArrayType, DataType, MapType, StructType

from kafka_txn_sink.files.avro_names import avro_field_names
from kafka_txn_sink.files.plan import Codec

_CODECS: dict[Codec, NativeCodec | None] = {
    "null": None,
    "deflate": NativeCodec.Deflate,
    "snappy": NativeCodec.Snappy,
    "zstandard": NativeCodec.Zstandard,
}
_MAGIC = b"Obj\x01"
_SYNC_SIZE = 16


class NativeEncoder:
    """Encodes Arrow tables of one schema into Avro blocks of the sink's schema."""

    def __init__(self, target: pa.Schema, codec: Codec) -> None:
        """Encode tables of `target` (Avro field names, Spark's nullability) with `codec`."""
        self._target = target
        self._codec = _CODECS[codec]

    @classmethod
    def for_(
        cls, arrow: pa.Schema, spark: StructType, avro: dict[str, Any], codec: Codec
    ) -> NativeEncoder | None:
        """An encoder of tables of `arrow` (the data columns, in the order of `spark`) into
        blocks of `avro`; None when arrow-avro's encoding would not be `avro`'s."""
        if len(arrow) != len(spark.fields):
            return None
        encoder = cls(_target_struct(pa.struct(list(arrow)), spark), codec)
        try:
            derived = encoder.derived_schema()
        except (AvroError, TypeError, ValueError, pa.ArrowException):
            return None
        return encoder if shape(derived) == shape(avro) else None

    def prepare(self, batch: pa.RecordBatch) -> pa.Table | None:
        """`batch` (the data columns) as a table of the target schema, without copying data;
        None when a value is null where its Spark type allows none (the row path decides)."""
        columns: list[pa.Array] = []
        for column, field in zip(batch.columns, self._target, strict=True):
            if column.null_count and not field.nullable:
                return None
            try:
                columns.append(column.view(field.type))
            except pa.ArrowInvalid:  # nulls in fields that are not nullable: under null structs?
                conformed = _conform(column, field.type)
                if conformed is None:
                    return None
                columns.append(conformed)
        return pa.Table.from_arrays(columns, schema=self._target)

    def derived_schema(self) -> dict[str, Any]:
        """The schema arrow-avro writes for the target types (names are its own)."""
        data = self._encode(self._target.empty_table())
        metadata, _ = _read_header(data)
        schema: dict[str, Any] = json.loads(metadata["avro.schema"])
        return schema

    def blocks(self, table: pa.Table) -> Iterator[tuple[int, bytes]]:
        """`(records, data)` of each block encoding `table` (from `prepare`), data compressed
        by the codec."""
        if any(chunk.offset for column in table.columns for chunk in column.chunks):
            # arrow-rs 59 panics importing a slice of a struct of structs; a copy starts at 0.
            table = table.take(pa.array(range(table.num_rows), pa.int64()))
        data = self._encode(table)
        _, position = _read_header(data)
        while position < len(data):
            records, position = _read_long(data, position)
            size, position = _read_long(data, position)
            yield records, data[position : position + size]
            position += size + _SYNC_SIZE

    def _encode(self, table: pa.Table) -> bytes:
        out = io.BytesIO()
        sink = AvroBuffSink(out, table, self._codec)
        if table.num_rows:
            sink.write(table)
        sink.close()
        return out.getvalue()


def block_bytes(records: int, data: bytes, marker: bytes) -> bytes:
    """One Avro block as a file holds it: count, size, the data, the file's sync marker."""
    return _long_bytes(records) + _long_bytes(len(data)) + data + marker


def shape(avro_type: Any) -> Any:
    """What of an Avro type decides its binary encoding: names, defaults and docs left out."""
    if isinstance(avro_type, list):
        return tuple(shape(member) for member in avro_type)
    if not isinstance(avro_type, dict):
        return avro_type
    kind = avro_type["type"]
    if kind == "record":
        return ("record", tuple(shape(f["type"]) for f in avro_type["fields"]))
    if kind == "array":
        return ("array", shape(avro_type["items"]))
    if kind == "map":
        return ("map", shape(avro_type["values"]))
    if not isinstance(kind, str):
        return shape(kind)
    details = ("logicalType", "precision", "scale", "size", "symbols")
    return (kind, *(avro_type.get(key) for key in details))


def _target_struct(arrow: pa.StructType, spark: StructType) -> pa.Schema:
    """The fields of `arrow` under their Avro names, with the nullability of Spark's."""
    if arrow.num_fields != len(spark.fields):
        raise ValueError("the Arrow and Spark schemas differ")
    return pa.schema(
        [
            pa.field(name, _target_type(arrow.field(i).type, f.dataType), nullable=f.nullable)
            for i, (name, f) in enumerate(
                zip(avro_field_names(spark.names), spark.fields, strict=True)
            )
        ]
    )


def _target_type(arrow: pa.DataType, spark: DataType) -> pa.DataType:
    """`arrow` with the Avro names and the nullability Spark's type gives its nested fields."""
    if isinstance(spark, StructType) and pa.types.is_struct(arrow):
        return pa.struct(list(_target_struct(arrow, spark)))
    if isinstance(spark, ArrayType) and (pa.types.is_list(arrow) or pa.types.is_large_list(arrow)):
        item = pa.field(
            arrow.value_field.name,
            _target_type(arrow.value_type, spark.elementType),
            nullable=spark.containsNull,
        )
        return pa.list_(item) if pa.types.is_list(arrow) else pa.large_list(item)
    if isinstance(spark, MapType) and pa.types.is_map(arrow):
        item = pa.field(
            arrow.item_field.name,
            _target_type(arrow.item_type, spark.valueType),
            nullable=spark.valueContainsNull,
        )
        return pa.map_(arrow.key_field, item)
    return arrow


def _conform(array: pa.Array, target: pa.DataType) -> pa.Array | None:
    """`array` rebuilt as `target` (the same layout, other names and nullability), the nulls of
    fields that are not nullable dropped where a null struct hides them; None for a null that
    nothing hides (nothing hides list elements and map values: Spark gives a null list no
    elements)."""
    if pa.types.is_struct(target):
        return _conform_struct(array, target)
    if pa.types.is_map(target):
        offsets, entries = list_parts(array)
        items = _conform(entries.field(1), target.item_type)
        if items is None or (items.null_count and not target.item_field.nullable):
            return None
        return pa.MapArray.from_arrays(
            offsets, entries.field(0), items, type=target, mask=_nulls(array)
        )
    if pa.types.is_list(target) or pa.types.is_large_list(target):
        offsets, elements = list_parts(array)
        values = _conform(elements, target.value_type)
        if values is None or (values.null_count and not target.value_field.nullable):
            return None
        return type(array).from_arrays(offsets, values, type=target, mask=_nulls(array))
    return array if array.type == target else array.view(target)


def _conform_struct(array: pa.StructArray, target: pa.StructType) -> pa.Array | None:
    children = []
    for i, field in enumerate(target):
        child = _conform(array.field(i), field.type)
        if child is None:
            return None
        if child.null_count and not field.nullable:
            if pc.any(pc.and_(child.is_null(), array.is_valid())).as_py():
                return None
            child = all_valid(child)
        children.append(child)
    return pa.StructArray.from_arrays(children, fields=list(target), mask=_nulls(array))


def _nulls(array: pa.Array) -> pa.Array | None:
    return array.is_null() if array.null_count else None


def list_parts(array: pa.Array) -> tuple[pa.Array, pa.Array]:
    """The offsets of a list or map array, from 0, and the values (entries) they index."""
    offsets = array.offsets
    first, last = offsets[0].as_py(), offsets[-1].as_py()
    values = array.values.slice(first, last - first)
    return (pc.subtract(offsets, pa.scalar(first, offsets.type)) if first else offsets), values


def all_valid(array: pa.Array) -> pa.Array:
    """`array` without its validity bitmap: every null in it is under a null struct."""
    if pa.types.is_struct(array.type):
        children = [array.field(i) for i in range(array.type.num_fields)]
        return pa.StructArray.from_arrays(children, fields=list(array.type))
    if pa.types.is_map(array.type):
        offsets, entries = list_parts(array)
        return pa.MapArray.from_arrays(offsets, entries.field(0), entries.field(1), type=array.type)
    if array.type.num_fields:  # a list
        offsets, values = list_parts(array)
        return type(array).from_arrays(offsets, values, type=array.type)
    own = array.buffers()[: array.type.num_buffers]
    return pa.Array.from_buffers(array.type, len(array), [None, *own[1:]], 0, array.offset)


# --- the Avro container format, as far as blocks go ----------------------------------------


def _read_header(data: bytes) -> tuple[dict[str, bytes], int]:
    """The metadata of an Avro file's header, and where its first block starts."""
    if not data.startswith(_MAGIC):
        raise ValueError("the native encoder did not write an Avro file")
    position = len(_MAGIC)
    metadata: dict[str, bytes] = {}
    while True:
        count, position = _read_long(data, position)
        if count == 0:
            return metadata, position + _SYNC_SIZE
        if count < 0:
            count = -count
            _, position = _read_long(data, position)  # the byte size of the map block
        for _ in range(count):
            key, position = _read_bytes(data, position)
            value, position = _read_bytes(data, position)
            metadata[key.decode()] = value


def _read_bytes(data: bytes, position: int) -> tuple[bytes, int]:
    size, position = _read_long(data, position)
    return data[position : position + size], position + size


def _read_long(data: bytes, position: int) -> tuple[int, int]:
    """A zig-zag varint long at `position`; and the position after it."""
    shift = 0
    result = 0
    while True:
        byte = data[position]
        position += 1
        result |= (byte & 0x7F) << shift
        if byte < 0x80:
            return (result >> 1) ^ -(result & 1), position
        shift += 7


def _long_bytes(value: int) -> bytes:
    encoded = (value << 1) ^ (value >> 63)
    out = bytearray()
    while encoded > 0x7F:
        out.append((encoded & 0x7F) | 0x80)
        encoded >>= 7
    out.append(encoded)
    return bytes(out)
