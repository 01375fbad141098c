"""Avro of whole Arrow columns (serde/avro_columns.py) writes the bytes fastavro writes, row for
row, for every type it takes; for the others it leaves the column to the row path."""

from __future__ import annotations

import io
import json
from datetime import date, datetime, timedelta, timezone
from decimal import Decimal
from typing import Any

import fastavro
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pyspark.sql import Row
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    BooleanType,
    ByteType,
    DataType,
    DateType,
    DecimalType,
    DoubleType,
    FloatType,
    IntegerType,
    LongType,
    ShortType,
    StringType,
    StructField,
    StructType,
    TimestampNTZType,
    TimestampType,
)

from kafka_txn_sink.serde.avro_columns import datums
from kafka_txn_sink.serde.resolve import Encoding, derived_schema

PREFIX = b"\x00\x00\x00\x00\x09"
EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)

# (Spark type, Arrow type, values of it)
SCALARS: list[tuple[DataType, pa.DataType, st.SearchStrategy[Any]]] = [
    (LongType(), pa.int64(), st.integers(-(2**63), 2**63 - 1)),
    (IntegerType(), pa.int32(), st.integers(-(2**31), 2**31 - 1)),
    (ShortType(), pa.int16(), st.integers(-(2**15), 2**15 - 1)),
    (ByteType(), pa.int8(), st.integers(-128, 127)),
    (DoubleType(), pa.float64(), st.floats(allow_nan=False)),
    (FloatType(), pa.float32(), st.floats(width=32, allow_nan=False)),
    (BooleanType(), pa.bool_(), st.booleans()),
    (StringType(), pa.string(), st.text(max_size=40)),
    (BinaryType(), pa.binary(), st.binary(max_size=40)),
    # Spark 4's Arrow batches carry the large types (spark.sql.execution.arrow.useLargeVarTypes)
    (StringType(), pa.large_string(), st.text(max_size=40)),
    (BinaryType(), pa.large_binary(), st.binary(max_size=40)),
    (DateType(), pa.date32(), st.dates(date(1, 1, 1), date(9999, 12, 31))),
    (
        TimestampType(),
        pa.timestamp("us", tz="UTC"),
        st.datetimes(datetime(1, 1, 2), datetime(9999, 12, 30), timezones=st.just(timezone.utc)),
    ),
    (TimestampNTZType(), pa.timestamp("us"), st.datetimes(datetime(1, 1, 2), datetime(9999, 1, 1))),
]


@st.composite
def columns(draw: st.DrawFn, depth: int = 0) -> tuple[StructType, pa.DataType, list[Any]]:
    """A struct type of scalars (and, one level down, structs), and rows of it with nulls."""
    count = draw(st.integers(1, 5))
    fields, arrow_fields, generators = [], [], []
    for index in range(count):
        nullable = draw(st.booleans())
        if depth == 0 and draw(st.integers(0, 4)) == 0:
            spark, arrow, rows = draw(columns(depth=1))
            values: st.SearchStrategy[Any] = st.sampled_from(rows)
        else:
            spark, arrow, values = draw(st.sampled_from(SCALARS))
        fields.append(StructField(f"f{index}", spark, nullable))
        arrow_fields.append(pa.field(f"f{index}", arrow))
        generators.append(st.none() | values if nullable else values)
    row = st.fixed_dictionaries({f"f{i}": g for i, g in enumerate(generators)})
    rows = draw(st.lists(row, min_size=1, max_size=30))
    return StructType(fields), pa.struct(arrow_fields), rows


def fastavro_bytes(schema: dict[str, Any], rows: list[Any]) -> list[bytes | None]:
    parsed = fastavro.parse_schema(schema)
    found: list[bytes | None] = []
    for row in rows:
        if row is None:
            found.append(None)
            continue
        buffer = io.BytesIO()
        fastavro.schemaless_writer(buffer, parsed, row)
        found.append(PREFIX + buffer.getvalue())
    return found


@settings(max_examples=150, deadline=None)
@given(columns(), st.booleans())
def test_every_row_has_the_bytes_fastavro_writes(
    column: tuple[StructType, pa.DataType, list[Any]], with_null_row: bool
) -> None:
    spark, arrow, rows = column
    rows = [*rows, None] if with_null_row else rows
    schema = json.loads(derived_schema("value", spark, "avro"))
    array = pa.array(rows, type=arrow)

    assert datums(array, schema, PREFIX) == fastavro_bytes(schema, rows)
    assert datums(array.slice(1), schema, PREFIX) == fastavro_bytes(schema, rows[1:])


def test_the_varint_edges_are_fastavro_s() -> None:
    edges = [0, 1, -1, 63, -64, 64, -65, 2**31 - 1, -(2**31), 2**62, 2**63 - 1, -(2**63)]
    spark = StructType([StructField("n", LongType(), nullable=False)])
    rows = [{"n": n} for n in edges]
    schema = json.loads(derived_schema("value", spark, "avro"))
    array = pa.array(rows, type=pa.struct([("n", pa.int64())]))

    assert datums(array, schema, PREFIX) == fastavro_bytes(schema, rows)


def test_types_it_does_not_take_are_left_to_the_row_path() -> None:
    for spark, arrow, value in [
        (ArrayType(LongType()), pa.list_(pa.int64()), [1, 2]),
        (DecimalType(10, 2), pa.decimal128(10, 2), Decimal("1.25")),
    ]:
        struct = StructType([StructField("x", spark)])
        array = pa.array([{"x": value}], type=pa.struct([("x", arrow)]))
        assert datums(array, json.loads(derived_schema("value", struct, "avro")), PREFIX) is None


def test_a_null_in_a_field_that_is_not_nullable_is_left_to_the_row_path() -> None:
    struct = StructType([StructField("x", LongType(), nullable=False)])
    array = pa.array([{"x": 1}, {"x": None}], type=pa.struct([("x", pa.int64())]))
    assert datums(array, json.loads(derived_schema("value", struct, "avro")), PREFIX) is None


def test_the_field_encoder_takes_the_column_path_and_agrees_with_the_row_path() -> None:
    from kafka_txn_sink.serde.encode import FieldEncoder

    struct = StructType([StructField("at", TimestampType()), StructField("n", LongType())])
    encoding = Encoding("value", "avro", "s", 9, derived_schema("value", struct, "avro"), struct)
    moments = [EPOCH + timedelta(microseconds=n * 1_000_003) for n in range(50)]
    rows = [{"at": at, "n": n} for n, at in enumerate(moments)]
    arrow = pa.struct([("at", pa.timestamp("us", tz="UTC")), ("n", pa.int64())])
    array = pa.array(rows, type=arrow)

    encoder = FieldEncoder(encoding)
    assert encoder.array(array, 0) == encoder.cells(rows, 0) == fastavro_bytes(
        json.loads(encoding.schema), rows
    )


def test_spark_s_large_string_columns_take_the_column_path() -> None:
    from kafka_txn_sink.serde.encode import FieldEncoder

    struct = StructType([StructField("user", StringType()), StructField("n", LongType())])
    encoding = Encoding("value", "avro", "s", 9, derived_schema("value", struct, "avro"), struct)
    arrow = pa.struct([("user", pa.large_string()), ("n", pa.int64())])
    rows = [{"user": f"u{n}", "n": n} for n in range(20)]
    encoder = FieldEncoder(encoding)

    def row_path(array: pa.Array) -> list[Any]:
        raise AssertionError("the column went row by row")

    encoder._arrow_cells = row_path  # type: ignore[method-assign]
    assert encoder.array(pa.array(rows, type=arrow), 0) == fastavro_bytes(
        json.loads(encoding.schema), rows
    )


def test_the_row_writer_s_cells_are_encoded_as_a_column_with_the_same_bytes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from kafka_txn_sink.errors import InputError
    from kafka_txn_sink.files import rows_arrow
    from kafka_txn_sink.serde.encode import COLUMN_MIN_ROWS, FieldEncoder

    monkeypatch.setattr(rows_arrow, "_utc_local", lambda: True)
    struct = StructType(
        [StructField("at", TimestampType()), StructField("n", LongType(), nullable=False)]
    )
    encoding = Encoding("value", "avro", "s", 9, derived_schema("value", struct, "avro"), struct)
    moments = [EPOCH + timedelta(seconds=n) for n in range(COLUMN_MIN_ROWS + 10)]
    cells = [Row(at=at, n=n) for n, at in enumerate(moments)]
    encoder = FieldEncoder(encoding)

    def one_by_one(cells: Any, first_row: int) -> list[Any]:
        raise AssertionError("the cells went one by one")

    expected = encoder._one_by_one(cells, 0)
    monkeypatch.setattr(encoder, "_one_by_one", one_by_one)
    assert encoder.cells(cells, 0) == expected
    monkeypatch.undo()  # a null the type forbids: one by one, naming its row
    cells[5] = Row(at=None, n=None)
    with pytest.raises(InputError, match=r"^column value of row 105 of this task"):
        FieldEncoder(encoding).cells(cells, 100)
