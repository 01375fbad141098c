"""The data source Spark finds as `format("kafka_txn")`, and `register(spark)`.

`streamWriter()` (a streaming query's batch) and `writer()` (a batch write, `df.write`) turn
the user's options into the writer of one batch: they parse and check the options (options.py)
and the input schema against each output, run the driver's start of a batch or of a write
(protocol/start.py), and hand the tasks a `TaskPlan` (protocol/prepare.py).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

from pyspark.errors import AnalysisException
from pyspark.sql import SparkSession
from pyspark.sql.datasource import DataSource, DataSourceStreamWriter, DataSourceWriter
from pyspark.sql.types import ArrayType, DataType, MapType, StructType, TimestampType

from kafka_txn_sink.commit_worker import CommitWorkerWriter, building_for_commit
from kafka_txn_sink.errors import ConfigError
from kafka_txn_sink.group_options import CONSUMER_GROUP
from kafka_txn_sink.group_options import SPARK_CHECKPOINT as CHECKPOINT
from kafka_txn_sink.option_extras import checked_options
from kafka_txn_sink.options import WRITE_ID, SinkOptions
from kafka_txn_sink.protocol.batch_writer import batch_writer_class
from kafka_txn_sink.protocol.prepare import (
    SPECULATION,
    TaskPlan,
    refuse_speculation,
    task_options,
)
from kafka_txn_sink.protocol.start import (
    BatchStart,
    dead_letter_limits,
    start_batch,
    start_write,
)
from kafka_txn_sink.protocol.stream_writer import KafkaTxnStreamWriter, stream_writer_class
from kafka_txn_sink.records.columns import plan_columns, timestamp_column
from kafka_txn_sink.serde.resolve import pinned, resolve
from kafka_txn_sink.spark_checkpoint import check_not_behind

NAME = "kafka_txn"


class KafkaTxnDataSource(DataSource):
    """Exactly-once streaming sink to Kafka, and to Avro files (options: README, options.py);
    atomic batch writes (`df.write`) to the same."""

    @classmethod
    def name(cls) -> str:
        """The short name of `format("kafka_txn")`."""
        return NAME

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        """Validate, recover decided batches, and hand the log's state to the tasks.

        Raises:
            ConfigError / InputError: an option or the input schema does not fit; the message
                names the option or column.
            KafkaUnavailableError: the brokers cannot be reached.
        """
        if overwrite:
            raise ConfigError(
                "output mode complete is not supported: kafka_txn appends; use outputMode append"
            )
        options = checked_options(self.options)
        if options.write_id is not None:
            raise ConfigError(
                f"option {WRITE_ID} is for batch writes (df.write) only; a streaming query's "
                f"batches are identified by its checkpoint: remove it"
            )
        if building_for_commit():
            return CommitWorkerWriter(options)
        _refuse_a_repeating_zone(options, schema)
        plan = _plan(options, schema, start_batch)
        checkpoint = next((v for k, v in self.options.items() if k.lower() == CHECKPOINT), "")
        if checkpoint:
            check_not_behind(checkpoint, plan.log_query_id, plan.last_decided, options.s3)
        return stream_writer_class()(plan)

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        """Validate, recover decided batches, and find the batch of the log this write is.

        Raises:
            ConfigError / InputError: as `streamWriter`; option writeId is missing; the save
                mode is overwrite; the log belongs to a streaming query.
            KafkaUnavailableError: the brokers cannot be reached.
        """
        if overwrite:
            raise ConfigError(
                'save mode overwrite is not supported: kafka_txn appends; use mode("append")'
            )
        options = checked_options(self.options)
        write_id = options.write_id
        if options.progress is not None:
            raise ConfigError(
                f"option {CONSUMER_GROUP} is for streaming queries: a batch write (df.write) has "
                f"no input offsets to commit; remove it"
            )
        if write_id is None:
            raise ConfigError(
                f"option {WRITE_ID} is required in a batch write (df.write): a name of this "
                f"write, the same when it is run again, so that it is written exactly once"
            )
        return batch_writer_class()(
            _plan(options, schema, lambda checked: start_write(checked, write_id))
        )


def register(spark: SparkSession) -> None:
    """Register `format("kafka_txn")` explicitly, checking the Spark settings it relies on.

    Raises:
        ConfigError: spark.speculation is on (speculative copies of a task would fence each
            other's transactions). Found by its short name, the sink's tasks refuse it instead.
    """
    refuse_speculation(spark.conf.get(SPECULATION, "false"))
    try:
        spark.dataSource.register(KafkaTxnDataSource)
    except AnalysisException as exc:
        # Spark found it by itself: the Python workers have this package, whose top-level
        # module pyspark_kafka_txn offers it, and Spark refuses to register it a second time.
        if exc.getCondition() != "DATA_SOURCE_ALREADY_EXISTS":
            raise


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
    return replace(
        _started_plan(started),
        options=task_options(started.options),
        columns=columns,
        files_plan=files_plan,
        encodings=encodings,
        repair_encodings=pinned(options.serde, schema, repair_schemas, encodings),
        dead_letter_limits=dead_letter_limits(started.options),
    )


def _started_plan(started: BatchStart) -> TaskPlan:
    """What the driver's start found, as a plan without the outputs' parts."""
    return TaskPlan(
        options=started.options,
        columns=None,
        files_plan=None,
        log_query_id=started.log_query_id,
        last_decided=started.last_decided,
        run=started.run,
        write=started.write,
        repair=started.repair,
    )


def _plan_files(options: SinkOptions, schema: StructType) -> Any:
    """Files mode's plan, or None; files mode (and fastavro) is loaded only when it is on."""
    if options.files is None:
        return None
    from kafka_txn_sink.files.plan import plan_for_options

    return plan_for_options(options.files, schema)
