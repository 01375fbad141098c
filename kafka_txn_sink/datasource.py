"""The data source Spark finds as `format("kafka_txn")`, and `register(spark)`.

`streamWriter()` (a streaming query's batch) and `writer()` (a batch write, `df.write`) parse
and check the options (options.py) and hand the rest to the planner (planner.py), which checks
the input schema, runs the driver's start and builds the tasks' plan. Spark builds a streaming
query's writer a second time for each batch's commit() or abort(): that writer is the commit
worker's (commit_worker.py), built from the options alone.
"""

from __future__ import annotations

from pyspark.errors import AnalysisException
from pyspark.sql import SparkSession
from pyspark.sql.datasource import DataSource, DataSourceStreamWriter, DataSourceWriter
from pyspark.sql.types import StructType

from kafka_txn_sink.commit_worker import CommitWorkerWriter, building_for_commit
from kafka_txn_sink.errors import ConfigError
from kafka_txn_sink.group_options import CONSUMER_GROUP
from kafka_txn_sink.option_extras import checked_options
from kafka_txn_sink.options import WRITE_ID

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
        from kafka_txn_sink.planner import stream_writer  # not in the commit worker: planner.py

        return stream_writer(options, schema, self.options)

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
        from kafka_txn_sink.planner import batch_writer

        return batch_writer(options, schema, write_id)


def register(spark: SparkSession) -> None:
    """Register `format("kafka_txn")` explicitly, checking the Spark settings it relies on.

    Raises:
        ConfigError: spark.speculation is on (speculative copies of a task would fence each
            other's transactions). Found by its short name, the sink's tasks refuse it instead.
    """
    from kafka_txn_sink.protocol.prepare import SPECULATION, refuse_speculation

    refuse_speculation(spark.conf.get(SPECULATION, "false"))
    try:
        spark.dataSource.register(KafkaTxnDataSource)
    except AnalysisException as exc:
        # Spark found it by itself: the Python workers have this package, whose top-level
        # module pyspark_kafka_txn offers it, and Spark refuses to register it a second time.
        if exc.getCondition() != "DATA_SOURCE_ALREADY_EXISTS":
            raise
