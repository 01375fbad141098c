"""Spark schema -> Avro: the mapping table, rows as PySpark gives them, fastavro round trips."""

from __future__ import annotations

import json
import re
import time
from datetime import date, datetime, timedelta, timezone
from decimal import Decimal
from typing import Any

import fastavro
import pytest
from hypothesis import given
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
from kafka_txn_sink.files.avro_names import AvroType
from kafka_txn_sink.files.spark_avro import row_converter, spark_to_avro
from tests.unit.avro_support import PROPERTY, roundtrip, same


def row_of(schema: StructType, *values: Any) -> Row:
    """A Row as PySpark's writer builds them."""
    return _create_row(schema.names, list(values))


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
