"""The plan of a files-mode sink: its options checked against the input schema, once, on the
driver.

`plan_for_options` (or `plan_files`) refuses what no task could write (an unknown or
unsuitable column, a codec this machine lacks, limits out of range, a column Avro cannot hold)
before any task starts, with a message naming the option or column. The `FilePlan` it returns
is picklable and travels to every task, where `writer.FileSet` writes by it.
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import fastavro
from pyspark.sql.types import (
    BinaryType,
    CharType,
    StringType,
    StructType,
    TimestampNTZType,
    TimestampType,
    VarcharType,
)

from kafka_txn_sink.errors import ConfigError, InputError
from kafka_txn_sink.files.json_schema import Irreconcilable
from kafka_txn_sink.files.partitioning import (
    PARTITION_TYPES,
    PartitionSpec,
    TimePattern,
    supports_partition_type,
    time_zone,
)
from kafka_txn_sink.files.spark_avro import spark_to_avro
from kafka_txn_sink.files_options import (
    AVRO_CODEC,
    DEFAULT_MAX_BYTES_PER_FILE,
    DEFAULT_MAX_OPEN_FILES,
    IRRECONCILABLE_TYPES,
    MAX_BYTES_PER_FILE,
    MAX_OPEN_FILES,
    MAX_RECORDS_PER_FILE,
    PARTITION_BY,
    PAYLOAD_COLUMN,
    TIME_PARTITION_COLUMN,
    TIME_PARTITION_PATTERN,
    TIME_PARTITION_TIME_ZONE,
    FilesOptions,
)

Codec = Literal["null", "deflate", "snappy", "zstandard"]
"""An Avro codec files mode writes with (option `avroCodec`)."""

CODECS: tuple[Codec, ...] = ("null", "deflate", "snappy", "zstandard")
"""Every codec, as the option spells it."""

_TEXT_TYPES = (StringType, CharType, VarcharType)


@dataclass(frozen=True)
class FilePlan:
    """What every task of a files-mode sink needs to write its files; checked, picklable.

    `max_records_per_file` 0 means no limit (as Spark's `maxRecordsPerFile`).
    """

    schema: StructType
    spec: PartitionSpec
    payload_column: str | None
    codec: Codec
    max_records_per_file: int
    max_bytes_per_file: int
    max_open_files: int
    irreconcilable: Irreconcilable = "union"

    @property
    def data_indexes(self) -> tuple[int, ...]:
        """Positions of the columns written to files in Spark-schema mode."""
        partitioned = set(self.spec.columns)
        return tuple(i for i, n in enumerate(self.schema.names) if n not in partitioned)

    def data_schema(self) -> StructType:
        """The input schema less the partition columns: the columns Spark-schema mode writes."""
        return StructType([self.schema.fields[i] for i in self.data_indexes])

    def avro_schema(self) -> dict[str, Any]:
        """The record schema of every file in Spark-schema mode."""
        return spark_to_avro(self.data_schema())


def plan_files(
    schema: StructType,
    *,
    partition_by: Sequence[str] = (),
    time_column: str | None = None,
    time_pattern: str | None = None,
    time_zone_name: str = "UTC",
    payload_column: str | None = None,
    codec: str = "null",
    max_records_per_file: int = 0,
    max_bytes_per_file: int = DEFAULT_MAX_BYTES_PER_FILE,
    max_open_files: int = DEFAULT_MAX_OPEN_FILES,
    irreconcilable: Irreconcilable = "union",
) -> FilePlan:
    """Check the files-mode options against the input schema.

    Raises:
        ConfigError: an option is invalid or names a column the input does not have.
        InputError: a named column has a type it cannot serve for (partition, time, payload
            column), or a written column has a type Avro cannot hold.
    """
    names = schema.names
    _check_limits(max_records_per_file, max_bytes_per_file, max_open_files)
    checked_codec = _check_codec(codec)
    columns = _check_partition_columns(schema, partition_by)
    pattern = TimePattern.parse(time_pattern) if time_pattern is not None else None
    if time_column is not None and time_column not in names:
        raise _missing(TIME_PARTITION_COLUMN.name, time_column, names)
    time_field = schema[time_column] if time_column is not None else None
    if time_field is not None and not isinstance(
        time_field.dataType, (TimestampType, TimestampNTZType)
    ):
        raise InputError(
            f"column {time_column} is {time_field.dataType.simpleString()}; option "
            f"{TIME_PARTITION_COLUMN} needs a timestamp or timestamp_ntz column"
        )
    spec = PartitionSpec(
        columns,
        pattern,
        time_column,
        time_zone(time_zone_name, TIME_PARTITION_TIME_ZONE.name),
        time_ntz=time_field is not None and isinstance(time_field.dataType, TimestampNTZType),
    )
    if payload_column is not None:
        _check_payload_column(schema, payload_column, columns)
    if irreconcilable not in ("union", "string"):
        raise ConfigError(f"irreconcilable must be 'union' or 'string', not {irreconcilable!r}")
    plan = FilePlan(
        schema,
        spec,
        payload_column,
        checked_codec,
        max_records_per_file,
        max_bytes_per_file,
        max_open_files,
        irreconcilable,
    )
    if payload_column is None:
        _check_data_columns(plan)
    return plan


def plan_for_options(files: FilesOptions, schema: StructType) -> FilePlan:
    """Check files mode's options against the input schema (driver side).

    Raises:
        ConfigError / InputError: an option or a column does not fit; the message names it.
    """
    if files.irreconcilable not in ("union", "string"):
        raise ConfigError(
            f"option {IRRECONCILABLE_TYPES} must be union or string, got {files.irreconcilable!r}"
        )
    return plan_files(
        schema,
        partition_by=files.partition_by,
        time_column=files.time_column,
        time_pattern=files.time_pattern,
        time_zone_name=files.time_zone,
        payload_column=files.payload_column,
        codec=files.codec,
        max_records_per_file=files.max_records_per_file,
        max_bytes_per_file=files.max_bytes_per_file,
        max_open_files=files.max_open_files,
        irreconcilable="string" if files.irreconcilable == "string" else "union",
    )


def _check_limits(max_records: int, max_bytes: int, max_open: int) -> None:
    for option, value, least in (
        (MAX_RECORDS_PER_FILE, max_records, 0),
        (MAX_BYTES_PER_FILE, max_bytes, 1),
        (MAX_OPEN_FILES, max_open, 1),
    ):
        if isinstance(value, bool) or not isinstance(value, int) or value < least:
            raise ConfigError(f"option {option} must be an integer of at least {least}: {value!r}")


def _check_codec(codec: str) -> Codec:
    for known in CODECS:
        if codec.strip().lower() == known:
            _probe_codec(known)
            return known
    raise ConfigError(f"option {AVRO_CODEC} must be one of {', '.join(CODECS)}, not {codec!r}")


def _probe_codec(codec: Codec) -> None:
    # fastavro registers a codec whose library is missing, and fails only at the first block.
    probe = {"type": "record", "name": "Probe", "fields": [{"name": "x", "type": "long"}]}
    try:
        with tempfile.TemporaryFile() as out:
            fastavro.writer(out, probe, [{"x": 1}], codec=codec)
    except ValueError as exc:
        raise ConfigError(f"option {AVRO_CODEC}={codec} is not available here: {exc}") from exc


def _check_partition_columns(schema: StructType, partition_by: Sequence[str]) -> tuple[str, ...]:
    columns = tuple(partition_by)
    duplicates = sorted({c for c in columns if columns.count(c) > 1})
    if duplicates:
        raise ConfigError(f"option {PARTITION_BY} names {', '.join(duplicates)} twice")
    for column in columns:
        if column not in schema.names:
            raise _missing(PARTITION_BY.name, column, schema.names)
        data_type = schema[column].dataType
        if not supports_partition_type(data_type):
            raise InputError(
                f"partition column {column} is {data_type.simpleString()}; partition columns "
                f"must be {PARTITION_TYPES} (cast it, e.g. to string)"
            )
    return columns


def _check_payload_column(schema: StructType, column: str, partition_by: Iterable[str]) -> None:
    if column not in schema.names:
        raise _missing(PAYLOAD_COLUMN.name, column, schema.names)
    if column in partition_by:
        raise ConfigError(f"column {column} cannot be both {PAYLOAD_COLUMN} and a partition column")
    data_type = schema[column].dataType
    if not isinstance(data_type, (*_TEXT_TYPES, BinaryType)):
        raise InputError(
            f"column {column} is {data_type.simpleString()}; option {PAYLOAD_COLUMN} needs a "
            "string (or binary) column holding one JSON object per row"
        )


def _check_data_columns(plan: FilePlan) -> None:
    data = plan.data_schema()
    if not data.fields:
        raise ConfigError(
            f"option {PARTITION_BY} names every column; at least one must be written to files"
        )
    # Spark reads partition directories back as columns: one named like a data column clashes.
    data_names = {f.name.lower(): f.name for f in data.fields}
    time_names = plan.spec.time.names if plan.spec.time else ()
    for name in time_names:
        if name.lower() in data_names:
            raise ConfigError(
                f"option {TIME_PARTITION_PATTERN} names a directory {name!r} like the column "
                f"{data_names[name.lower()]}; readers would see two columns of that name"
            )
    spark_to_avro(data)  # InputError naming a column Avro cannot hold


def _missing(option: str, column: str, names: Sequence[str]) -> ConfigError:
    return ConfigError(
        f"option {option} names column {column!r}, which the input does not have "
        f"(columns: {', '.join(names)})"
    )
