"""Rows of an Arrow batch as PySpark's row writer would see them: the Arrow writer's fallback.

Files mode on the Arrow write path encodes batches natively (`arrow_avro`); where that cannot
give exactly the files the row path gives (payload mode, some types, a batch the native check
refuses), each batch is turned into PySpark's own rows here and written as rows are.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql.types import StructType

RowsOfBatch = Callable[["pa.RecordBatch"], Iterator[tuple[Any, ...]]]
"""Turns one Arrow record batch into its rows."""


def arrow_rows(schema: StructType) -> RowsOfBatch:
    """Rows of a batch as tuples of the Python values a row writer gets for `schema`
    (PySpark's own converters: timestamps, decimals, maps, structs as for `Row`s)."""
    from pyspark.sql.conversion import ArrowTableToRowsConversion

    create: Any = ArrowTableToRowsConversion._create_converter
    converters: list[Callable[[Any], Any] | None] = []
    for field in schema.fields:
        try:
            converter = create(field.dataType, none_on_identity=True)
        except TypeError:  # a PySpark without the keyword
            converter = create(field.dataType)
        converters.append(converter)

    def rows(batch: pa.RecordBatch) -> Iterator[tuple[Any, ...]]:
        columns: list[Sequence[Any]] = []
        for array, convert in zip(batch.columns, converters, strict=True):
            values = array.to_pylist()
            columns.append(values if convert is None else [convert(v) for v in values])
        return zip(*columns, strict=True)

    return rows
