"""The data source Spark finds as `format("kafka_txn")`, and `register(spark)`.

`streamWriter()` turns the user's options into the writer of one batch: it parses and checks
the options (options.py) and the input schema against each output, runs the driver's start of
a batch (protocol/start.py), and hands the tasks a `TaskPlan` (protocol/prepare.py).
"""

from __future__ import annotations

from typing import Any

from pyspark.errors import AnalysisException
from pyspark.sql import SparkSession
from pyspark.sql.datasource import DataSource, DataSourceStreamWriter
from pyspark.sql.types import StructType

from kafka_txn_sink.errors import ConfigError
from kafka_txn_sink.options import SinkOptions, parse_options
from kafka_txn_sink.protocol.prepare import TaskPlan
from kafka_txn_sink.protocol.start import start_batch
from kafka_txn_sink.protocol.stream_writer import stream_writer_class
from kafka_txn_sink.records.columns import plan_columns

NAME = "kafka_txn"


class KafkaTxnDataSource(DataSource):
    """Exactly-once streaming sink to Kafka, and to Avro files (options: README, options.py)."""

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
        options = parse_options(self.options)
        columns = plan_columns(schema, options.topic) if options.records_mode else None
        files_plan = _plan_files(options, schema)
        start = start_batch(options)
        plan = TaskPlan(
            options=start.options,
            columns=columns,
            files_plan=files_plan,
            log_query_id=start.log_query_id,
            last_decided=start.last_decided,
        )
        return stream_writer_class()(plan)


def register(spark: SparkSession) -> None:
    """Register `format("kafka_txn")` explicitly, checking the Spark settings it relies on.

    Raises:
        ConfigError: spark.speculation is on (speculative copies of a task would fence each
            other's transactions).
    """
    if (spark.conf.get("spark.speculation", "false") or "false").lower() == "true":
        raise ConfigError(
            "spark.speculation=true is not supported by kafka_txn: speculative task copies "
            "share a transactional id and fence each other; set spark.speculation=false"
        )
    try:
        spark.dataSource.register(KafkaTxnDataSource)
    except AnalysisException as exc:
        # Spark found it by itself: the Python workers have this package, whose top-level
        # module pyspark_kafka_txn offers it, and Spark refuses to register it a second time.
        if exc.getCondition() != "DATA_SOURCE_ALREADY_EXISTS":
            raise


def _plan_files(options: SinkOptions, schema: StructType) -> Any:
    """Files mode's plan, or None; files mode (and fastavro) is loaded only when it is on."""
    if options.files is None:
        return None
    from kafka_txn_sink.files.plan import plan_for_options

    return plan_for_options(options.files, schema)
