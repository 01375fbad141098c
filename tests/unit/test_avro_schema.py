"""Avro schemas of files mode: the Spark mapping, the JSON merge rules, and fastavro round trips."""

from __future__ import annotations

import io
import json
import math
import re
import time
from datetime import date, datetime, timedelta, timezone
from decimal import Decimal
from functools import reduce
from typing import Any

import fastavro
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    BooleanType,
    ByteType,
    CharType,
    DataType,
    DateType,
    DayTimeIntervalType,
    DecimalType,
    DoubleType,
    FloatType,
    IntegerType,
    LongType,
    MapType,
    NullType,
    Row,
    ShortType,
    StringType,
    StructField,
    StructType,
    TimestampNTZType,
    TimestampType,
    UserDefinedType,
    VarcharType,
    VariantType,
    YearMonthIntervalType,
    _create_row,
)

from kafka_txn_sink.errors import InputError
from kafka_txn_sink.files.avro_schema import (
    AvroType,
    Irreconcilable,
    SchemaAggregator,
    avro_field_names,
    finalize,
    fingerprint,
    infer,
    merge,
    row_converter,
    schema_digest,
    spark_to_avro,
)

PROPERTY = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def roundtrip(schema: dict[str, Any], records: list[dict[str, Any]]) -> list[Any]:
    """Write `records` into an in-memory Avro file (strict) and read them back."""
    buffer = io.BytesIO()
    fastavro.writer(buffer, fastavro.parse_schema(schema), records, strict=True)
    buffer.seek(0)
    return list(fastavro.reader(buffer))


def same(a: Any, b: Any) -> bool:
    """Deep equality where NaN equals NaN."""
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    return bool(a == b)


def row_of(schema: StructType, *values: Any) -> Row:
    """A Row as PySpark's writer builds them."""
    return _create_row(schema.names, list(values))


def aggregate(objs: list[Any], mode: Irreconcilable = "union") -> SchemaAggregator:
    aggregator = SchemaAggregator(irreconcilable=mode)
    for obj in objs:
        aggregator.add(obj)
    return aggregator


def field_types(schema: dict[str, Any]) -> dict[str, AvroType]:
    return {f["name"]: f["type"] for f in schema["fields"]}


# --- names ---------------------------------------------------------------------------------


def test_valid_names_are_kept_and_invalid_ones_sanitized() -> None:
    assert avro_field_names(["a", "_b", "C9"]) == ["a", "_b", "C9"]
    assert avro_field_names(["a-b", "1x", "", "é", "x y"]) == ["a_b", "_1x", "_", "__1", "x_y"]


def test_a_sanitized_name_never_takes_a_valid_name_of_the_record() -> None:
    # "a_b" comes later but keeps its name; the sanitized "a-b" gets the suffix.
    assert avro_field_names(["a-b", "a_b", "a.b"]) == ["a_b_1", "a_b", "a_b_2"]


def test_duplicate_valid_names_get_suffixes() -> None:
    assert avro_field_names(["a", "a", "a_1"]) == ["a", "a_2", "a_1"]


# --- fingerprints --------------------------------------------------------------------------


def test_fingerprint_is_crc64_of_the_canonical_form() -> None:
    schema = {"type": "record", "name": "R", "fields": [{"name": "x", "type": "long"}]}
    expected = fastavro.schema.fingerprint(
        fastavro.schema.to_parsing_canonical_form(schema), "CRC-64-AVRO"
    )
    assert fingerprint(schema) == expected
    assert re.fullmatch(r"[0-9a-f]{16}", fingerprint(schema))


def test_fingerprint_ignores_logical_types_but_the_digest_does_not() -> None:
    def decimal_schema(scale: int) -> dict[str, Any]:
        decimal = {"type": "bytes", "logicalType": "decimal", "precision": 10, "scale": scale}
        return {"type": "record", "name": "R", "fields": [{"name": "x", "type": decimal}]}

    assert fingerprint(decimal_schema(2)) == fingerprint(decimal_schema(4))
    assert schema_digest(decimal_schema(2)) != schema_digest(decimal_schema(4))
    assert schema_digest(decimal_schema(2)) == schema_digest(
        json.loads(json.dumps(decimal_schema(2)))
    )


# --- Spark schema -> Avro ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("spark_type", "avro_type"),
    [
        (StringType(), "string"),
        (CharType(3), "string"),
        (VarcharType(3), "string"),
        (BooleanType(), "boolean"),
        (ByteType(), "int"),
        (ShortType(), "int"),
        (IntegerType(), "int"),
        (LongType(), "long"),
        (FloatType(), "float"),
        (DoubleType(), "double"),
        (BinaryType(), "bytes"),
        (DateType(), {"type": "int", "logicalType": "date"}),
        (TimestampType(), {"type": "long", "logicalType": "timestamp-micros"}),
        (TimestampNTZType(), {"type": "long", "logicalType": "local-timestamp-micros"}),
        (
            DecimalType(12, 3),
            {"type": "bytes", "logicalType": "decimal", "precision": 12, "scale": 3},
        ),
        (ArrayType(LongType(), False), {"type": "array", "items": "long"}),
        (ArrayType(LongType(), True), {"type": "array", "items": ["null", "long"]}),
        (MapType(StringType(), IntegerType(), False), {"type": "map", "values": "int"}),
        (MapType(StringType(), IntegerType(), True), {"type": "map", "values": ["null", "int"]}),
    ],
)
def test_spark_types_map_to_avro(spark_type: DataType, avro_type: AvroType) -> None:
    schema = spark_to_avro(StructType([StructField("x", spark_type, False)]))
    assert schema["fields"] == [{"name": "x", "type": avro_type}]
    fastavro.parse_schema(schema)


def test_nullable_fields_are_unions_with_null_first_and_a_null_default() -> None:
    schema = spark_to_avro(
        StructType([StructField("x", LongType(), True), StructField("y", LongType(), False)])
    )
    assert schema == {
        "type": "record",
        "name": "Row",
        "namespace": "kafka_txn_sink",
        "fields": [
            {"name": "x", "type": ["null", "long"], "default": None},
            {"name": "y", "type": "long"},
        ],
    }
    assert roundtrip(schema, [{"x": None, "y": 1}]) == [{"x": None, "y": 1}]


def test_null_type_is_null_whatever_the_nullability() -> None:
    schema = spark_to_avro(StructType([StructField("v", NullType(), False)]))
    assert schema["fields"] == [{"name": "v", "type": "null", "default": None}]
    assert roundtrip(
        schema, [row_converter(StructType([StructField("v", NullType(), False)]))((None,))]
    )


def test_nested_struct_records_are_named_by_path_and_unique() -> None:
    inner = StructType([StructField("c", LongType())])
    schema = StructType(
        [
            StructField("a_b", StructType([StructField("c", inner)])),
            StructField("a", StructType([StructField("b_c", inner)])),
            StructField("xs", ArrayType(inner)),
            StructField("m", MapType(StringType(), inner)),
        ]
    )
    avro = spark_to_avro(schema, name="Log", namespace="")
    text = json.dumps(avro)
    names = re.findall(r'"type": "record", "name": "(\w+)"', text)
    assert names == [
        "Log",
        "Log_a_b",
        "Log_a_b_c",
        "Log_a",
        "Log_a_b_c_2",  # the path a.b_c gives the same name as a_b.c
        "Log_xs_item",
        "Log_m_value",
    ]
    assert "namespace" not in avro
    fastavro.parse_schema(avro)


def test_spark_field_names_are_sanitized_and_the_original_kept() -> None:
    schema = StructType(
        [
            StructField("user-id", LongType(), False),
            StructField("user_id", LongType(), False),
            StructField("1st", LongType(), False),
            StructField("1st", LongType(), False),
        ]
    )
    avro = spark_to_avro(schema)
    assert avro["fields"] == [
        {"name": "user_id_1", "type": "long", "originalName": "user-id"},
        {"name": "user_id", "type": "long"},
        {"name": "_1st", "type": "long", "originalName": "1st"},
        {"name": "_1st_1", "type": "long", "originalName": "1st"},
    ]
    record = row_converter(schema)(row_of(schema, 1, 2, 3, 4))
    assert record == {"user_id_1": 1, "user_id": 2, "_1st": 3, "_1st_1": 4}
    assert roundtrip(avro, [record]) == [record]


@pytest.mark.parametrize(
    ("spark_type", "column"),
    [
        (MapType(IntegerType(), StringType()), "outer.m"),
        (DayTimeIntervalType(), "outer.m"),
        (YearMonthIntervalType(), "outer.m"),
        (VariantType(), "outer.m"),
        (ArrayType(MapType(LongType(), LongType())), "outer.m[]"),
    ],
)
def test_types_avro_cannot_hold_are_input_errors_naming_the_column(
    spark_type: DataType, column: str
) -> None:
    schema = StructType([StructField("outer", StructType([StructField("m", spark_type)]))])
    with pytest.raises(InputError, match=re.escape(f"column {column} ")):
        spark_to_avro(schema)
    with pytest.raises(InputError):
        row_converter(schema)


def test_invalid_record_names_are_refused() -> None:
    with pytest.raises(ValueError, match="not a valid Avro name"):
        spark_to_avro(StructType([]), name="my-row")
    with pytest.raises(ValueError, match="not a valid Avro name"):
        spark_to_avro(StructType([]), name="long")
    with pytest.raises(ValueError, match="namespace"):
        spark_to_avro(StructType([]), namespace="a..b")


class Point:
    def __init__(self, x: float, y: float) -> None:
        self.x, self.y = x, y


class PointUDT(UserDefinedType):
    @classmethod
    def sqlType(cls) -> DataType:
        return ArrayType(DoubleType(), False)

    @classmethod
    def module(cls) -> str:
        return __name__

    def serialize(self, obj: Point) -> list[float]:
        return [obj.x, obj.y]

    def deserialize(self, datum: Any) -> Point:
        return Point(*datum)


def test_user_defined_types_are_written_as_their_sql_type() -> None:
    schema = StructType([StructField("p", PointUDT(), True)])
    avro = spark_to_avro(schema)
    assert avro["fields"][0]["type"] == ["null", {"type": "array", "items": "double"}]
    convert = row_converter(schema)
    records = [convert(row_of(schema, Point(1.0, 2.5))), convert(row_of(schema, None))]
    assert roundtrip(avro, records) == [{"p": [1.0, 2.5]}, {"p": None}]


# --- Spark rows -> Avro records --------------------------------------------------------------

ALL_TYPES = StructType(
    [
        StructField("s", StringType()),
        StructField("b", BooleanType()),
        StructField("i8", ByteType()),
        StructField("i16", ShortType()),
        StructField("i32", IntegerType()),
        StructField("i64", LongType()),
        StructField("f32", FloatType()),
        StructField("f64", DoubleType()),
        StructField("bin", BinaryType()),
        StructField("d", DateType()),
        StructField("ts", TimestampType()),
        StructField("ntz", TimestampNTZType()),
        StructField("dec", DecimalType(38, 18)),
        StructField("tags", ArrayType(StringType())),
        StructField("attrs", MapType(StringType(), LongType())),
        StructField("user", StructType([StructField("name", StringType(), False)])),
    ]
)


def test_rows_as_pyspark_gives_them_read_back_with_their_values() -> None:
    instant = datetime(2024, 3, 31, 1, 30, 0, 123456, tzinfo=timezone.utc)
    # PySpark's writer gets timestamps as naive datetimes in the worker's local time zone.
    local_naive = instant.astimezone().replace(tzinfo=None)
    row = _create_row(
        ALL_TYPES.names,
        [
            "é",
            True,
            -128,
            32767,
            -(2**31),
            2**63 - 1,
            1.5,
            0.1,
            bytearray(b"\x00\xff"),
            date(1, 1, 1),
            local_naive,
            datetime(9999, 12, 31, 23, 59, 59, 999999),
            Decimal("-12345678901234567890.123456789012345678"),
            ["a", None],
            {"k": 1, "n": None},
            _create_row(["name"], ["ann"]),
        ],
    )
    avro = spark_to_avro(ALL_TYPES)
    [back] = roundtrip(avro, [row_converter(ALL_TYPES)(row)])
    assert back == {
        "s": "é",
        "b": True,
        "i8": -128,
        "i16": 32767,
        "i32": -(2**31),
        "i64": 2**63 - 1,
        "f32": 1.5,
        "f64": 0.1,
        "bin": b"\x00\xff",
        "d": date(1, 1, 1),
        "ts": instant,
        "ntz": datetime(9999, 12, 31, 23, 59, 59, 999999),
        "dec": Decimal("-12345678901234567890.123456789012345678"),
        "tags": ["a", None],
        "attrs": {"k": 1, "n": None},
        "user": {"name": "ann"},
    }


def test_naive_timestamps_are_read_in_the_local_time_zone(monkeypatch: pytest.MonkeyPatch) -> None:
    schema = StructType([StructField("ts", TimestampType(), False)])
    instant = datetime(2024, 7, 1, 12, 0, 0, 1, tzinfo=timezone.utc)
    monkeypatch.setenv("TZ", "America/New_York")
    time.tzset()
    try:
        # What PySpark's writer hands over in a worker running in New York (EDT, UTC-4).
        naive = instant.astimezone().replace(tzinfo=None)
        assert naive == datetime(2024, 7, 1, 8, 0, 0, 1)
        [back] = roundtrip(spark_to_avro(schema), [row_converter(schema)((naive,))])
    finally:
        monkeypatch.undo()
        time.tzset()
    assert back["ts"] == instant


def test_aware_timestamps_are_written_as_the_same_instant() -> None:
    schema = StructType([StructField("ts", TimestampType(), False)])
    aware = datetime(2024, 1, 1, 12, 0, tzinfo=timezone(timedelta(hours=-5)))
    [back] = roundtrip(spark_to_avro(schema), [row_converter(schema)((aware,))])
    assert back["ts"] == aware
    assert back["ts"].tzinfo == timezone.utc


def test_a_null_in_a_non_nullable_column_names_the_column() -> None:
    schema = StructType(
        [StructField("user", StructType([StructField("id", LongType(), False)]), True)]
    )
    with pytest.raises(InputError, match=r"column user\.id is null"):
        row_converter(schema)(row_of(schema, _create_row(["id"], [None])))
    assert row_converter(schema)(row_of(schema, None)) == {"user": None}
    elements = StructType([StructField("xs", ArrayType(LongType(), False))])
    with pytest.raises(InputError, match=r"column xs\[\] holds a null"):
        row_converter(elements)(row_of(elements, [1, None]))
    values = StructType([StructField("m", MapType(StringType(), LongType(), False))])
    with pytest.raises(InputError, match=r"column m\{\} holds a null"):
        row_converter(values)(row_of(values, {"a": None}))


def test_structs_given_as_dicts_are_read_by_name() -> None:
    schema = StructType(
        [
            StructField(
                "u", StructType([StructField("a", LongType()), StructField("b-c", LongType())])
            )
        ]
    )
    assert row_converter(schema)(({"b-c": 2, "a": 1},)) == {"u": {"a": 1, "b_c": 2}}
    assert row_converter(schema)({"u": None}) == {"u": None}


def test_a_row_of_the_wrong_length_is_an_input_error() -> None:
    with pytest.raises(InputError, match="has 1 values, its schema 2 columns"):
        row_converter(StructType([StructField("a", LongType()), StructField("b", LongType())]))(
            (1,)
        )


# --- JSON inference: one test per rule of the table ------------------------------------------


def test_rule_null() -> None:
    assert infer(None) == "null"
    schema = aggregate([{"x": None}]).schema()
    assert schema["fields"] == [{"name": "x", "type": "null", "default": None}]


def test_rule_boolean_is_never_widened_to_a_number() -> None:
    assert infer(True) == "boolean"
    assert merge("boolean", "long") == ["boolean", "long"]
    aggregator = aggregate([{"x": True}, {"x": 1}])
    assert field_types(aggregator.schema())["x"] == ["boolean", "long"]
    assert roundtrip(aggregator.schema(), [aggregator.conform({"x": True})]) == [{"x": True}]


def test_rule_every_integer_is_long_and_beyond_64_bits_double() -> None:
    assert infer(1) == "long"
    assert infer(2**63 - 1) == "long"
    assert infer(-(2**63)) == "long"
    assert infer(2**63) == "double"
    aggregator = aggregate([{"x": 10**400}])
    assert roundtrip(aggregator.schema(), [aggregator.conform({"x": 10**400})]) == [{"x": math.inf}]


def test_rule_other_numbers_are_double() -> None:
    assert infer(1.5) == "double"
    objs = [{"x": math.nan}, {"x": -math.inf}, {"x": 0.1}]
    aggregator = aggregate(objs)
    back = roundtrip(aggregator.schema(), [aggregator.conform(o) for o in objs])
    assert same(back, objs)


def test_rule_strings_with_lone_surrogates_are_written_with_replacement_characters() -> None:
    assert infer("a") == "string"
    obj = json.loads('{"s": "x\\ud800y", "t": "\\ud83d\\ude00"}')
    aggregator = aggregate([obj])
    assert roundtrip(aggregator.schema(), [aggregator.conform(obj)]) == [
        {"s": "x\ufffdy", "t": "\U0001f600"}
    ]


def test_rule_objects_are_records_named_by_path_with_fields_in_first_seen_order() -> None:
    assert infer({"b": 1, "a": {"c": "x"}}, "Payload") == {
        "type": "record",
        "name": "Payload",
        "fields": [
            {"name": "b", "type": "long"},
            {
                "name": "a",
                "type": {
                    "type": "record",
                    "name": "Payload_a",
                    "fields": [{"name": "c", "type": "string"}],
                },
            },
        ],
    }
    schema = aggregate([{"z": 1}, {"a": 1, "z": 2}]).schema()
    assert [f["name"] for f in schema["fields"]] == ["z", "a"]


def test_rule_empty_object_is_a_record_without_fields() -> None:
    aggregator = aggregate([{"e": {}}, {}])
    schema = aggregator.schema()
    assert field_types(schema)["e"] == [
        "null",
        {"type": "record", "name": "Payload_e", "fields": []},
    ]
    assert roundtrip(schema, [aggregator.conform({"e": {}}), aggregator.conform({})]) == [
        {"e": {}},
        {"e": None},
    ]
    empty = SchemaAggregator().schema()
    assert empty == {"type": "record", "name": "Payload", "namespace": "kafka_txn_sink",
                     "fields": []}  # fmt: skip
    fastavro.parse_schema(empty)


def test_rule_array_elements_are_merged() -> None:
    assert infer([1, 2.5, None]) == {"type": "array", "items": ["null", "double"]}
    assert infer([1, "a"]) == {"type": "array", "items": ["long", "string"]}
    assert infer([1, "a"], irreconcilable="string") == {"type": "array", "items": "string"}


def test_rule_empty_array_takes_the_element_type_of_other_arrays() -> None:
    assert infer([]) == {"type": "array", "items": []}
    aggregator = aggregate([{"t": []}, {"t": ["a"]}, {"t": []}])
    assert field_types(aggregator.schema())["t"] == {"type": "array", "items": "string"}
    only_empty = aggregate([{"t": []}, {"t": []}])
    assert field_types(only_empty.schema())["t"] == {"type": "array", "items": "null"}
    assert roundtrip(only_empty.schema(), [only_empty.conform({"t": []})]) == [{"t": []}]


def test_rule_null_and_t_is_a_nullable_union_with_a_null_default() -> None:
    assert merge("long", "null") == ["null", "long"]
    assert merge("null", "string") == ["null", "string"]
    schema = aggregate([{"x": 1}, {"x": None}]).schema()
    assert schema["fields"] == [{"name": "x", "type": ["null", "long"], "default": None}]


def test_rule_missing_fields_become_nullable_with_a_null_default() -> None:
    objs = [{"a": 1}, {"b": "x"}]
    aggregator = aggregate(objs)
    assert aggregator.schema()["fields"] == [
        {"name": "a", "type": ["null", "long"], "default": None},
        {"name": "b", "type": ["null", "string"], "default": None},
    ]
    assert [aggregator.conform(o) for o in objs] == [{"a": 1, "b": None}, {"a": None, "b": "x"}]


def test_rule_int_widens_to_long_to_double() -> None:
    assert merge("long", "double") == "double"
    assert merge(["null", "long", "string"], "double") == ["null", "double", "string"]
    objs = [{"x": 1}, {"x": 2.5}]
    aggregator = aggregate(objs)
    assert field_types(aggregator.schema())["x"] == "double"
    conformed = [aggregator.conform(o) for o in objs]
    assert conformed == [{"x": 1.0}, {"x": 2.5}]
    assert isinstance(conformed[0]["x"], float)
    assert roundtrip(aggregator.schema(), conformed) == conformed


def test_rule_objects_merge_by_field_name_recursively() -> None:
    objs = [{"user": {"id": 1, "address": {"city": "x"}}}, {"user": {"address": {"zip": 9}}}]
    aggregator = aggregate(objs)
    user = field_types(aggregator.schema())["user"]
    assert user == {
        "type": "record",
        "name": "Payload_user",
        "fields": [
            {"name": "id", "type": ["null", "long"], "default": None},
            {
                "name": "address",
                "type": {
                    "type": "record",
                    "name": "Payload_user_address",
                    "fields": [
                        {"name": "city", "type": ["null", "string"], "default": None},
                        {"name": "zip", "type": ["null", "long"], "default": None},
                    ],
                },
            },
        ],
    }
    back = roundtrip(aggregator.schema(), [aggregator.conform(o) for o in objs])
    assert back[1] == {"user": {"id": None, "address": {"city": None, "zip": 9}}}


def test_rule_record_names_are_unique_in_the_schema() -> None:
    objs = [{"a_b": {"c": {"x": 1}}, "a": {"b_c": {"y": 1}}, "l": [{"q": 1}], "l_item": {}}]
    schema = aggregate(objs).schema()
    names = re.findall(r'"type": "record", "name": "(\w+)"', json.dumps(schema))
    assert names == [
        "Payload",
        "Payload_a_b",
        "Payload_a_b_c",
        "Payload_a",
        "Payload_a_b_c_2",
        "Payload_l_item",
        "Payload_l_item_2",
    ]
    fastavro.parse_schema(schema)


def test_rule_arrays_merge_into_one_array() -> None:
    assert merge({"type": "array", "items": "long"}, {"type": "array", "items": "string"}) == {
        "type": "array",
        "items": ["long", "string"],
    }
    objs = [{"t": [1]}, {"t": [{"k": "v"}, None]}]
    aggregator = aggregate(objs)
    assert field_types(aggregator.schema())["t"] == {
        "type": "array",
        "items": [
            "null",
            "long",
            {
                "type": "record",
                "name": "Payload_t_item",
                "fields": [{"name": "k", "type": "string"}],
            },
        ],
    }
    assert roundtrip(aggregator.schema(), [aggregator.conform(o) for o in objs]) == objs


def test_rule_invalid_field_names_are_sanitized_and_the_original_kept() -> None:
    objs = [{"a-b": 1, "1x": 2, "": 3, "é": 4}, {"a_b": 5}]
    aggregator = aggregate(objs)
    assert aggregator.schema()["fields"] == [
        {"name": "a_b_1", "type": ["null", "long"], "default": None, "originalName": "a-b"},
        {"name": "_1x", "type": ["null", "long"], "default": None, "originalName": "1x"},
        {"name": "_", "type": ["null", "long"], "default": None, "originalName": ""},
        {"name": "__1", "type": ["null", "long"], "default": None, "originalName": "é"},
        {"name": "a_b", "type": ["null", "long"], "default": None},
    ]
    back = roundtrip(aggregator.schema(), [aggregator.conform(o) for o in objs])
    assert back == [
        {"a_b_1": 1, "_1x": 2, "_": 3, "__1": 4, "a_b": None},
        {"a_b_1": None, "_1x": None, "_": None, "__1": None, "a_b": 5},
    ]


def test_rule_other_mixes_become_a_union_with_one_member_per_kind() -> None:
    objs = [{"v": "s"}, {"v": {"k": 1}}, {"v": [1]}, {"v": 2}, {"v": False}, {"v": None}]
    aggregator = aggregate(objs)
    assert field_types(aggregator.schema())["v"] == [
        "null",
        "boolean",
        "long",
        "string",
        {"type": "array", "items": "long"},
        {"type": "record", "name": "Payload_v", "fields": [{"name": "k", "type": "long"}]},
    ]
    assert roundtrip(aggregator.schema(), [aggregator.conform(o) for o in objs]) == objs


def test_rule_other_mixes_become_string_when_asked() -> None:
    objs = [{"v": "s"}, {"v": {"k": 1}}, {"v": [1, "x"]}, {"v": 2.5}, {"v": False}, {"v": None}]
    aggregator = aggregate(objs, "string")
    assert field_types(aggregator.schema())["v"] == ["null", "string"]
    back = roundtrip(aggregator.schema(), [aggregator.conform(o) for o in objs])
    assert [r["v"] for r in back] == ["s", '{"k":1}', '[1,"x"]', "2.5", "false", None]
    assert merge("string", {"type": "array", "items": "long"}, irreconcilable="string") == "string"


@pytest.mark.parametrize(
    "objs",
    [
        [{"t": [1]}, {"t": ["a"]}],
        [{"t": [[1]]}, {"t": [[], [None]]}],
        [{"x": 1}, {"x": 2**63}],
        [{"x": 1.5}, {"x": 2**70}],
        [{"x": {"a": 1}}, {"x": {"a": 1, "b": 2}}, {"x": {}}],
        [{"x": None}, {"x": {"a": True}}, {"x": {"a": 1}}],
    ],
)
def test_values_the_schema_does_not_cover_yet_are_merged(objs: list[dict[str, Any]]) -> None:
    aggregator = aggregate(objs)
    folded = reduce(lambda a, b: merge(a, b), [infer(o) for o in objs])
    assert aggregator.schema() == finalize(folded)
    conformed = [aggregator.conform(o) for o in objs]
    assert roundtrip(aggregator.schema(), conformed) == conformed


def test_conform_refuses_what_was_not_aggregated() -> None:
    aggregator = aggregate([{"x": 1}])
    with pytest.raises(InputError, match="at x"):
        aggregator.conform({"x": "a"})
    with pytest.raises(InputError, match="the root"):
        aggregator.conform({"y": 1})


def test_payloads_must_be_json_objects_of_json_values() -> None:
    with pytest.raises(InputError, match="must be a JSON object"):
        SchemaAggregator().add([1])
    with pytest.raises(InputError, match="not a JSON value"):
        SchemaAggregator().add({"x": Decimal(1)})


def test_adding_after_conform_updates_the_schema() -> None:
    aggregator = aggregate([{"x": 1}])
    assert aggregator.conform({"x": 1}) == {"x": 1}
    aggregator.add({"y": True})
    assert aggregator.conform({"x": 1}) == {"x": 1, "y": None}
    assert aggregator.count == 2


# --- property-based tests -------------------------------------------------------------------

# Few keys and small values, so that objects often share fields whose types have to merge.
KEYS = st.sampled_from(["a", "b", "a-b", "a_b", "1x", "", "é", "\ud800"])
SCALARS = (
    st.none()
    | st.booleans()
    | st.integers(-(2**65), 2**65)
    | st.sampled_from([2**63 - 1, 2**63, -(2**63), -(2**63) - 1, 10**400])
    | st.floats()
    | st.text(max_size=4)
    | st.sampled_from(["\ud800x", "é", ""])
)
JSON_VALUES = st.recursive(
    SCALARS,
    lambda children: st.lists(children, max_size=3) | st.dictionaries(KEYS, children, max_size=3),
    max_leaves=8,
)
OBJECTS = st.lists(st.dictionaries(KEYS, JSON_VALUES, max_size=4), min_size=1, max_size=8)
MODES = st.sampled_from(["union", "string"])


@PROPERTY
@given(objs=OBJECTS, mode=MODES)
def test_every_aggregated_object_reads_back_under_the_final_schema(
    objs: list[dict[str, Any]], mode: Irreconcilable
) -> None:
    aggregator = aggregate(objs, mode)
    conformed = [aggregator.conform(o) for o in objs]
    back = roundtrip(aggregator.schema(), conformed)
    assert len(back) == len(objs)
    assert same(back, conformed)
    for obj, record in zip(objs, conformed, strict=True):
        assert_preserved(obj, record, aggregator.schema(), mode)


@PROPERTY
@given(objs=OBJECTS, mode=MODES)
def test_the_aggregator_equals_merging_every_inferred_type(
    objs: list[dict[str, Any]], mode: Irreconcilable
) -> None:
    folded = reduce(
        lambda a, b: merge(a, b, "Payload", mode), [infer(o, "Payload", mode) for o in objs]
    )
    assert aggregate(objs, mode).schema() == finalize(folded)


@PROPERTY
@given(value=JSON_VALUES, mode=MODES)
def test_merging_a_type_with_itself_changes_nothing(value: Any, mode: Irreconcilable) -> None:
    inferred = infer(value, "Payload", mode)
    assert merge(inferred, inferred, "Payload", mode) == inferred


def clean(value: Any) -> Any:
    """`value` with lone surrogates replaced, as Avro strings hold them."""
    if isinstance(value, str):
        return re.sub("[\ud800-\udfff]", "\ufffd", value)
    if isinstance(value, list):
        return [clean(v) for v in value]
    if isinstance(value, dict):
        return {clean(k): clean(v) for k, v in value.items()}
    return value


def member_for(value: Any, members: list[Any]) -> AvroType:
    def kind(t: AvroType) -> str:
        if isinstance(t, dict):
            return str(t["type"])
        return "number" if t in ("long", "double") else str(t)

    if value is None:
        wanted = "null"
    elif isinstance(value, bool):
        wanted = "boolean"
    elif isinstance(value, (int, float)):
        wanted = "number"
    elif isinstance(value, str):
        wanted = "string"
    else:
        wanted = "array" if isinstance(value, list) else "record"
    matches = [m for m in members if kind(m) == wanted]
    return matches[0] if matches else "string"  # string mode: everything else is a string


def assert_preserved(value: Any, conformed: Any, avro_type: AvroType, mode: str) -> None:
    """The conformed value holds the same information as the payload value."""
    if isinstance(avro_type, list):
        avro_type = member_for(value, avro_type)
    if avro_type == "string":
        if isinstance(value, str):
            assert conformed == clean(value)
        else:
            assert mode == "string"
            assert same(json.loads(conformed), clean(value))
    elif avro_type == "double":
        try:
            expected = float(value)
        except OverflowError:
            expected = math.inf if value > 0 else -math.inf
        assert same(conformed, expected)
    elif isinstance(avro_type, dict) and avro_type["type"] == "array":
        assert len(conformed) == len(value)
        for v, c in zip(value, conformed, strict=True):
            assert_preserved(v, c, avro_type["items"], mode)
    elif isinstance(avro_type, dict):
        fields = {f.get("originalName", f["name"]): f for f in avro_type["fields"]}
        assert set(value) <= set(fields)
        assert set(conformed) == {f["name"] for f in fields.values()}
        for key, field in fields.items():
            if key in value:
                assert_preserved(value[key], conformed[field["name"]], field["type"], mode)
            else:
                assert conformed[field["name"]] is None
    else:
        assert type(conformed) is type(value)
        assert conformed == value


# --- property: Spark schemas and rows --------------------------------------------------------

SPARK_NAMES = st.sampled_from(["a", "b", "a", "a-b", "a_b", "1x", "", "é", "x.y", "item"])
SPARK_LEAVES = st.sampled_from(
    [
        StringType(),
        BooleanType(),
        ByteType(),
        ShortType(),
        IntegerType(),
        LongType(),
        FloatType(),
        DoubleType(),
        BinaryType(),
        DateType(),
        TimestampType(),
        TimestampNTZType(),
        NullType(),
    ]
) | st.integers(1, 38).flatmap(lambda p: st.integers(0, p).map(lambda s: DecimalType(p, s)))


def spark_structs(field_type: st.SearchStrategy[DataType]) -> st.SearchStrategy[StructType]:
    return st.lists(st.tuples(SPARK_NAMES, field_type, st.booleans()), max_size=4).map(
        lambda fields: StructType([StructField(n, t, nullable) for n, t, nullable in fields])
    )


def spark_types(depth: int) -> st.SearchStrategy[DataType]:
    if depth == 0:
        return SPARK_LEAVES
    inner = spark_types(depth - 1)
    return (
        SPARK_LEAVES
        | st.builds(ArrayType, inner, st.booleans())
        | st.builds(MapType, st.just(StringType()), inner, st.booleans())
        | spark_structs(inner)
    )


def spark_values(data_type: DataType, nullable: bool) -> st.SearchStrategy[Any]:
    values = _spark_values(data_type)
    return st.none() | values if nullable else values


_LOCAL_TIMES = st.datetimes(datetime(1900, 1, 2), datetime(2200, 1, 1))
_SIMPLE_VALUES: dict[type[DataType], st.SearchStrategy[Any]] = {
    StringType: st.text(max_size=5),
    BooleanType: st.booleans(),
    ByteType: st.integers(-(2**7), 2**7 - 1),
    ShortType: st.integers(-(2**15), 2**15 - 1),
    IntegerType: st.integers(-(2**31), 2**31 - 1),
    LongType: st.integers(-(2**63), 2**63 - 1),
    FloatType: st.floats(width=32),
    DoubleType: st.floats(),
    BinaryType: st.binary(max_size=5).map(bytearray),
    DateType: st.dates(),
    TimestampType: _LOCAL_TIMES | _LOCAL_TIMES.map(lambda d: d.replace(tzinfo=timezone.utc)),
    TimestampNTZType: st.datetimes(),
    NullType: st.none(),
}


def _spark_values(data_type: DataType) -> st.SearchStrategy[Any]:
    if type(data_type) in _SIMPLE_VALUES:
        return _SIMPLE_VALUES[type(data_type)]
    if isinstance(data_type, DecimalType):
        bound = 10**data_type.precision - 1
        scale = data_type.scale
        return st.integers(-bound, bound).map(lambda i: Decimal(f"{i}E-{scale}"))
    if isinstance(data_type, ArrayType):
        return st.lists(spark_values(data_type.elementType, data_type.containsNull), max_size=3)
    if isinstance(data_type, MapType):
        values = spark_values(data_type.valueType, data_type.valueContainsNull)
        return st.dictionaries(st.text(max_size=3), values, max_size=3)
    assert isinstance(data_type, StructType)
    return st.tuples(*(spark_values(f.dataType, f.nullable) for f in data_type.fields)).map(
        lambda values: _create_row(data_type.names, list(values))
    )


@PROPERTY
@given(data=st.data())
def test_spark_rows_read_back_under_the_derived_schema(data: st.DataObject) -> None:
    schema = data.draw(spark_structs(spark_types(2)), label="schema")
    rows = data.draw(st.lists(_spark_values(schema), max_size=4), label="rows")
    avro = spark_to_avro(schema)
    convert = row_converter(schema)
    records = [convert(row) for row in rows]
    back = roundtrip(avro, records)
    assert len(back) == len(rows)
    assert same(back, records)
