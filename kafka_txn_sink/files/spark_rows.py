"""Rows of an Arrow batch as PySpark's row writer would see them: the Arrow writer's fallback.

Files mode on the Arrow write path encodes batches natively (`arrow_avro`); where that cannot
give exactly the files the row path gives (payload mode, some types, a batch the native check
refuses), each batch is turned into PySpark's own rows here and written as rows are, with the
timestamps left aware (`instants`): PySpark's naive local times would lose the hour a zone
repeats, which Arrow's instants still hold. Records mode's encoders do the same.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

from pyspark.sql.types import (
    ArrayType,
    DataType,
    MapType,
    StructField,
    StructType,
    TimestampNTZType,
    TimestampType,
)

if TYPE_CHECKING:
    import pyarrow as pa

RowsOfBatch = Callable[["pa.RecordBatch"], Iterator[tuple[Any, ...]]]
"""Turns one Arrow record batch into its rows."""


def arrow_rows(schema: StructType, *, instants: bool = False) -> RowsOfBatch:
    """Rows of a batch as tuples of the Python values a row writer gets for `schema`
    (PySpark's own converters: timestamps, decimals, maps, structs as for `Row`s).

    `instants`: timestamps as the aware datetimes Arrow holds instead of PySpark's naive local
    times, which lose which instant of an hour the worker's zone repeats was meant.
    """
    from pyspark.sql.conversion import ArrowTableToRowsConversion

    create: Any = ArrowTableToRowsConversion._create_converter
    converters: list[Callable[[Any], Any] | None] = []
    for field in schema.fields:
        data_type = _aware(field.dataType) if instants else field.dataType
        try:
            converter = create(data_type, none_on_identity=True)
        except TypeError:  # a PySpark without the keyword
            converter = create(data_type)
        converters.append(converter)

    def rows(batch: pa.RecordBatch) -> Iterator[tuple[Any, ...]]:
        columns: list[Sequence[Any]] = []
        for array, convert in zip(batch.columns, converters, strict=True):
            values = array.to_pylist()
            columns.append(values if convert is None else [convert(v) for v in values])
        return zip(*columns, strict=True)

    return rows


def _aware(data_type: DataType) -> DataType:
    """`data_type` with timestamp_ntz for timestamp: PySpark's converter of timestamp_ntz
    passes pyarrow's datetimes as they are, aware for Arrow's timestamps with a zone. A
    user-defined type is left to its own conversion."""
    if isinstance(data_type, TimestampType):
        return TimestampNTZType()
    if isinstance(data_type, StructType):
        return StructType(
            [StructField(f.name, _aware(f.dataType), f.nullable, f.metadata) for f in data_type]
        )
    if isinstance(data_type, ArrayType):
        return ArrayType(_aware(data_type.elementType), data_type.containsNull)
    if isinstance(data_type, MapType):
        return MapType(
            _aware(data_type.keyType), _aware(data_type.valueType), data_type.valueContainsNull
        )
    return data_type
