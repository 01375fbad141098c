"""Questions the driver asks the cluster: topics, the broker's transaction limit, what a
transaction's records say of its fate (the fate probe, `fate.py`), and a consumer group's
offsets and members (`groups.py`; offsets through kafka-python, the rest through librdkafka)."""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from confluent_kafka import KafkaError, KafkaException, TopicCollection
from confluent_kafka.admin import AdminClient, ConfigResource, NewTopic

from kafka_txn_sink.errors import ConfigError, KafkaUnavailableError
from kafka_txn_sink.kafka.admin_api import FateAnswer
from kafka_txn_sink.kafka.client_cache import ClientCache
from kafka_txn_sink.kafka.fate import ProbeFailed, probe_fate
from kafka_txn_sink.kafka.groups import (
    GroupRefused,
    active_members,
    fetch_offsets,
    group_error,
    log_ends,
    progress_fate,
    settled_offsets,
)
from kafka_txn_sink.kafka.permissions import (
    CLUSTER_DESCRIBE_CONFIGS,
    denied,
    refused,
    topic_permission,
)
from kafka_txn_sink.kafka.security import librdkafka_config
from kafka_txn_sink.protocol.messages import GroupOffsets, GroupProgress, OffsetRanges

if TYPE_CHECKING:  # kafka-python is loaded when a consumer group is first asked, not before
    from kafka_txn_sink.kafka.txn_admin import TxnAdmin

MAX_TIMEOUT_CONFIG = "transaction.max.timeout.ms"
MAX_MESSAGE_BYTES = "max.message.bytes"
# How long a shared Cluster trusts what it learnt: the brokers' transaction.max.timeout.ms and
# that a topic exists. Both only feed start-of-batch checks that tasks repeat anyway (librdkafka
# refuses a timeout above the maximum; producing to a missing topic fails the task).
FACTS_TTL_S = 300.0


def client_config(bootstrap: str, kafka: Mapping[str, str], timeout_ms: int) -> dict[str, Any]:
    """The user's kafka.* settings that apply to any client, plus explicit timeouts."""
    config: dict[str, Any] = {
        # As the producers (producer_settings.py): with sparse connections, librdkafka 2.16
        # drops the bootstrap connection once it learns the brokers and waits out a 50 ms
        # retry timer, so a new client's first request took 54 ms instead of 2-7.
        "enable.sparse.connections": False,
    }
    config.update((k, v) for k, v in kafka.items() if not _producer_only(k))
    config.update(
        {
            "bootstrap.servers": bootstrap,
            "socket.timeout.ms": timeout_ms,
            "socket.connection.setup.timeout.ms": timeout_ms,
        }
    )
    return config


# CreateTopics errors that name what was asked: partitions, replication factor, configs, policy.
_REFUSED_SETTINGS = (
    KafkaError.INVALID_PARTITIONS,
    KafkaError.INVALID_REPLICATION_FACTOR,
    KafkaError.INVALID_CONFIG,
    KafkaError.POLICY_VIOLATION,
)


class Cluster:
    """The driver's librdkafka admin client: topics, limits, and the fate probe."""

    def __init__(self, bootstrap: str, kafka: Mapping[str, str], timeout_ms: int = 15_000):
        self._bootstrap = bootstrap
        self._kafka = dict(kafka)
        self._config = client_config(bootstrap, kafka, timeout_ms)
        self._timeout_ms = timeout_ms
        self._timeout_s = timeout_ms / 1000
        # librdkafka reports a refused login here only; a request then fails as "transport".
        self._login_refused: KafkaError | None = None
        admin_config: dict[str, Any] = {
            **librdkafka_config(self._config),
            "error_cb": self._on_error,
        }
        self._admin = AdminClient(admin_config)
        self._facts_lock = threading.Lock()
        self._max_timeout: tuple[float, int] | None = None  # (learnt at, value)
        self._topics_seen: dict[str, float] = {}  # topic -> when it was last seen to exist

    def topic_exists(self, topic: str) -> bool:
        """Whether `topic` exists; a positive answer is remembered for FACTS_TTL_S."""
        with self._facts_lock:
            seen = self._topics_seen.get(topic)
        if seen is not None and time.monotonic() - seen < FACTS_TTL_S:
            return True
        exists = self.topic_partitions(topic) is not None
        if exists:
            self._check_topic_permissions(topic)
            with self._facts_lock:
                self._topics_seen[topic] = time.monotonic()
        return exists

    def _check_topic_permissions(self, topic: str) -> None:
        """Refuse at the start a topic the sink may not write, or read back (the fate probe
        reads a participant's records when its EndTxn failed), naming the permission.

        The brokers say what the caller may do (KIP-430); brokers that do not say, or a
        request that fails, leave the check to the steps themselves.
        """
        future = self._admin.describe_topics(
            TopicCollection([topic]),
            include_authorized_operations=True,
            request_timeout=self._timeout_s,
        )[topic]
        try:
            allowed = {
                op.name for op in future.result(timeout=self._timeout_s).authorized_operations or []
            }
        except (KafkaException, TimeoutError):
            return
        if not allowed or "ALL" in allowed:
            return
        for operation in ("WRITE", "READ"):
            if operation not in allowed:
                permission = topic_permission(operation.capitalize(), topic)
                raise denied(permission, self._kafka, f"checking what the sink may do on {topic}")

    def cached_max_transaction_timeout_ms(self) -> int:
        """`max_transaction_timeout_ms`, asked again after FACTS_TTL_S."""
        with self._facts_lock:
            known = self._max_timeout
        if known is not None and time.monotonic() - known[0] < FACTS_TTL_S:
            return known[1]
        value = self.max_transaction_timeout_ms()
        with self._facts_lock:
            self._max_timeout = (time.monotonic(), value)
        return value

    def create_topic(
        self, topic: str, partitions: int, replication_factor: int, config: Mapping[str, str]
    ) -> int | None:
        """Create `topic` (-1: the brokers' default); the partition count of the topic that
        already exists instead, None once created and listed by the brokers.

        Raises:
            PermissionDeniedError: the sink may not create it (Create on the topic).
            KafkaUnavailableError: the brokers refused it otherwise, did not answer, or did not
                list the topic within the client timeout.
        """
        wanted = NewTopic(
            topic,
            num_partitions=partitions,
            replication_factor=replication_factor,
            config=dict(config),
        )
        future = self._admin.create_topics([wanted], request_timeout=self._timeout_s)[topic]
        try:
            future.result(timeout=self._timeout_s)
        except KafkaException as exc:
            error: KafkaError = exc.args[0]
            if error.code() == KafkaError.TOPIC_ALREADY_EXISTS:
                return self._await_listed(topic)
            step = f"creating topic {topic} (option createTopics)"
            denial = refused(
                error.code(), error.str(), self._kafka, step, topic_permission("Create", topic)
            )
            if denial is None and error.code() in _REFUSED_SETTINGS:
                denial = ConfigError(
                    f"{step}: the brokers refuse it: {error.str()}; check options "
                    f"createTopics.partitions, createTopics.replicationFactor and topic.config.*"
                )
            raise denial or KafkaUnavailableError(f"{step} failed: {error.str()}") from exc
        except TimeoutError as exc:
            raise KafkaUnavailableError(f"creating topic {topic}: no answer in time") from exc
        self._await_listed(topic)
        return None

    def _await_listed(self, topic: str) -> int:
        """The partition count of a topic CreateTopics just created or found, once the brokers
        list it.

        CreateTopics answers when the controller has the topic; the broker that answers the next
        metadata request may not know it yet (UNKNOWN_TOPIC_OR_PART for a few milliseconds).

        Raises:
            KafkaUnavailableError: the brokers did not list it within the client timeout.
        """
        deadline = time.monotonic() + self._timeout_s
        pause = 0.01
        while (partitions := self.topic_partitions(topic)) is None:
            if time.monotonic() + pause > deadline:
                raise KafkaUnavailableError(
                    f"topic {topic} exists by CreateTopics (option createTopics), but the "
                    f"brokers did not list it within {self._timeout_ms} ms"
                )
            time.sleep(pause)
            pause = min(pause * 2, 0.5)
        return partitions

    def max_message_bytes(self, topic: str) -> int:
        """The topic's max.message.bytes (DescribeConfigs on the topic).

        Raises:
            PermissionDeniedError: the sink may not describe the topic's configs.
            KafkaUnavailableError: the brokers did not answer.
        """
        resource = ConfigResource(ConfigResource.Type.TOPIC, topic)
        future = self._admin.describe_configs([resource])[resource]
        try:
            entries = future.result(timeout=self._timeout_s)
        except KafkaException as exc:
            error: KafkaError = exc.args[0]
            step = f"reading max.message.bytes of topic {topic} (option badRows=deadLetter)"
            denial = refused(
                error.code(),
                error.str(),
                self._kafka,
                step,
                topic_permission("DescribeConfigs", topic),
            )
            raise denial or KafkaUnavailableError(f"{step} failed: {error.str()}") from exc
        except TimeoutError as exc:
            raise KafkaUnavailableError(f"max.message.bytes of {topic}: no answer") from exc
        return int(entries[MAX_MESSAGE_BYTES].value)

    def topic_partitions(self, topic: str) -> int | None:
        """Number of partitions of `topic`, None if it does not exist."""
        metadata = self._metadata(topic)
        found = metadata.topics.get(topic)
        if found is not None and found.error is not None:
            denial = refused(
                found.error.code(),
                found.error.str(),
                self._kafka,
                f"looking up topic {topic}",
                topic_permission("Write", topic),
            )
            if denial is not None:
                raise denial
        if found is None or found.error is not None:
            return None
        return len(found.partitions)

    def max_transaction_timeout_ms(self) -> int:
        """The brokers' transaction.max.timeout.ms (the smallest, if they disagree)."""
        brokers = self._metadata(None).brokers
        resources = [ConfigResource(ConfigResource.Type.BROKER, str(b)) for b in brokers]
        values = []
        # librdkafka takes one BROKER resource per DescribeConfigs call.
        futures = [f for r in resources for f in self._admin.describe_configs([r]).values()]
        for future in futures:
            try:
                entries = future.result(timeout=self._timeout_s)
            except KafkaException as exc:
                error = exc.args[0]
                step = "reading the brokers' transaction.max.timeout.ms"
                denial = refused(
                    error.code(), error.str(), self._kafka, step, CLUSTER_DESCRIBE_CONFIGS
                )
                raise denial or KafkaUnavailableError(f"DescribeConfigs failed: {exc}") from exc
            values.append(int(entries[MAX_TIMEOUT_CONFIG].value))
        return min(values)

    def fate(self, offsets: OffsetRanges) -> FateAnswer:
        """The fate of the transaction that wrote `offsets`, read back from the log within
        the client timeout (`fate.probe_fate`).

        Raises:
            PermissionDeniedError: the sink may not read a topic of `offsets`.
            KafkaUnavailableError: a read failed other than by a timeout.
        """
        try:
            return probe_fate(self._config, offsets, self._timeout_s)
        except ProbeFailed as exc:
            step = f"reading back records of {exc.topic} (the fate probe)"
            denial = refused(
                exc.error.code(),
                exc.error.str(),
                self._kafka,
                step,
                topic_permission("Read", exc.topic),
            )
            raise denial or KafkaUnavailableError(f"{step} failed: {exc.error.str()}") from exc

    def progress_fate(self, progress: GroupProgress) -> FateAnswer:
        """The fate of the progress transaction that committed `progress`, from the group's
        stable offsets (`groups.progress_fate`).

        Raises:
            PermissionDeniedError: the sink may not read the group's offsets.
            KafkaUnavailableError: the group coordinator refused otherwise.
        """
        try:
            return progress_fate(self._groups(), progress, self._timeout_s)
        except GroupRefused as exc:
            step = f"reading the committed offsets of group {progress.group} (the fate probe)"
            raise group_error(exc, progress.group, self._kafka, step) from exc

    def committed_offsets(self, group: str) -> GroupOffsets:
        """Every offset consumer group `group` has committed (none pending).

        Raises:
            PermissionDeniedError: the sink may not read the group (Describe/Read on it).
            KafkaUnavailableError: the group coordinator refused otherwise, or a transaction's
                offsets are still pending.
        """
        try:
            return fetch_offsets(self._groups(), group, None, self._timeout_s, stable=True)
        except GroupRefused as exc:
            step = f"reading the committed offsets of group {group}"
            raise group_error(exc, group, self._kafka, step, "Describe") from exc

    def settled_offsets(self, group: str, partitions: GroupOffsets) -> GroupOffsets:
        """Consumer group `group`'s committed offsets of `partitions`, once none is pending (the
        sink reads them to commit to the group: a denial names Read on it).

        Raises:
            PermissionDeniedError: the sink may not read the group.
            KafkaUnavailableError: the group coordinator refused otherwise, or a transaction's
                offsets were still pending after the client timeout.
        """
        try:
            return settled_offsets(self._groups(), group, partitions, self._timeout_s)
        except GroupRefused as exc:
            step = f"reading the committed offsets of group {group}"
            if exc.error.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED:  # one of `partitions`
                error = exc.error
                denial = refused(
                    error.code(),
                    error.str(),
                    self._kafka,
                    step,
                    topic_permission("Read", min(partitions)),
                )
                raise denial or KafkaUnavailableError(f"{step} failed: {error.str()}") from exc
            raise group_error(exc, group, self._kafka, step, "Read") from exc

    def log_ends(self, offsets: GroupOffsets, stable: bool = False) -> GroupOffsets:
        """The end offset of each partition `offsets` names, on this cluster (with `stable`, the
        last stable offset: what a read_committed consumer can read up to).

        Raises:
            PermissionDeniedError: the sink may not describe a topic.
            KafkaUnavailableError: an end could not be read.
        """
        try:
            return log_ends(self._admin, offsets, self._timeout_s, stable)
        except GroupRefused as exc:
            step = f"reading the end offsets of {', '.join(sorted(offsets))}"
            error = exc.error
            denial = refused(
                error.code(),
                error.str(),
                self._kafka,
                step,
                topic_permission("Describe", min(offsets)),
            )
            raise denial or KafkaUnavailableError(f"{step} failed: {error.str()}") from exc

    def group_members(self, group: str) -> int:
        """How many members consumer group `group` has now.

        Raises:
            PermissionDeniedError: the sink may not describe the group.
            KafkaUnavailableError: the group coordinator refused otherwise.
        """
        try:
            return active_members(self._admin, group, self._timeout_s)
        except GroupRefused as exc:
            step = f"describing consumer group {group}"
            raise group_error(exc, group, self._kafka, step, "Describe") from exc

    def _groups(self) -> TxnAdmin:
        """The process's kafka-python client for these settings, which asks group coordinators
        for offsets (`groups.fetch_offsets` says why not librdkafka)."""
        from kafka_txn_sink.kafka.txn_admin import shared_txn_admin

        return shared_txn_admin(self._bootstrap, self._kafka, self._timeout_ms)

    def _on_error(self, error: KafkaError) -> None:
        if error.code() == KafkaError._AUTHENTICATION:
            self._login_refused = error

    def _metadata(self, topic: str | None) -> Any:
        try:
            return self._admin.list_topics(topic=topic, timeout=self._timeout_s)
        except KafkaException as exc:
            self._admin.poll(0)  # serves error_cb
            error = self._login_refused or (exc.args[0] if exc.args else None)
            denial = error and refused(
                error.code(), error.str(), self._kafka, f"connecting to {self._bootstrap}"
            )
            raise denial or KafkaUnavailableError(
                f"cannot reach Kafka at kafka.bootstrap.servers={self._bootstrap}: "
                f"{error.str() if error else exc}"
            ) from exc


_PRODUCER_ONLY = ("linger", "batch.", "compression", "queue.buffering", "message.", "partitioner")


def _producer_only(name: str) -> bool:
    return name.lower().startswith(_PRODUCER_ONLY)


# -- one Cluster per connection settings and process ---------------------------------------------


def _keep_open(_: Cluster) -> None:
    """librdkafka's admin client ends with its Python object."""


_SHARED: ClientCache[Cluster] = ClientCache(Cluster, _keep_open)


def shared_cluster(bootstrap: str, kafka: Mapping[str, str], timeout_ms: int) -> Cluster:
    """A Cluster kept for the life of this process, one per connection settings.

    The admin client's connections and what it learnt (see FACTS_TTL_S) outlive one batch.
    librdkafka's admin client is thread-safe and reconnects by itself; `discard_cluster` drops
    one after a failure anyway, so the next step starts from a fresh client.
    """
    return _SHARED.get(bootstrap, kafka, timeout_ms)


def discard_cluster(cluster: Cluster) -> None:
    """Forget a shared Cluster, so the next caller gets a fresh one."""
    _SHARED.discard(cluster)
