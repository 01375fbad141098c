"""Before each batch, on the driver: the checks and the recovery a batch starts from.

`start_batch` runs in `streamWriter()`, which Spark calls before each batch's tasks and again in
the commit worker after they prepared, so it never aborts an open transaction (those may be the
batch's participants). It:
1. checks the output topics exist and fits the transaction timeout to the brokers' maximum;
2. lets librdkafka judge the user's `kafka.*` settings once, here, rather than in every task;
3. makes sure the commit log belongs to this sink (claiming it on the sink's first start, unless
   the brokers already know this sink's ids: a deleted or moved log);
4. rolls forward every decided batch without a completion marker;
5. reads what the tasks need from the log: whose log it is and the last decided batch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from confluent_kafka import KafkaException, Producer

from kafka_txn_sink.commit_log import CommitLog
from kafka_txn_sink.errors import ConfigError
from kafka_txn_sink.kafka.admin_api import ClusterFacts, TransactionAdmin
from kafka_txn_sink.kafka.cluster import discard_cluster
from kafka_txn_sink.options import REFERENCES_TOPIC, TOPIC, TRANSACTION_TIMEOUT, SinkOptions
from kafka_txn_sink.protocol.messages import SinkMeta, now_ms
from kafka_txn_sink.protocol.recover import known_ids, roll_forward
from kafka_txn_sink.protocol.session import driver_session, shared_cluster_of
from kafka_txn_sink.protocol.txn_ids import transactional_id
from kafka_txn_sink.storage import open_storage


@dataclass(frozen=True)
class BatchStart:
    """What a batch's tasks start from: resolved options and what the commit log says."""

    options: SinkOptions
    log_query_id: str | None
    last_decided: int | None


def start_batch(options: SinkOptions) -> BatchStart:
    """Check, recover and read the log before a batch (the steps in this module's docstring).

    Raises:
        ConfigError: an option does not fit the cluster or the log.
        KafkaUnavailableError: the brokers cannot be reached.
        TransactionLostError / TransactionCompletionError: rolling forward found a loss, or
            could not settle a participant yet.
    """
    cluster = shared_cluster_of(options)
    try:
        options = resolve_against_cluster(options, cluster)
        check_producer_settings(options)
    except BaseException:
        discard_cluster(cluster)
        raise
    with driver_session(options) as session:
        claim_log(options, session.commit_log, session.txn_admin)
        roll_forward(session.commit_log, session.settler)
        latest = session.commit_log.latest_decision()
    return BatchStart(
        options,
        log_query_id=latest.query_id if latest else None,
        last_decided=latest.batch_id if latest else None,
    )


def resolve_against_cluster(
    options: SinkOptions, cluster: ClusterFacts | None = None
) -> SinkOptions:
    """Check the topic exists and fit the transaction timeout to the brokers' maximum.

    With a shared `cluster`, a topic seen to exist and the brokers' maximum are remembered for
    a few minutes (cluster.FACTS_TTL_S): tasks check both again anyway (producing to a missing
    topic fails the task; librdkafka's InitProducerId refuses a timeout above the maximum).

    Raises:
        KafkaUnavailableError: the brokers cannot be reached.
        ConfigError: the topic is missing, or the timeout is above the brokers' maximum.
    """
    if cluster is None:
        cluster = shared_cluster_of(options)
    if options.topic is not None and not cluster.topic_exists(options.topic):
        raise ConfigError(
            f"topic {options.topic!r} (option {TOPIC}) does not exist on the cluster"
        )
    refs = options.files.references_topic if options.files is not None else None
    if refs is not None and not cluster.topic_exists(refs):
        raise ConfigError(
            f"topic {refs!r} (option {REFERENCES_TOPIC}) does not exist on the cluster"
        )
    broker_max = cluster.cached_max_transaction_timeout_ms()
    wanted = options.transaction_timeout_ms
    if wanted is None:
        return options.with_transaction_timeout(broker_max)
    if wanted > broker_max:
        raise ConfigError(
            f"option {TRANSACTION_TIMEOUT}={wanted} is above the brokers' "
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
    config = options.producer_config(transactional_id(options.sink_id, 0))
    try:
        Producer(config)  # no request is sent before init_transactions(); dropped at once
    except (KafkaException, ValueError, TypeError) as exc:
        raise ConfigError(f"a kafka.* option is not a valid producer setting: {exc}") from None
    _CHECKED_PRODUCER_SETTINGS.add(key)


def claim_log(options: SinkOptions, commit_log: CommitLog, txn_admin: TransactionAdmin) -> None:
    """Make sure the log belongs to this sink, creating it on the sink's first start.

    Raises:
        ConfigError: the log belongs to another sink, or it is new while the brokers already
            know this sink's transactional ids (a deleted or moved commit log).
    """
    meta = commit_log.sink_meta()
    if meta is None:
        _probe_storage(options)
        known = known_ids(options.sink_id, txn_admin)
        if known:
            raise ConfigError(
                f"commit log {options.commit_log} is empty, but the brokers already know "
                f"transactional ids of sink {options.sink_id} ({', '.join(known[:5])}): the log "
                f"was deleted or moved. Restore it, or use a new sinkId; starting over would "
                f"lose track of what was committed."
            )
        meta = commit_log.create(SinkMeta(sink_id=options.sink_id, created_at_ms=now_ms()))
    if meta.sink_id != options.sink_id:
        raise ConfigError(
            f"commit log {options.commit_log} belongs to sink {meta.sink_id}, not to "
            f"{options.sink_id} (option sinkId)"
        )


def _probe_storage(options: SinkOptions) -> None:
    storage = open_storage(options.commit_log, options.s3)
    probe = getattr(storage, "probe_conditional_writes", None)
    if probe is not None:
        probe()
