"""Protobuf keys and values: the user's `.proto` compiled once, rows made messages.

The protobuf runtime cannot read `.proto` text, so the driver compiles it with protoc, which
grpcio-tools bundles as a Python extension (in process, no binary to fetch), into a
FileDescriptorSet whose bytes go to the tasks in their plan (`Encoding.descriptor`); tasks
build the message class from them with the runtime alone, once per process. The message
written is the first one the file declares at its top level; its full name (package and name)
is the record name of the subject strategies `record` and `topic_record`.

A row becomes a message through protobuf's JSON mapping: `json_format.ParseDict` of the JSON
values `spark_json.json_converter` makes of it (binary as base64, timestamps as RFC 3339 text,
as the mapping wants them), so an unknown field, a value of the wrong type or out of its
field's range is refused with the field's name. A `timestamp` is its instant; a
`timestamp_ntz` in a `google.protobuf.Timestamp` field is its wall clock read as UTC (as Spark
keeps it), in a `string` field its text without an offset. Confluent's wire format puts the
message's index path between the schema id and the message: for the first top-level message,
the one byte 0 (`FIRST_MESSAGE`).
"""

from __future__ import annotations

import functools
import math
import subprocess
import sys
import tempfile
from collections.abc import Callable
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    DataType,
    MapType,
    StringType,
    StructType,
    TimestampNTZType,
)

if TYPE_CHECKING:
    from google.protobuf.descriptor import Descriptor
    from google.protobuf.message import Message

# The message-index array of the first top-level message: Confluent writes a zig-zag varint
# count then each index, with a single 0 for [0].
FIRST_MESSAGE = b"\x00"
MAIN_FILE = "schema.proto"  # the name the user's text is compiled under
_PROTOC_TIMEOUT = 60.0
_TIMESTAMP = "google.protobuf.Timestamp"


class ProtoSchemaError(ValueError):
    """A `.proto` text that protoc refuses, or that declares no message."""


@functools.lru_cache(maxsize=64)
def compile_proto(text: str) -> bytes:
    """The FileDescriptorSet of `text` (serialized, its imports first and the file last).

    `google/protobuf/*.proto` may be imported; other imports (schema references) cannot.

    Raises:
        ProtoSchemaError: protoc's messages, on one line, or no message is declared.
    """
    from grpc_tools import protoc

    include = str(resources.files("grpc_tools") / "_proto")
    with tempfile.TemporaryDirectory(prefix="kts-proto-") as tmp:
        source, out = Path(tmp, MAIN_FILE), Path(tmp, "descriptor_set.pb")
        source.write_text(text, encoding="utf-8")
        args = [
            f"-I{tmp}",
            f"-I{include}",
            f"--descriptor_set_out={out}",
            "--include_imports",
            str(source),
        ]
        if protoc.main(["protoc", *args]) != 0:
            raise ProtoSchemaError(_protoc_errors(args, tmp))
        compiled = out.read_bytes()
    first_message(compiled)
    return compiled


def _protoc_errors(args: list[str], tmp: str) -> str:
    """What protoc says of the failed compilation: in process it writes to file descriptor 2,
    which cannot be captured without stealing other threads' output, so a child runs it again
    (only on this error path)."""
    done = subprocess.run(
        [sys.executable, "-m", "grpc_tools.protoc", *args],
        capture_output=True,
        text=True,
        timeout=_PROTOC_TIMEOUT,
        check=False,
    )
    lines = [line.replace(f"{tmp}/", "").strip() for line in done.stderr.splitlines()]
    return "; ".join(line for line in lines if line) or f"protoc exited {done.returncode}"


def first_message(descriptor_set: bytes) -> Descriptor:
    """The descriptor of the first top-level message of the set's last file.

    Raises:
        ProtoSchemaError: the file declares no message.
    """
    return message_class(descriptor_set).DESCRIPTOR


def full_name(text: str) -> str:
    """`package.Message` of the message `text` writes (`Message` without a package).

    Raises:
        ProtoSchemaError: protoc refuses `text`, or it declares no message.
    """
    return str(first_message(compile_proto(text)).full_name)


@functools.lru_cache(maxsize=64)
def message_class(descriptor_set: bytes) -> type[Message]:
    """The class of the message written with `descriptor_set` (`compile_proto`'s), built once
    per process in a pool of its own.

    Raises:
        ProtoSchemaError: the file declares no message.
    """
    from google.protobuf.message_factory import GetMessageClass

    files, pool = _pool(descriptor_set)
    main = files[-1]
    if not main.message_type:
        raise ProtoSchemaError("the .proto declares no message")
    name = f"{main.package}.{main.message_type[0].name}".lstrip(".")
    return GetMessageClass(pool.FindMessageTypeByName(name))


def _pool(descriptor_set: bytes) -> tuple[list[Any], Any]:
    from google.protobuf import descriptor_pb2, descriptor_pool

    files = list(descriptor_pb2.FileDescriptorSet.FromString(descriptor_set).file)
    pool = descriptor_pool.DescriptorPool()
    for file in files:  # protoc writes them dependencies first
        pool.Add(file)
    return files, pool


def type_mismatches(descriptor_set: bytes, data_type: DataType) -> list[str]:
    """Fields whose Spark type the JSON mapping would take silently as something else: a string
    into `bytes` (read as base64) or binary into `string` (written as base64 text)."""
    from google.protobuf.descriptor import FieldDescriptor

    def walk(descriptor: Any, struct: Any, path: str) -> list[str]:
        found: list[str] = []
        for spark_field in struct.fields:
            proto = descriptor.fields_by_name.get(spark_field.name)
            if proto is None:
                continue  # an unknown field is refused by the mapping, naming it
            spark_type = spark_field.dataType
            if isinstance(spark_type, ArrayType):
                spark_type = spark_type.elementType
            name = f"{path}{spark_field.name}"
            if proto.type == FieldDescriptor.TYPE_BYTES and isinstance(spark_type, StringType):
                found.append(f"{name}: string into bytes")
            elif proto.type == FieldDescriptor.TYPE_STRING and isinstance(spark_type, BinaryType):
                found.append(f"{name}: binary into string")
            elif proto.message_type is not None and isinstance(spark_type, StructType):
                found += walk(proto.message_type, spark_type, f"{name}.")
        return found

    if not isinstance(data_type, StructType):
        return []
    return walk(first_message(descriptor_set), data_type, "")


def payload_encoder(
    descriptor_set: bytes, data_type: DataType, column: str
) -> Callable[[Any], bytes]:
    """A function making a non-null value of `data_type` (a struct, as PySpark's rows carry
    it) the serialized message, without Confluent's prefix.

    The function raises ValueError naming the field a value does not fit."""
    from google.protobuf import json_format
    from google.protobuf.message import EncodeError

    from kafka_txn_sink.serde.spark_json import json_converter

    cls = message_class(descriptor_set)
    walls = timestamp_walls(first_message(descriptor_set), data_type, column)
    convert = json_converter(data_type, column, from_row_writer=True, utc_walls=walls)

    def payload(cell: Any) -> bytes:
        try:
            message = json_format.ParseDict(_special_floats(convert(cell)), cls())
            return bytes(message.SerializeToString())
        except (json_format.ParseError, EncodeError) as exc:  # EncodeError: a required field
            raise ValueError(str(exc)) from None

    return payload


def timestamp_walls(descriptor: Any, data_type: DataType, column: str) -> list[str]:
    """The timestamp_ntz fields of `data_type` that are `google.protobuf.Timestamp` fields of
    the message `descriptor`, by their paths in `json_converter` (`value.at`, `value.l[].at`,
    `value.m{}.at`)."""
    found: list[str] = []
    if not isinstance(data_type, StructType):
        return found
    for spark_field in data_type.fields:
        proto = descriptor.fields_by_name.get(spark_field.name)
        if proto is None or proto.message_type is None:
            continue
        spark_type, path, target = spark_field.dataType, f"{column}.{spark_field.name}", proto
        if isinstance(spark_type, MapType) and proto.message_type.GetOptions().map_entry:
            target = proto.message_type.fields_by_name["value"]
            spark_type, path = spark_type.valueType, f"{path}{{}}"
        elif isinstance(spark_type, ArrayType):
            spark_type, path = spark_type.elementType, f"{path}[]"
        if target.message_type is None:
            continue
        if isinstance(spark_type, TimestampNTZType):
            if target.message_type.full_name == _TIMESTAMP:
                found.append(path)
        else:
            found += timestamp_walls(target.message_type, spark_type, path)
    return found


@functools.lru_cache(maxsize=64)
def message_reader(text: str) -> Callable[[bytes], Any]:
    """A function reading what follows the schema id in Confluent's wire format (the message
    indexes, then the message) as a dict of protobuf's JSON mapping, with the field names of
    the `.proto` (64-bit integers as text, as the mapping has them).

    The function raises ValueError for data that is not such a message.

    Raises:
        ProtoSchemaError: protoc refuses `text`.
    """
    from google.protobuf import json_format
    from google.protobuf.message import DecodeError
    from google.protobuf.message_factory import GetMessageClass

    files, pool = _pool(compile_proto(text))
    package = files[-1].package
    top = [f"{package}.{m.name}".lstrip(".") for m in files[-1].message_type]

    def read(data: bytes) -> Any:
        path, offset = message_indexes(data)
        try:
            found = pool.FindMessageTypeByName(top[path[0]])
            for index in path[1:]:
                found = found.nested_types[index]
            message = GetMessageClass(found).FromString(data[offset:])
        except (IndexError, DecodeError) as exc:
            raise ValueError(f"not a message of the schema: {exc}") from None
        return json_format.MessageToDict(message, preserving_proto_field_name=True)

    return read


def _special_floats(value: Any) -> Any:
    """NaN and the infinities as the JSON mapping spells them ("NaN", "Infinity"): it refuses
    them as numbers, though `float` and `double` fields hold them."""
    if isinstance(value, float) and not math.isfinite(value):
        return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
    if isinstance(value, dict):
        return {k: _special_floats(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_special_floats(v) for v in value]
    return value


def message_indexes(data: bytes) -> tuple[list[int], int]:
    """The message's index path that `data` starts with (an empty array is [0]) and the offset
    of the message after it.

    Raises:
        ValueError: `data` ends within the array.
    """
    count, offset = _zigzag(data, 0)
    path = []
    for _ in range(count):
        index, offset = _zigzag(data, offset)
        if index < 0:
            raise ValueError(f"a negative message index ({index})")
        path.append(index)
    return path or [0], offset


def _zigzag(data: bytes, offset: int) -> tuple[int, int]:
    value, shift = 0, 0
    while True:
        if offset >= len(data):
            raise ValueError("the message indexes end before the message")
        byte = data[offset]
        offset += 1
        value |= (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            return (value >> 1) ^ -(value & 1), offset
