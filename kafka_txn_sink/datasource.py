"""The data source Spark finds as `format("kafka_txn")`, and `register(spark)`."""

from __future__ import annotations

import logging
import time
from typing import Any

from confluent_kafka import KafkaException, Producer
from pyspark.errors import AnalysisException
from pyspark.sql import SparkSession
from pyspark.sql.datasource import DataSource, DataSourceStreamWriter
from pyspark.sql.types import StructType

from kafka_txn_sink.commit_log import CommitLog
from kafka_txn_sink.errors import ConfigError, KafkaTxnSinkError
from kafka_txn_sink.kafka.cluster import Cluster, discard_cluster, shared_cluster
from kafka_txn_sink.kafka.producer import producer_config
from kafka_txn_sink.kafka.txn_admin import TxnAdmin, discard_txn_admin, shared_txn_admin
from kafka_txn_sink.options import SinkOptions, parse_options
from kafka_txn_sink.protocol.complete import Settler
from kafka_txn_sink.protocol.messages import SinkMeta
from kafka_txn_sink.protocol.stream_writer import (
    KafkaTxnStreamArrowWriter,
    KafkaTxnStreamWriter,
    driver_commit_log,
    stream_writer_class,
)
from kafka_txn_sink.protocol.txn_ids import owns, transactional_id
from kafka_txn_sink.records.columns import plan_columns
from kafka_txn_sink.storage import open_storage

log = logging.getLogger(__name__)

NAME = "kafka_txn"
# Ids probed when the cluster does not allow ListTransactions.
_PROBED_IDS_WITHOUT_LISTING = 256


class KafkaTxnDataSource(DataSource):
    """Exactly-once streaming sink to Kafka. Options: see README."""

    @classmethod
    def name(cls) -> str:
        return NAME

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        """Validate, recover decided batches, and hand the log's state to the tasks.

        Spark runs this before each batch's tasks and again in the commit worker after they
        prepared, so it never aborts an open transaction: those may be the batch's participants.
        """
        if overwrite:
            raise ConfigError(
                "output mode complete is not supported: kafka_txn appends; use outputMode append"
            )
        options = parse_options(self.options)
        columns = plan_columns(schema, options.topic) if options.records_mode else None
        files_plan = _plan_files(options, schema)
        # Spark reuses this Python process for later batches: the clients, the log object and
        # what the cluster said are kept (per process, per connection settings); a failure
        # drops them, so the next batch starts afresh.
        cluster = shared_cluster(
            options.bootstrap_servers, options.kafka, options.commit_timeout_ms
        )
        try:
            options = resolve_against_cluster(options, cluster)
            check_producer_settings(options)
            commit_log = driver_commit_log(options)
            txn_admin = shared_txn_admin(
                options.bootstrap_servers, options.kafka, options.commit_timeout_ms
            )
        except BaseException:
            discard_cluster(cluster)
            raise
        try:
            claim_log(options, commit_log, txn_admin)
            Settler.for_options(options, commit_log, txn_admin, cluster).roll_forward_incomplete()
            latest = commit_log.latest_decision()
        except BaseException:
            discard_cluster(cluster)
            discard_txn_admin(txn_admin)
            raise
        log_query_id = latest.query_id if latest else None
        last_decided = latest.batch_id if latest else None
        if stream_writer_class() is KafkaTxnStreamArrowWriter:
            return KafkaTxnStreamArrowWriter(
                options, columns, files_plan, log_query_id, last_decided, schema=schema
            )
        return KafkaTxnStreamWriter(options, columns, files_plan, log_query_id, last_decided)


def resolve_against_cluster(options: SinkOptions, cluster: Cluster | None = None) -> SinkOptions:
    """Check the topic exists and fit the transaction timeout to the brokers' maximum.

    With a shared `cluster`, a topic seen to exist and the brokers' maximum are remembered for
    a few minutes (cluster.FACTS_TTL_S): tasks check both again anyway (producing to a missing
    topic fails the task; librdkafka's InitProducerId refuses a timeout above the maximum).

    Raises:
        KafkaUnavailableError: the brokers cannot be reached.
        ConfigError: the topic is missing, or the timeout is above the brokers' maximum.
    """
    if cluster is None:
        cluster = Cluster(options.bootstrap_servers, options.kafka, options.commit_timeout_ms)
    if options.topic is not None and not cluster.topic_exists(options.topic):
        raise ConfigError(f"topic {options.topic!r} (option topic) does not exist on the cluster")
    refs = options.files.references_topic if options.files is not None else None
    if refs is not None and not cluster.topic_exists(refs):
        raise ConfigError(f"topic {refs!r} (option referencesTopic) does not exist on the cluster")
    broker_max = cluster.cached_max_transaction_timeout_ms()
    wanted = options.transaction_timeout_ms
    if wanted is None:
        return options.with_transaction_timeout(broker_max)
    if wanted > broker_max:
        raise ConfigError(
            f"option transactionTimeoutMs={wanted} is above the brokers' "
            f"transaction.max.timeout.ms={broker_max}; lower it or raise the broker setting"
        )
    return options


_CHECKED_PRODUCER_SETTINGS: set[tuple[Any, ...]] = set()


def check_producer_settings(options: SinkOptions) -> None:
    """Let librdkafka judge the kafka.* settings here, not in every task (once per process).

    Raises:
        ConfigError: librdkafka refuses a setting; the message names it.
    """
    key = (
        options.bootstrap_servers,
        tuple(sorted(options.kafka.items())),
        options.require_transaction_timeout(),
    )
    if key in _CHECKED_PRODUCER_SETTINGS:
        return
    config = producer_config(
        options.bootstrap_servers,
        options.kafka,
        transactional_id(options.sink_id, 0),
        options.require_transaction_timeout(),
    )
    try:
        Producer(config)  # no request is sent before init_transactions(); dropped at once
    except (KafkaException, ValueError, TypeError) as exc:
        raise ConfigError(f"a kafka.* option is not a valid producer setting: {exc}") from None
    _CHECKED_PRODUCER_SETTINGS.add(key)


def claim_log(options: SinkOptions, commit_log: CommitLog, txn_admin: TxnAdmin) -> None:
    """Make sure the log belongs to this sink, creating it on the sink's first start.

    Raises:
        ConfigError: the log belongs to another sink, or it is new while the brokers already
            know this sink's transactional ids (a deleted or moved commit log).
    """
    meta = commit_log.sink_meta()
    if meta is None:
        _probe_storage(options)
        known = _known_ids(options.sink_id, txn_admin)
        if known:
            raise ConfigError(
                f"commit log {options.commit_log} is empty, but the brokers already know "
                f"transactional ids of sink {options.sink_id} ({', '.join(known[:5])}): the log "
                f"was deleted or moved. Restore it, or use a new sinkId; starting over would "
                f"lose track of what was committed."
            )
        meta = commit_log.create(SinkMeta(sink_id=options.sink_id, created_at_ms=_now_ms()))
    if meta.sink_id != options.sink_id:
        raise ConfigError(
            f"commit log {options.commit_log} belongs to sink {meta.sink_id}, not to "
            f"{options.sink_id} (option sinkId)"
        )


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


def _probe_storage(options: SinkOptions) -> None:
    storage = open_storage(options.commit_log, options.s3)
    probe = getattr(storage, "probe_conditional_writes", None)
    if probe is not None:
        probe()


def _known_ids(sink_id: str, txn_admin: TxnAdmin) -> list[str]:
    try:
        return [i for i in txn_admin.list_ids() if owns(sink_id, i)]
    except KafkaTxnSinkError:
        ids = [transactional_id(sink_id, p) for p in range(_PROBED_IDS_WITHOUT_LISTING)]
        return sorted(i for i, s in txn_admin.describe(ids).items() if s.state != "NotFound")


def _now_ms() -> int:
    return int(time.time() * 1000)


def _plan_files(options: SinkOptions, schema: StructType) -> Any:
    """Files mode's plan, or None; files mode (and fastavro) is loaded only when it is on."""
    if options.files is None:
        return None
    from kafka_txn_sink.files.writer import plan_for_options

    return plan_for_options(options.files, schema)
