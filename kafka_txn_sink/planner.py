"""The planner's side of a batch, on the driver: the writer Spark pickles to the tasks.

`stream_writer` (a streaming query's batch) and `batch_writer` (a batch write, `df.write`)
check the input schema against each output, resolve the record formats' schema ids, run the
driver's start of a batch or of a write (protocol/start.py) and hand the tasks a `TaskPlan`
(protocol/task_plan.py). datasource.py loads this module only where a batch is planned, never
in the commit worker (commit_worker.py); it loads none of the tasks' modules itself (pyarrow,
the producer, the record formats), which the writers import in the task.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from pyspark.sql.datasource import DataSourceStreamWriter, DataSourceWriter
from pyspark.sql.types import ArrayType, DataType, MapType, StructType, TimestampType

from kafka_txn_sink.group_options import SPARK_CHECKPOINT as CHECKPOINT
from kafka_txn_sink.options import SinkOptions
from kafka_txn_sink.protocol.batch_writer import batch_writer_class
from kafka_txn_sink.protocol.start import (
    BatchStart,
    dead_letter_limits,
    start_batch,
    start_write,
)
from kafka_txn_sink.protocol.stream_writer import KafkaTxnStreamWriter, stream_writer_class
from kafka_txn_sink.protocol.task_plan import TaskPlan, task_options
from kafka_txn_sink.records.columns import plan_columns, timestamp_column
from kafka_txn_sink.serde.resolve import pinned, resolve
from kafka_txn_sink.spark_checkpoint import check_not_behind


def stream_writer(
    options: SinkOptions, schema: StructType, given: Mapping[str, str]
) -> DataSourceStreamWriter:
    """The writer of a streaming query's next batch (`given`: the options as the user gave
    them, where Spark puts the checkpoint's location).

    Raises:
        ConfigError / InputError: an option or the input schema does not fit; the message
            names the option or column.
        KafkaUnavailableError: the brokers cannot be reached.
    """
    _refuse_a_repeating_zone(options, schema)
    plan = _plan(options, schema, start_batch)
    checkpoint = next((v for k, v in given.items() if k.lower() == CHECKPOINT), "")
    if checkpoint:
        check_not_behind(checkpoint, plan.log_query_id, plan.last_decided, options.s3)
    return stream_writer_class()(plan)


def batch_writer(options: SinkOptions, schema: StructType, write_id: str) -> DataSourceWriter:
    """The writer of batch write `write_id`.

    Raises:
        ConfigError / InputError: as `stream_writer`, or the log belongs to a streaming query.
        KafkaUnavailableError: the brokers cannot be reached.
    """
    return batch_writer_class()(
        _plan(options, schema, lambda checked: start_write(checked, write_id))
    )


def _refuse_a_repeating_zone(options: SinkOptions, schema: StructType) -> None:
    """Refuse, before any batch, a query whose timestamps the row writer (PySpark 4.0) would
    hand over ambiguously: the sink converts them (files mode, a registry format) and the
    Python workers' zone repeats an hour (serde/timestamps.py). Executors that take their zone
    from their host's settings are not seen here; their tasks refuse such a value themselves.

    Raises:
        ConfigError: naming the zone and what to set.
    """
    if stream_writer_class() is not KafkaTxnStreamWriter or not _has_instants(schema):
        return
    stamped = options.records_mode and timestamp_column(schema) is not None
    if options.files is None and not options.serde.uses_registry and not stamped:
        return  # records mode writes its columns as bytes: no timestamp is converted
    from kafka_txn_sink.serde.timestamps import repeating_zone_error

    error = repeating_zone_error()
    if error is not None:
        raise error


def _has_instants(data_type: DataType) -> bool:
    """Whether `data_type` holds a timestamp (an instant), at any depth."""
    if isinstance(data_type, TimestampType):
        return True
    if isinstance(data_type, StructType):
        return any(_has_instants(f.dataType) for f in data_type.fields)
    if isinstance(data_type, ArrayType):
        return _has_instants(data_type.elementType)
    if isinstance(data_type, MapType):
        return _has_instants(data_type.keyType) or _has_instants(data_type.valueType)
    return False


def _plan(
    options: SinkOptions, schema: StructType, start: Callable[[SinkOptions], BatchStart]
) -> TaskPlan:
    """Check the input schema against each output, resolve the record formats' schema ids
    (before any transaction opens), then `start` the batch: the tasks' plan."""
    encoded = [f.column for f in options.serde.fields()]
    columns = (
        plan_columns(schema, options.topic, encoded, options.header_columns)
        if options.records_mode
        else None
    )
    files_plan = _plan_files(options, schema)
    encodings = resolve(options.serde, schema, options.topic)
    started = start(options)
    repair_schemas = started.repair.schemas if started.repair else ()
    return TaskPlan(
        options=task_options(started.options),
        columns=columns,
        files_plan=files_plan,
        log_query_id=started.log_query_id,
        last_decided=started.last_decided,
        run=started.run,
        write=started.write,
        repair=started.repair,
        encodings=encodings,
        repair_encodings=pinned(options.serde, schema, repair_schemas, encodings),
        dead_letter_limits=dead_letter_limits(started.options),
    )


def _plan_files(options: SinkOptions, schema: StructType) -> Any:
    """Files mode's plan, or None; files mode (and fastavro) is loaded only when it is on."""
    if options.files is None:
        return None
    from kafka_txn_sink.files.plan import plan_for_options

    return plan_for_options(options.files, schema)
