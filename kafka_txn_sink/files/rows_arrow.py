"""Rows of the row writer (PySpark 4.0) as Arrow batches, for files mode's native encoder.

PySpark before 4.1 hands a Python sink one `Row` at a time; encoding each with fastavro costs
several microseconds a row. Here a group of rows becomes one Arrow record batch (a column
transposed in C, then `pyarrow.array` with the Arrow type PySpark itself gives the Spark type),
which `FileSet.add_native` encodes as it encodes the Arrow writer's batches. Where that cannot
be exact, the caller writes the rows one by one as before: a type PySpark has no Arrow type for
(a user-defined type), a value pyarrow refuses, and timestamps unless the worker's local time
is UTC at every instant (PySpark's rows carry them as naive local times, which pyarrow reads as
UTC; the rows one by one read them in the zone, or refuse an hour it repeats).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pyarrow as pa
from pyspark.sql.types import DataType, StructType, TimestampType, UserDefinedType

from kafka_txn_sink.serde.timestamps import local_is_utc


class RowsToArrow:
    """Turns groups of rows of one Spark schema into Arrow record batches."""

    def __init__(self, schema: StructType) -> None:
        """Work out the Arrow schema once; `usable` says whether batches can be made at all."""
        self._schema: pa.Schema | None = None
        if _has(schema, UserDefinedType) or (_has(schema, TimestampType) and not _utc_local()):
            return
        self._schema = _arrow_schema(schema)

    @property
    def usable(self) -> bool:
        """Whether rows of this schema can become Arrow batches."""
        return self._schema is not None

    def batch(self, rows: Sequence[Sequence[Any]]) -> pa.RecordBatch | None:
        """The rows as one record batch, or None where pyarrow refuses a value."""
        if self._schema is None or not rows:
            return None
        columns = list(zip(*rows, strict=True))
        try:
            arrays = [
                pa.array(column, type=field.type)
                for column, field in zip(columns, self._schema, strict=True)
            ]
        except (pa.ArrowException, TypeError, ValueError, OverflowError):
            return None
        return pa.RecordBatch.from_arrays(arrays, schema=self._schema)


def _arrow_schema(schema: StructType) -> pa.Schema | None:
    """PySpark's own Arrow schema of `schema` (timestamps in UTC), or None where it has none.
    Its signature changed in 4.3 (a time zone argument), so both are tried."""
    from pyspark.sql.pandas.types import to_arrow_schema

    convert: Any = to_arrow_schema
    for kwargs in ({"timezone": "UTC"}, {}):
        try:
            found: pa.Schema = convert(schema, **kwargs)
            return found
        except (TypeError, ValueError, NotImplementedError, AssertionError):
            continue
    return None


def _has(data_type: DataType, kind: type) -> bool:
    """Whether `data_type` is or holds a type of `kind`."""
    if isinstance(data_type, kind):
        return True
    inner = getattr(data_type, "fields", None)
    if inner is not None:
        return any(_has(f.dataType, kind) for f in inner)
    for name in ("elementType", "keyType", "valueType"):
        child = getattr(data_type, name, None)
        if isinstance(child, DataType) and _has(child, kind):
            return True
    return False


def _utc_local() -> bool:
    """Whether this process's local time is UTC at every instant (no offset, no history)."""
    return local_is_utc()
