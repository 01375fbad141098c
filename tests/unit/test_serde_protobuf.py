"""The protobuf format without a registry: its options, the user's `.proto` compiled by protoc,
rows encoded in Confluent's wire format (read back with the message class, as a consumer
would), rows that do not fit the message refused by column, row and subject, and the reader
that `verify` uses."""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from datetime import datetime, timezone

import pytest
from pyspark.sql import Row
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    DataType,
    DoubleType,
    FloatType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from kafka_txn_sink.errors import ConfigError, InputError
from kafka_txn_sink.extras import MissingExtraError
from kafka_txn_sink.option_extras import checked_options
from kafka_txn_sink.serde.encode import FieldEncoder
from kafka_txn_sink.serde.protobuf import (
    ProtoSchemaError,
    compile_proto,
    full_name,
    message_class,
    message_indexes,
    message_reader,
)
from kafka_txn_sink.serde.resolve import Encoding, resolve

BASE = {"kafka.bootstrap.servers": "b:9092", "topic": "orders", "sinkId": "s", "commitLog": "/l"}
PROTOBUF = {"schema.registry.url": "http://127.0.0.1:1", "valueFormat": "protobuf"}
PROTO = """
syntax = "proto3";
package shop;
import "google/protobuf/timestamp.proto";

message Order {
  string id = 1;
  int32 visits = 2;
  bytes blob = 3;
  google.protobuf.Timestamp at = 4;
  repeated string tags = 5;
  Line line = 6;
  message Line { int64 n = 1; }
}
message Other { string x = 1; }
"""
LINE = StructType([StructField("n", LongType())])
ORDER = StructType(
    [
        StructField("id", StringType()),
        StructField("visits", LongType()),
        StructField("blob", BinaryType()),
        StructField("at", TimestampType()),
        StructField("tags", ArrayType(StringType())),
        StructField("line", LINE),
    ]
)
AT = datetime(2026, 11, 26, 12, 0, tzinfo=timezone.utc)
ROW = Row(id="o-1", visits=3, blob=bytearray(b"\x00\xff"), at=AT, tags=["a", "b"], line=Row(n=9))


def encoding(data_type: DataType = ORDER, text: str = PROTO) -> Encoding:
    return Encoding("value", "protobuf", "orders-value", 7, text, data_type, compile_proto(text))


# -- options -------------------------------------------------------------------------------------


@pytest.mark.parametrize("column", ["key", "value"])
def test_protobuf_without_its_schema_is_refused_naming_the_option(column: str) -> None:
    options = {**BASE, **PROTOBUF, "valueFormat": "raw", f"{column}Format": "protobuf"}
    message = f"option {column}Schema is required with {column}Format=protobuf: the message's"
    with pytest.raises(ConfigError, match="^" + re.escape(message)):
        checked_options(options)


def test_with_the_latest_version_protobuf_needs_no_schema() -> None:
    serde = checked_options({**BASE, **PROTOBUF, "useLatestVersion": "true"}).serde
    assert (serde.value.format, serde.value.schema, serde.use_latest) == ("protobuf", None, True)


def test_the_proto_is_kept_as_given_for_the_registry_s_lookup_of_the_same_file() -> None:
    # Apicurio looks a .proto up by its bytes: the text registered from a file ends with its
    # newline, and the sink must send the same text.
    serde = checked_options({**BASE, **PROTOBUF, "valueSchema": PROTO}).serde
    assert serde.value.schema == PROTO


def test_protobuf_without_its_extra_is_refused_with_the_install_line(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import importlib.util

    real: Callable[..., object] = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec",
        lambda name, package=None: None if name == "grpc_tools" else real(name, package),
    )
    with pytest.raises(MissingExtraError) as caught:
        checked_options({**BASE, **PROTOBUF, "valueSchema": PROTO})
    assert str(caught.value) == (
        "option valueFormat=protobuf needs the protobuf extra (grpc_tools not installed): "
        "pip install 'kafka-txn-sink[protobuf]'"
    )


def test_a_column_that_is_not_a_struct_is_refused_before_the_registry_is_called() -> None:
    serde = checked_options({**BASE, **PROTOBUF, "valueSchema": PROTO}).serde
    schema = StructType([StructField("value", StringType())])
    with pytest.raises(ConfigError, match=r"^option valueFormat=protobuf needs column value to "
                                          r"be a struct \(the message's fields\), not string"):
        resolve(serde, schema, "orders")


# -- compiling -----------------------------------------------------------------------------------


def test_the_message_written_is_the_first_one_named_with_its_package() -> None:
    assert full_name(PROTO) == "shop.Order"
    assert full_name('syntax = "proto3"; message Bare { string x = 1; }') == "Bare"
    assert compile_proto(PROTO) is compile_proto(PROTO)  # once per process


def test_a_proto_that_does_not_compile_is_refused_with_protoc_s_message() -> None:
    with pytest.raises(ProtoSchemaError, match=r"^schema\.proto:1:\d+: .*strin"):
        compile_proto('syntax = "proto3"; message X { strin id = 1; }')


def test_a_proto_without_a_message_is_refused() -> None:
    with pytest.raises(ProtoSchemaError, match="declares no message"):
        compile_proto('syntax = "proto3"; enum E { A = 0; }')


# -- encoding ------------------------------------------------------------------------------------


def test_rows_are_messages_after_the_id_and_the_first_message_index() -> None:
    e = encoding()
    encoded = FieldEncoder(e).cells([ROW, None], first_row=0)

    assert encoded[1] is None  # a null value stays null: a tombstone
    assert encoded[0] is not None and encoded[0][:6] == b"\x00\x00\x00\x00\x07\x00"
    message = message_class(e.descriptor).FromString(encoded[0][6:])
    assert (message.id, message.visits, message.blob) == ("o-1", 3, b"\x00\xff")
    assert message.at.ToDatetime(tzinfo=timezone.utc) == AT
    assert (list(message.tags), message.line.n) == (["a", "b"], 9)


def test_the_arrow_path_encodes_the_same_bytes_as_the_row_path() -> None:
    import pyarrow as pa

    arrow_type = pa.struct([
        ("id", pa.string()), ("visits", pa.int64()), ("blob", pa.binary()),
        ("at", pa.timestamp("us", tz="UTC")), ("tags", pa.list_(pa.string())),
        ("line", pa.struct([("n", pa.int64())])),
    ])
    cell = {**ROW.asDict(), "line": {"n": 9}}
    array = pa.array([cell, None], type=arrow_type)

    rows = FieldEncoder(encoding()).cells([ROW, None], 0)
    assert FieldEncoder(encoding()).array(array, 0) == rows


def test_a_null_field_is_left_unset() -> None:
    e = encoding()
    (encoded,) = FieldEncoder(e).cells([Row(id="o-2", visits=None, blob=None, at=None,
                                            tags=None, line=None)], 0)
    assert encoded is not None
    message = message_class(e.descriptor).FromString(encoded[6:])
    assert message.id == "o-2" and not message.HasField("line") and message.visits == 0


@pytest.mark.parametrize(
    ("data_type", "row", "found"),
    [
        (
            StructType([StructField("id", StringType()), StructField("colour", StringType())]),
            Row(id="o", colour="red"),
            'Message type "shop.Order" has no field named "colour"',
        ),
        (StructType([StructField("visits", LongType())]), Row(visits=2**40),
         "Failed to parse visits field: Value out of range: 1099511627776"),
        (StructType([StructField("visits", StringType())]), Row(visits="many"),
         "Failed to parse visits field: "),
        (StructType([StructField("line", IntegerType())]), Row(line=4),
         "Failed to parse line field"),
    ],
    ids=["unknown field", "out of range", "wrong type", "scalar for a message"],
)
def test_a_row_that_does_not_fit_names_the_column_row_and_subject(
    data_type: StructType, row: Row, found: str
) -> None:
    with pytest.raises(InputError) as caught:
        FieldEncoder(encoding(data_type)).cells([row], first_row=41)
    message = str(caught.value)
    assert message.startswith(
        "column value of row 41 of this task does not fit its protobuf schema (subject "
        "'orders-value', id 7): "
    )
    assert found in message and message.endswith("nothing of the batch is written")


@pytest.mark.parametrize(
    ("field", "spark_type", "found"),
    [
        ("blob", StringType(), "blob: string into bytes"),
        ("id", BinaryType(), "id: binary into string"),
        ("line", StructType([StructField("n", LongType()), StructField("x", BinaryType())]),
         None),
    ],
    ids=["string into bytes", "binary into string", "nested, unknown field left to the mapping"],
)
def test_a_string_for_bytes_or_binary_for_string_is_refused_before_the_registry_is_called(
    field: str, spark_type: DataType, found: str | None
) -> None:
    """protobuf's JSON mapping reads a string as base64 for a `bytes` field: "abcd" would be
    written as three other bytes, silently."""
    serde = checked_options({**BASE, **PROTOBUF, "valueSchema": PROTO}).serde
    schema = StructType([StructField("value", StructType([StructField(field, spark_type)]))])
    if found is None:
        with pytest.raises(Exception) as caught:  # the registry at 127.0.0.1:1 is asked: no check
            resolve(serde, schema, "orders")
        assert not isinstance(caught.value, ConfigError), caught.value
        return
    with pytest.raises(ConfigError, match=f"^option valueSchema does not fit .*{found}"):
        resolve(serde, schema, "orders")


def test_nan_and_the_infinities_are_written_to_float_fields() -> None:
    proto = 'syntax = "proto3"; message M { double d = 1; repeated float f = 2; }'
    data_type = StructType(
        [StructField("d", DoubleType()), StructField("f", ArrayType(FloatType()))]
    )
    e = encoding(data_type, proto)
    (encoded,) = FieldEncoder(e).cells([Row(d=float("nan"), f=[float("inf"), -float("inf")])], 0)

    assert encoded is not None
    message = message_class(e.descriptor).FromString(encoded[6:])
    assert math.isnan(message.d) and list(message.f) == [float("inf"), -float("inf")]


def test_a_missing_required_field_names_the_column_row_and_subject() -> None:
    proto = 'syntax = "proto2"; message M { required string id = 1; optional int32 n = 2; }'
    data_type = StructType([StructField("n", IntegerType())])
    with pytest.raises(InputError, match=r"^column value of row 5 .*missing required fields: id"):
        FieldEncoder(encoding(data_type, proto)).cells([Row(n=1)], first_row=5)


def test_a_negative_message_index_is_not_a_message_of_the_schema() -> None:
    with pytest.raises(ValueError, match="negative message index"):
        message_indexes(b"\x02\x01")  # one index, zig-zag 1 = -1


# -- reading back --------------------------------------------------------------------------------


def test_the_reader_takes_the_message_indexes_then_the_message() -> None:
    (encoded,) = FieldEncoder(encoding()).cells([ROW], 0)
    assert encoded is not None

    assert message_reader(PROTO)(encoded[5:]) == {
        "id": "o-1",
        "visits": 3,
        "blob": "AP8=",
        "at": "2026-11-26T12:00:00Z",
        "tags": ["a", "b"],
        "line": {"n": "9"},  # int64 as text, as protobuf's JSON mapping has it
    }
    other = message_class(compile_proto(PROTO)).FromString(b"")  # Order
    assert other.DESCRIPTOR.full_name == "shop.Order"
    assert message_reader(PROTO)(b"\x02\x02" + b"\x0a\x01z") == {"x": "z"}  # [1]: Other


def test_message_indexes_are_zigzag_varints_and_an_empty_array_is_the_first_message() -> None:
    assert message_indexes(b"\x00rest") == ([0], 1)
    assert message_indexes(b"\x04\x02\x00rest") == ([1, 0], 3)
    with pytest.raises(ValueError, match="end before the message"):
        message_indexes(b"\x04\x02")
