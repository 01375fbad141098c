"""A small topic read whole, and its ids compared with the input, in memory: the simple oracle
of the tests, the demo and the crash suite (`kafka_txn_sink.verify` is the one for real sizes).
"""

from __future__ import annotations

import time
import uuid
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from confluent_kafka import Consumer, KafkaError, TopicPartition

from kafka_txn_sink.errors import KafkaUnavailableError


@dataclass(frozen=True)
class Seen:
    """One record a consumer saw, where it saw it."""

    key: bytes | None
    value: bytes | None
    partition: int
    offset: int


@dataclass(frozen=True)
class IdReport:
    """Ids in against ids out: what is missing, duplicated or unexpected."""

    expected: int
    seen: int
    missing: list[str]
    duplicated: dict[str, int]  # id -> times seen (> 1)
    unexpected: list[str]

    @property
    def exact(self) -> bool:
        """Every id came out exactly as often as it went in."""
        return not (self.missing or self.duplicated or self.unexpected)

    def summary(self) -> str:
        """One line: ids in, out, duplicates, missing (and unexpected, if any)."""
        return (
            f"{self.expected} in, {self.seen} out, {len(self.duplicated)} duplicates, "
            f"{len(self.missing)} missing"
            + (f", {len(self.unexpected)} unexpected" if self.unexpected else "")
        )


def read_topic(
    bootstrap: str,
    topic: str,
    isolation: str = "read_committed",
    kafka: Mapping[str, str] | None = None,
    timeout_s: float = 60.0,
) -> list[Seen]:
    """Every record of `topic` visible at `isolation`, from the start to the current end.

    Raises:
        KafkaUnavailableError: the topic is missing, or its end is not reached in `timeout_s`
            (a read_committed reader stops at an open transaction).
    """
    consumer = Consumer(
        {
            **(kafka or {}),
            "bootstrap.servers": bootstrap,
            "group.id": f"kafka-txn-sink-verify-{uuid.uuid4()}",
            "isolation.level": isolation,
            "enable.auto.commit": False,
            "enable.partition.eof": True,
            "auto.offset.reset": "earliest",
        }
    )
    try:
        metadata = consumer.list_topics(topic, timeout=timeout_s)
        partitions = metadata.topics.get(topic)
        if partitions is None or partitions.error is not None:
            raise KafkaUnavailableError(f"topic {topic!r} does not exist")
        consumer.assign([TopicPartition(topic, p, 0) for p in partitions.partitions])
        return _drain(consumer, set(partitions.partitions), time.monotonic() + timeout_s)
    finally:
        consumer.close()


def compare_ids(expected: Iterable[str], seen: Iterable[str]) -> IdReport:
    """Count every id on both sides: a loss and a duplicate never cancel out."""
    wanted = Counter(expected)
    got = Counter(seen)
    return IdReport(
        expected=sum(wanted.values()),
        seen=sum(got.values()),
        missing=sorted(i for i in wanted if got[i] < wanted[i]),
        duplicated={i: n for i, n in sorted(got.items()) if n > max(wanted.get(i, 0), 1)},
        unexpected=sorted(i for i in got if i not in wanted),
    )


def _drain(consumer: Consumer, partitions: set[int], deadline: float) -> list[Seen]:
    records: list[Seen] = []
    pending = set(partitions)
    while pending:
        if time.monotonic() > deadline:
            raise KafkaUnavailableError(
                f"partitions {sorted(pending)} did not reach their end in time "
                f"(an open transaction holds read_committed readers back)"
            )
        message = consumer.poll(0.5)
        if message is None:
            continue
        error = message.error()
        if error is not None:
            if error.code() == KafkaError._PARTITION_EOF:
                pending.discard(message.partition() or 0)
                continue
            raise KafkaUnavailableError(f"reading failed: {error.str()}")
        partition, offset = message.partition() or 0, message.offset() or 0
        pending.add(partition)
        records.append(Seen(message.key(), message.value(), partition, offset))
    return records
