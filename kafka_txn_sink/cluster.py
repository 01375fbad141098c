"""Questions the driver asks the cluster: topics, the broker's transaction limit, and whether a
record is visible to read_committed consumers (the fate probe)."""

from __future__ import annotations

import time
import uuid
from collections.abc import Mapping
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient, ConfigResource

from kafka_txn_sink.errors import KafkaUnavailableError

MAX_TIMEOUT_CONFIG = "transaction.max.timeout.ms"


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
    def __init__(self, bootstrap: str, kafka: Mapping[str, str], timeout_ms: int = 15_000):
        self._bootstrap = bootstrap
        self._config = client_config(bootstrap, kafka, timeout_ms)
        self._timeout_s = timeout_ms / 1000
        self._admin = AdminClient(self._config)

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
