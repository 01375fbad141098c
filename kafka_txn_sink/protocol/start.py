"""Before each batch, on the driver: the checks and the recovery a batch starts from.

`start_batch` runs in `streamWriter()`, which Spark calls before each batch's tasks and again in
the commit worker after they prepared, so it never aborts an open transaction (those may be the
batch's participants). It:
1. checks the output topics exist and fits the transaction timeout to the brokers' maximum, and
   refuses one that does not exceed the commit margin (margin.py);
2. lets librdkafka judge the user's `kafka.*` settings once, here, rather than in every task;
3. makes sure the commit log belongs to this sink (claiming it on the sink's first start, unless
   the brokers already know this sink's ids: a deleted or moved log);
   With option consumerGroup, checks the input topics live on the output cluster and the
   group has no active member (progress.py);
4. finds this driver's run, recording a new one (and its id slot) on its first batch
   (runs.py), and stops if a newer run owns the sink;
5. rolls forward every decided batch without a completion marker;
6. reads what the tasks need from the log: whose log it is, the last decided batch, the run.

`start_write` does the same in `writer()`, before a batch write's (`df.write`) tasks, and then
finds the batch of the log the write is: the batch decided for its writeId before (its tasks
then write nothing, or write again the rows the brokers aborted: repair.py; refused if a repair
refused rows of it), or the batch after the last decided one. Both plan the repair that a
replay of the latest decided batch writes (repair.py). A sink serves one streaming query
or batch writes: each refuses a log the other writes to.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from confluent_kafka import KafkaException, Producer

from kafka_txn_sink import failpoints
from kafka_txn_sink.commit_log import CommitLog
from kafka_txn_sink.dead_letter_options import DEAD_LETTER_TOPIC
from kafka_txn_sink.errors import ConfigError, PermissionDeniedError, TransactionLostError
from kafka_txn_sink.files_options import REFERENCES_TOPIC
from kafka_txn_sink.kafka.admin_api import ClusterFacts, TransactionAdmin
from kafka_txn_sink.kafka.cluster import discard_cluster
from kafka_txn_sink.kafka.security import librdkafka_config
from kafka_txn_sink.options import (
    CLOCK_SKEW,
    COMMIT_LOG_FORMAT,
    COMMIT_LOG_TIMEOUT,
    COMMIT_TIMEOUT,
    TOPIC,
    TRANSACTION_TIMEOUT,
    WRITE_ID,
    SinkOptions,
)
from kafka_txn_sink.protocol.messages import Decision, LostParticipant, now_ms
from kafka_txn_sink.protocol.progress import check_progress_start
from kafka_txn_sink.protocol.recover import known_ids, roll_forward
from kafka_txn_sink.protocol.repair import RepairPlan, batch_levels, plan_repair
from kafka_txn_sink.protocol.run_records import SinkMeta
from kafka_txn_sink.protocol.runs import RunRef, check_current, release, take_over
from kafka_txn_sink.protocol.session import DriverSession, driver_session, shared_cluster_of
from kafka_txn_sink.protocol.txn_ids import transactional_id
from kafka_txn_sink.protocol.write_ids import BatchWrite, is_batch_write, write_query_id
from kafka_txn_sink.storage import open_storage
from kafka_txn_sink.topic_options import TopicCreation

log = logging.getLogger(__name__)

# How long a newer run that has gone quiet still counts as possibly alive (or the transaction
# timeout, if longer): Spark calls streamWriter() again within a batch (commit, abort), and a
# superseded driver must not take the sink back there.
MIN_FRESH_MS = 900_000


@dataclass(frozen=True)
class BatchStart:
    """What a batch's tasks start from: resolved options and what the commit log says."""

    options: SinkOptions
    log_query_id: str | None
    last_decided: int | None
    run: RunRef
    write: BatchWrite | None = None  # a batch write's batch; None for a streaming query
    repair: RepairPlan | None = None  # what a replay of the latest decided batch writes again


def start_batch(options: SinkOptions, for_commit: bool = False) -> BatchStart:
    """Check, recover and read the log before a batch (the steps in this module's docstring);
    `for_commit`: for the writer of a batch's commit() or abort(), without the consumer
    group's member check (kafka_txn_sink/commit_worker.py).

    Raises:
        ConfigError: an option does not fit the cluster or the log, or the log holds batch
            writes.
        KafkaUnavailableError: the brokers cannot be reached.
        TransactionCompletionError: rolling forward could not settle a participant yet.
    """
    failpoints.fire("driver.start")
    options = _fit_to_cluster(options)
    with driver_session(options) as session:
        if not for_commit:
            check_progress_start(options, session.cluster)
        latest, run = _claim_and_recover(session)
        _check_use(options, latest, batch_write=False)
        repair = plan_repair(session.commit_log, latest, session.settler)
    return BatchStart(
        options,
        log_query_id=latest.query_id if latest else None,
        last_decided=latest.batch_id if latest else None,
        run=run,
        repair=repair,
    )


def start_write(options: SinkOptions, write_id: str) -> BatchStart:
    """`start_batch` for a batch write, and the batch of the log that write `write_id` is.

    The batch decided for it before if there is one (its tasks then write nothing, and this
    logs a warning saying so, or repair what the brokers aborted of it), else the batch after
    the last decided one.

    Raises:
        ConfigError: as `start_batch`, or the log belongs to a streaming query.
        TransactionLostError: the write was decided before and rows of it are lost for good
            (`written_before`); nothing is written, the run released.
        KafkaUnavailableError, TransactionCompletionError: as `start_batch`.
    """
    options = _fit_to_cluster(options)
    with driver_session(options) as session:
        latest, run = _claim_and_recover(session)
        _check_use(options, latest, batch_write=True)
        earlier = find_write(session.commit_log, write_query_id(write_id)) if latest else None
        repair = None
        if earlier is not None:
            repair = written_before(session, earlier, write_id, run)
            batch_id = earlier.batch_id
        else:
            batch_id = latest.batch_id + 1 if latest else 0
    return BatchStart(
        options,
        log_query_id=latest.query_id if latest else None,
        last_decided=latest.batch_id if latest else None,
        run=run,
        write=BatchWrite(write_id, batch_id),
        repair=repair,
    )


def find_write(commit_log: CommitLog, query_id: str) -> Decision | None:
    """The decision of the batch write whose query id is `query_id`, or None.

    Reads every decision of the log once (a batch may hold only abort records, so listing
    cannot tell decided batches), then looks newest first.
    """
    for decision in reversed(commit_log.decisions()):
        if decision.query_id == query_id:
            return decision
    return None


def _check_use(options: SinkOptions, latest: Decision | None, batch_write: bool) -> None:
    """A sinkId serves one streaming query or batch writes: refuse a log the other writes to.

    Raises:
        ConfigError: the log's latest decision is of the other kind.
    """
    if latest is None or not latest.query_id or is_batch_write(latest.query_id) == batch_write:
        return
    if batch_write:
        holds, other = f"belongs to streaming query {latest.query_id}", "batch writes"
    else:
        holds = (
            f"holds batch writes (df.write, option {WRITE_ID}; the last is batch "
            f"{latest.batch_id}, {latest.query_id})"
        )
        other = "the streaming query"
    raise ConfigError(
        f"the commit log {options.commit_log} of sink {options.sink_id} {holds}: a sinkId "
        f"serves either one streaming query or batch writes; use another sinkId and commitLog "
        f"for {other}"
    )


def written_before(
    session: DriverSession, decision: Decision, write_id: str, run: RunRef
) -> RepairPlan | None:
    """A re-run of write `write_id`, decided before as `decision`: the repair its tasks write
    when rows of it were recorded lost (protocol/repair.py); else say that nothing is written
    again, or refuse it if a repair refused rows of it before (they stay lost).

    Raises:
        TransactionLostError: rows of the write are lost for good; this run is released and
            nothing is written.
    """
    repair = plan_repair(session.commit_log, decision, session.settler)
    if repair is not None:
        log.warning(
            "write %r of sink %s was decided before (batch %d), but %d of its transactions "
            "were aborted by the brokers: this run writes their rows again (repair %d)",
            write_id,
            decision.sink_id,
            decision.batch_id,
            len(repair.lost),
            repair.level,
        )
        return repair
    refused = batch_levels(session.commit_log, decision).refused()
    if refused:
        release(session.options.sink_id, session.commit_log, run)
        raise TransactionLostError(_lost_write_message(decision, refused, write_id))
    log.warning(
        "write %r of sink %s was committed before (batch %d, %d row(s), decided at %s): "
        "nothing is written again",
        write_id,
        decision.sink_id,
        decision.batch_id,
        decision.rows,
        _decided_at(decision),
    )
    return None


def _lost_write_message(decision: Decision, refused: list[LostParticipant], write_id: str) -> str:
    lost = "; ".join(
        f"Spark partition {x.partition} ({x.triple.transactional_id}, {x.rows} row(s), offsets "
        f"{ {t: dict(r) for t, r in x.offsets.items()} }: {x.reason})"
        for x in refused
    )
    rows = sum(x.rows for x in refused)
    return (
        f"write {write_id!r} of sink {decision.sink_id} was decided before (batch "
        f"{decision.batch_id}, {decision.rows} row(s), decided at {_decided_at(decision)}), but "
        f"{rows} of its rows were recorded lost before they could be committed, and a run of "
        f"the write since did not produce the same rows to repair them: {lost}. Nothing was "
        f"written now. Write the rows of those Spark partitions again under a new writeId, and "
        f"check what reached Kafka with `kafka-txn-sink verify`."
    )


def _decided_at(decision: Decision) -> str:
    decided_at = datetime.fromtimestamp(decision.decided_at_ms / 1000, tz=timezone.utc)
    return decided_at.isoformat(timespec="seconds")


def _fit_to_cluster(options: SinkOptions) -> SinkOptions:
    """Steps 1 and 2: the options resolved against the cluster and judged by librdkafka."""
    cluster = shared_cluster_of(options)
    try:
        options = resolve_against_cluster(options, cluster)
        check_producer_settings(options)
    except BaseException:
        discard_cluster(cluster)
        raise
    return options


def _claim_and_recover(session: DriverSession) -> tuple[Decision | None, RunRef]:
    """Steps 3 to 6: claim the log, take the run, roll decided batches forward; the latest
    decision and the run."""
    options, commit_log = session.options, session.commit_log
    claim_log(options, commit_log, session.txn_admin)
    fresh_ms = max(options.transaction_timeout_ms or 0, MIN_FRESH_MS)
    owner = take_over(options.sink_id, commit_log, fresh_ms)
    run = RunRef(owner.run, owner.slot)
    roll_forward(commit_log, session.settler)
    check_current(options.sink_id, commit_log, run)
    return commit_log.latest_decision(), run


def resolve_against_cluster(
    options: SinkOptions, cluster: ClusterFacts | None = None
) -> SinkOptions:
    """Check the topic exists and fit the transaction timeout to the brokers' maximum.

    With a shared `cluster`, a topic seen to exist and the brokers' maximum are remembered for
    a few minutes (cluster.FACTS_TTL_S): tasks check both again anyway (producing to a missing
    topic fails the task; librdkafka's InitProducerId refuses a timeout above the maximum).

    Raises:
        KafkaUnavailableError: the brokers cannot be reached.
        ConfigError: the topic is missing, or the timeout is above the brokers' maximum or does
            not exceed the commit margin (`check_margin`).
        PermissionDeniedError: the topic may not be described, or (without option
            transactionTimeoutMs) the brokers' configuration read.
    """
    resolved = _resolve_timeout(options, cluster)
    check_margin(resolved)
    return resolved


def check_margin(options: SinkOptions) -> None:
    """Refuse a transaction timeout that does not exceed the commit margin: the prepare check
    would refuse every batch, since a transaction has less than its timeout left.

    Raises:
        ConfigError: names the timeout, the margin, its steps and the options they come from.
    """
    timeout = options.require_transaction_timeout()
    margin = options.margin_ms
    if timeout > margin:
        return
    raise ConfigError(
        f"the transaction timeout {timeout} ms (option {TRANSACTION_TIMEOUT}, or the brokers' "
        f"transaction.max.timeout.ms without it) does not exceed the commit margin of {margin} "
        f"ms, the longest the driver may take from its prepare check to its last EndTxn "
        f"({options.explain_margin()}), which options {COMMIT_LOG_TIMEOUT}="
        f"{options.commit_log_timeout_ms}, {COMMIT_TIMEOUT}={options.commit_timeout_ms}, "
        f"{CLOCK_SKEW}={options.clock_skew_ms} and {COMMIT_LOG_FORMAT}="
        f"{options.commit_log_format} make up: no batch could be decided. Raise "
        f"{TRANSACTION_TIMEOUT} (and the brokers' transaction.max.timeout.ms) above {margin} "
        f"ms, or lower those options."
    )


def _resolve_timeout(options: SinkOptions, cluster: ClusterFacts | None) -> SinkOptions:
    if cluster is None:
        cluster = shared_cluster_of(options)
    if options.create_topics is not None:
        _create_topics(options, options.create_topics, cluster)
    for name, topic in output_topics(options):
        if not cluster.topic_exists(topic):
            raise ConfigError(f"topic {topic!r} (option {name}) does not exist on the cluster")
    wanted = options.transaction_timeout_ms
    try:
        broker_max = cluster.cached_max_transaction_timeout_ms()
    except PermissionDeniedError as exc:
        if wanted is None:
            raise PermissionDeniedError(
                f"{exc}. Or set option {TRANSACTION_TIMEOUT}, which needs no such permission"
            ) from None
        # The tasks' InitProducerId is refused if `wanted` is above the brokers' maximum.
        return options
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
    config = options.producer_config(transactional_id(options.sink_id, 0, slot=0))
    try:
        Producer(librdkafka_config(config))  # no request before init_transactions(); dropped
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


PRODUCER_MAX_MESSAGE_BYTES = 1_000_000  # librdkafka's message.max.bytes, when not set


def dead_letter_limits(options: SinkOptions) -> dict[str, int]:
    """With option badRows=deadLetter, the most bytes a record may have in each topic of
    options topic and deadLetterTopic: the topic's max.message.bytes, or the producer's
    message.max.bytes when that is lower (records/dead_letter.py judges rows by them).

    Raises:
        PermissionDeniedError: the sink may not read a topic's configs (DescribeConfigs).
    """
    if options.dead_letter is None:
        return {}
    cluster = shared_cluster_of(options)
    producer = int(options.kafka.get("message.max.bytes", PRODUCER_MAX_MESSAGE_BYTES))
    topics = [t for t in (options.topic, options.dead_letter.topic) if t is not None]
    return {t: min(producer, cluster.max_message_bytes(t)) for t in topics}


def output_topics(options: SinkOptions) -> list[tuple[str, str]]:
    """The topics the sink writes to, each with the option that names it: `topic`,
    `referencesTopic` (files mode), `deadLetterTopic` (badRows=deadLetter)."""
    refs = options.files.references_topic if options.files is not None else None
    dead = options.dead_letter.topic if options.dead_letter is not None else None
    named = (
        (str(TOPIC), options.topic),
        (str(REFERENCES_TOPIC), refs),
        (str(DEAD_LETTER_TOPIC), dead),
    )
    return [(name, topic) for name, topic in named if topic is not None]


def _create_topics(options: SinkOptions, how: TopicCreation, cluster: ClusterFacts) -> None:
    """Option createTopics: create the output topics (`output_topics`) when missing, before any
    transaction opens; leave an existing one as it is (warned once per process when its
    partition count is not the one asked for).

    Raises:
        PermissionDeniedError: the sink may not create a missing topic (Create on it).
        ConfigError: the brokers refuse the partitions, replication factor or configs asked.
    """
    for _, topic in output_topics(options):
        if cluster.topic_exists(topic):
            if how.partitions > 0 and topic not in _WARNED:
                _warn_if_other_partitions(topic, cluster.topic_partitions(topic), how.partitions)
            continue
        found = cluster.create_topic(topic, how.partitions, how.replication_factor, how.config)
        if found is None:
            log.info("created topic %s (option createTopics)", topic)
        elif how.partitions > 0:
            _warn_if_other_partitions(topic, found, how.partitions)


_WARNED: set[str] = set()  # topics whose partition count was warned about in this process


def _warn_if_other_partitions(topic: str, found: int | None, wanted: int) -> None:
    _WARNED.add(topic)
    if found is not None and found != wanted:
        log.warning(
            "topic %s exists with %d partitions, not the %d of option createTopics.partitions: "
            "left as it is",
            topic,
            found,
            wanted,
        )
