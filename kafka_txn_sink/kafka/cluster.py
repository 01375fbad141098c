"""Questions the driver asks the cluster: topics, the broker's transaction limit, and whether a
record is visible to read_committed consumers (the fate probe)."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Mapping
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient, ConfigResource

from kafka_txn_sink.errors import KafkaUnavailableError
from kafka_txn_sink.kafka.client_cache import ClientCache

MAX_TIMEOUT_CONFIG = "transaction.max.timeout.ms"
# How long a shared Cluster trusts what it learnt: the brokers' transaction.max.timeout.ms and
# that a topic exists. Both only feed start-of-batch checks that tasks repeat anyway (librdkafka
# refuses a timeout above the maximum; producing to a missing topic fails the task).
FACTS_TTL_S = 300.0


def client_config(bootstrap: str, kafka: Mapping[str, str], timeout_ms: int) -> dict[str, Any]:
    """The user's kafka.* settings that apply to any client, plus explicit timeouts."""
    config: dict[str, Any] = {k: v for k, v in kafka.items() if not _producer_only(k)}
    config.update(
        {
            "bootstrap.servers": bootstrap,
            "socket.timeout.ms": timeout_ms,
            "socket.connection.setup.timeout.ms": timeout_ms,
        }
    )
    return config


class Cluster:
    """The driver's librdkafka admin client: topics, limits, and the fate probe."""
    def __init__(self, bootstrap: str, kafka: Mapping[str, str], timeout_ms: int = 15_000):
        self._bootstrap = bootstrap
        self._config = client_config(bootstrap, kafka, timeout_ms)
        self._timeout_s = timeout_ms / 1000
        self._admin = AdminClient(self._config)
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
            with self._facts_lock:
                self._topics_seen[topic] = time.monotonic()
        return exists

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

    def topic_partitions(self, topic: str) -> int | None:
        """Number of partitions of `topic`, None if it does not exist."""
        metadata = self._metadata(topic)
        found = metadata.topics.get(topic)
        if found is None or found.error is not None:
            return None
        return len(found.partitions)

    def max_transaction_timeout_ms(self) -> int:
        """The brokers' transaction.max.timeout.ms (the smallest, if they disagree)."""
        brokers = self._metadata(None).brokers
        resources = [ConfigResource(ConfigResource.Type.BROKER, str(b)) for b in brokers]
        values = []
        for future in self._admin.describe_configs(resources).values():
            try:
                entries = future.result(timeout=self._timeout_s)
            except KafkaException as exc:
                raise KafkaUnavailableError(f"DescribeConfigs failed: {exc}") from exc
            values.append(int(entries[MAX_TIMEOUT_CONFIG].value))
        return min(values)

    def is_visible(self, topic: str, partition: int, offset: int) -> bool | None:
        """Whether the record at `offset` is visible to read_committed consumers.

        True: it was committed. False: read_committed skipped it (aborted). None: undecided
        within the deadline (still open, or the broker did not answer).
        """
        consumer = Consumer(
            {
                **self._config,
                "group.id": f"kafka-txn-sink-probe-{uuid.uuid4()}",
                "isolation.level": "read_committed",
                "enable.auto.commit": False,
                "enable.partition.eof": True,
                "auto.offset.reset": "earliest",
            }
        )
        try:
            consumer.assign([TopicPartition(topic, partition, offset)])
            return _probe(consumer, offset, time.monotonic() + self._timeout_s)
        finally:
            consumer.close()

    def _metadata(self, topic: str | None) -> Any:
        try:
            return self._admin.list_topics(topic=topic, timeout=self._timeout_s)
        except KafkaException as exc:
            raise KafkaUnavailableError(
                f"cannot reach Kafka at kafka.bootstrap.servers={self._bootstrap}: "
                f"{exc.args[0].str() if exc.args else exc}"
            ) from exc


def _probe(consumer: Consumer, offset: int, deadline: float) -> bool | None:
    while time.monotonic() < deadline:
        message = consumer.poll(0.2)
        if message is None:
            continue
        error = message.error()
        if error is None:
            return message.offset() == offset
        # At the end of what read_committed may see: past the offset means it was skipped.
        if error.code() == KafkaError._PARTITION_EOF and (message.offset() or 0) > offset:
            return False
    return None


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
