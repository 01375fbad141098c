"""The tasks' part of the record formats: a key or value column encoded in Confluent's wire
format, with the schema and id the driver resolved (serde/resolve.py); no registry call.

Avro values are encoded by fastavro's schemaless writer (the encoder confluent-kafka's own
AvroSerializer uses) after files mode's conversion of Spark values (`spark_avro.row_converter`);
JSON values are made by `spark_json.json_converter`, checked against the JSON Schema (as
confluent-kafka's JSONSchemaSerializer does) and dumped compactly; protobuf messages are made of
the same JSON values (serde/protobuf.py), from the `.proto` the driver compiled. A null cell
stays null (a record without a key, or a tombstone). A value that does not fit its schema fails
the task with an error naming the column, the row and the subject.

Timestamps are written as their instants (serde/timestamps.py): the row writer's naive local
times are read by the worker's zone's rules, and refused where the zone repeats the hour (PySpark
has lost which instant it was); the Arrow writer's columns are exact, and where they go row by
row they do as aware datetimes, not through PySpark's row conversion. A timestamp_ntz is its
wall clock, also in a user's Avro schema that gives it a `timestamp-*` field.
"""

from __future__ import annotations

import io
import json
from collections.abc import Callable, Sequence
from typing import Any

import pyarrow as pa
from pyspark.sql.types import StructField, StructType

from kafka_txn_sink.errors import InputError
from kafka_txn_sink.files.rows_arrow import RowsToArrow
from kafka_txn_sink.serde.resolve import Encoding, Encodings, derived_schema

# Fewer cells than this go one by one: a column's fixed cost (a pyarrow call per field) is
# more than fastavro's for a handful of rows, as in the row-by-row routing of records/output.py.
COLUMN_MIN_ROWS = 32


class FieldEncoder:
    """Encodes the cells of one column (`key` or `value`) as its `Encoding` says."""

    def __init__(self, encoding: Encoding) -> None:
        """Parse the schema once per task."""
        self._encoding = encoding
        self._prefix = encoding.prefix
        # The schema Spark's type maps to fits every value by construction: no check per value,
        # and Avro of whole Arrow columns (avro_columns.py).
        derived = encoding.format != "protobuf" and encoding.schema == derived_schema(
            encoding.column, encoding.data_type, encoding.format
        )
        avro = encoding.format == "avro"
        self._payload = _PAYLOADS[encoding.format](encoding, derived)
        self._columnar = json.loads(encoding.schema) if avro and derived else None
        self._arrow_cells = _arrow_cells(encoding)
        self._to_arrow: RowsToArrow | None = None  # the row writer's cells as one Arrow column

    def cells(self, cells: Sequence[Any], first_row: int) -> list[bytes | None]:
        """Each cell (as PySpark's rows carry it) encoded; None stays None. The first cell is
        row `first_row` of the task. Avro cells become one Arrow column first where
        `rows_arrow` can make it exactly, and are encoded a column at once.

        Raises:
            InputError: a cell does not fit the schema; names the column, row and subject.
        """
        if self._columnar is not None and len(cells) >= COLUMN_MIN_ROWS:
            if self._to_arrow is None:
                e = self._encoding
                self._to_arrow = RowsToArrow(StructType([StructField(e.column, e.data_type)]))
            batch = self._to_arrow.batch([(cell,) for cell in cells])
            found = self._datums(batch.column(0)) if batch is not None else None
            if found is not None:
                return found
        return self._one_by_one(cells, first_row)

    def array(self, array: pa.Array, first_row: int) -> list[bytes | None]:
        """`cells` for an Arrow column of the Arrow writer (PySpark 4.1+): a column at once where
        `avro_columns` can, else row by row."""
        found = self._datums(array) if self._columnar is not None else None
        if found is not None:
            return found
        return self._one_by_one(self._arrow_cells(array), first_row)

    def _datums(self, array: pa.Array) -> list[bytes | None] | None:
        from kafka_txn_sink.serde.avro_columns import datums  # numpy: the registry extra's

        return datums(array, self._columnar, self._prefix)

    def _one_by_one(self, cells: Sequence[Any], first_row: int) -> list[bytes | None]:
        encoded: list[bytes | None] = []
        payload, prefix = self._payload, self._prefix
        for row, cell in enumerate(cells, first_row):
            if cell is None:
                encoded.append(None)
                continue
            try:
                encoded.append(prefix + payload(cell))
            except (InputError, ValueError, TypeError, KeyError, AttributeError) as exc:
                raise self._misfit(row, exc) from None
        return encoded

    def _misfit(self, row: int, exc: Exception) -> InputError:
        e = self._encoding
        return InputError(
            f"column {e.column} of row {row} of this task does not fit its {e.format} schema "
            f"(subject {e.subject!r}, id {e.schema_id}): {str(exc).splitlines()[0]}; nothing "
            f"of the batch is written",
            reason=f"{e.column}_encoding",
        )


class Encoders:
    """A task's encoders of the key and the value (None: the column is written raw)."""

    def __init__(self, encodings: Encodings | None = None) -> None:
        """The encoders of the driver's `encodings` (None: both raw)."""
        self.key = FieldEncoder(encodings.key) if encodings and encodings.key else None
        self.value = FieldEncoder(encodings.value) if encodings and encodings.value else None


def _avro_payload(encoding: Encoding, derived: bool) -> Callable[[Any], bytes]:
    import fastavro
    from fastavro.validation import ValidationError, validate

    from kafka_txn_sink.files.spark_avro import row_converter

    parsed = fastavro.parse_schema(json.loads(encoding.schema))
    data_type = encoding.data_type
    # fastavro's writer does not check ranges (a long in an int field is written, and breaks
    # other readers): a schema other than the one Spark's type maps to is checked value by value.
    check = not derived
    # The derived schema gives a timestamp_ntz `local-timestamp-micros`; a user's may give it
    # an instant's field, which fastavro would read in the worker's zone.
    ntz_as_utc = not derived
    if isinstance(data_type, StructType):
        convert = row_converter(data_type, from_row_writer=True, ntz_as_utc=ntz_as_utc)
    else:  # one field of a wrapper record: the same conversion of a value of that type
        name = encoding.column
        wrapper = StructType([StructField(name, data_type, nullable=True)])
        wrapped = row_converter(wrapper, from_row_writer=True, ntz_as_utc=ntz_as_utc)

        def convert(cell: Any) -> Any:
            return wrapped((cell,))[name]

    buffer = io.BytesIO()
    write = fastavro.schemaless_writer

    def payload(cell: Any) -> bytes:
        record = convert(cell)
        if check:
            try:
                validate(record, parsed, raise_errors=True)
            except ValidationError as exc:
                raise ValueError(f"not valid for the schema: {exc}") from None
        buffer.seek(0)
        buffer.truncate()
        write(buffer, parsed, record)
        return buffer.getvalue()

    return payload


def _json_payload(encoding: Encoding, derived: bool) -> Callable[[Any], bytes]:
    from jsonschema.exceptions import best_match
    from jsonschema.validators import validator_for

    from kafka_txn_sink.serde.spark_json import json_converter

    schema = json.loads(encoding.schema)
    validator = validator_for(schema)(schema)
    convert = json_converter(encoding.data_type, encoding.column, from_row_writer=True)

    def payload(cell: Any) -> bytes:
        value = convert(cell)
        error = None if derived else best_match(validator.iter_errors(value))
        if error is not None:
            where = "/".join(str(p) for p in error.absolute_path) or "the value"
            raise ValueError(f"at {where}: {error.message}")
        return json.dumps(value, separators=(",", ":"), allow_nan=False).encode("utf-8")

    return payload


def _protobuf_payload(encoding: Encoding, derived: bool) -> Callable[[Any], bytes]:
    from kafka_txn_sink.serde.protobuf import payload_encoder

    return payload_encoder(encoding.descriptor, encoding.data_type, encoding.column)


_PAYLOADS: dict[str, Callable[[Encoding, bool], Callable[[Any], bytes]]] = {
    "avro": _avro_payload,
    "json-schema": _json_payload,
    "protobuf": _protobuf_payload,
}


def _arrow_cells(encoding: Encoding) -> Callable[[pa.Array], list[Any]]:
    """An Arrow column's cells as PySpark's row writer would hand them (PySpark's converters),
    but timestamps as the aware instants Arrow holds."""
    from kafka_txn_sink.files.spark_rows import arrow_rows

    rows = arrow_rows(StructType([StructField(encoding.column, encoding.data_type)]), instants=True)

    def cells(array: pa.Array) -> list[Any]:
        batch = pa.RecordBatch.from_arrays([array], names=[encoding.column])
        return [row[0] for row in rows(batch)]

    return cells
