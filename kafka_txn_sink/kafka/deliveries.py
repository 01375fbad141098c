"""What librdkafka reports back to a task's producer about its records: delivery reports (each
partition's first and last offset, the failure that caused the others) and the `eos` object of
its statistics, the only place it shows the transaction's producer id and epoch.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import KafkaError, Message

from kafka_txn_sink.protocol.messages import OffsetRanges

# Delivery errors that only say a message was dropped because the transaction had failed.
PURGED = (KafkaError._PURGE_QUEUE, KafkaError._PURGE_INFLIGHT)


@dataclass
class Deliveries:
    """Delivery reports of one transaction: offsets per partition and the error that caused
    the first failure."""

    ranges: dict[tuple[str, int], list[int]] = field(default_factory=dict)
    error: KafkaError | None = None
    error_topic: str | None = None
    delivered_to: dict[tuple[str, int], int] = field(default_factory=dict)

    def on_delivery(self, err: KafkaError | None, msg: Message) -> None:
        """librdkafka's delivery callback of one record."""
        if err is not None:
            # A purge is the consequence of another failure (the transaction became abortable),
            # whose own report may come later, from another partition: that one is the cause.
            if self.error is None or (self.purged_only and err.code() not in PURGED):
                self.error, self.error_topic = err, msg.topic()
            return
        where = (msg.topic() or "", msg.partition() or 0)
        self.delivered_to[where] = self.delivered_to.get(where, 0) + 1
        self.record(*where, msg.offset() or 0)

    def record(self, topic: str, partition: int, offset: int) -> None:
        """Widen the range of `(topic, partition)` to `offset`."""
        seen = self.ranges.get((topic, partition))
        if seen is None:
            self.ranges[(topic, partition)] = [offset, offset]
        else:
            seen[0], seen[1] = min(seen[0], offset), max(seen[1], offset)

    @property
    def delivered(self) -> int:
        """The records reported delivered."""
        return sum(self.delivered_to.values())

    @property
    def purged_only(self) -> bool:
        """The failure recorded is a purge (the consequence of another failure)."""
        return self.error is not None and self.error.code() in PURGED

    def offsets(self) -> OffsetRanges:
        """The delivered offsets' range per topic and partition."""
        result: OffsetRanges = {}
        for (topic, partition), (first, last) in sorted(self.ranges.items()):
            result.setdefault(topic, {})[partition] = (first, last)
        return result


Reports = dict[KafkaError | None, Message]


@dataclass
class PartitionReports:
    """Delivery reports of the records `send_many` sent to one partition, kept without a Python
    call per record: a reported record's callback is the C method `dict.__setitem__` of `first`
    (the partition's first record) or of `rest` (a later one; past the task's first
    REPORTED_RECORDS only each call's last, the others are `unreported`), so each dict maps None
    to the latest delivered message and each error to a message that failed with it. An
    idempotent producer writes and reports one partition's records in the order they were
    produced, so `first[None]` holds the partition's lowest offset and `rest[None]` its highest.
    """

    first: Reports = field(default_factory=dict)
    rest: Reports = field(default_factory=dict)
    sent: int = 0  # every record sent to the partition
    unreported: int = 0  # of them, those sent without a delivery report

    def callback(self) -> Callable[[KafkaError | None, Message], None]:
        """The delivery callback of the next record sent to this partition."""
        return self.rest.__setitem__ if self.sent else self.first.__setitem__

    def take_errors(self) -> list[tuple[KafkaError, Message]]:
        """The failures reported since the last call."""
        failed = [
            (error, msg)
            for reports in (self.first, self.rest)
            for error, msg in reports.items()
            if error is not None
        ]
        for error, _ in failed:
            self.first.pop(error, None)
            self.rest.pop(error, None)
        return failed

    def offsets(self) -> list[int]:
        """The offsets of the first and last delivered record (empty before any report)."""
        delivered = (self.first.get(None), self.rest.get(None))
        return [msg.offset() or 0 for msg in delivered if msg is not None]


@dataclass
class EosStats:
    """The statistics `eos` object of the latest sample: the only place librdkafka shows the
    producer id and epoch."""

    latest: dict[str, Any] = field(default_factory=dict)
    raw: str = ""  # the latest sample itself, for `acknowledged_of`

    def on_stats(self, raw: str) -> None:
        """librdkafka's statistics callback: decodes only the sample's last object."""
        self.latest, self.raw = eos_of(raw), raw


_EOS_KEY = '"eos":'
_DECODER = json.JSONDecoder()


def eos_of(raw: str) -> dict[str, Any]:
    """The `eos` object of a statistics sample ({} when it has none).

    librdkafka writes it last, after every partition of every topic the producer knows: 787 KB
    for a topic of 1,024 partitions, 5.6 ms to parse whole. Found from the end, it is decoded
    alone (microseconds); a sample in another order is parsed whole.
    """
    start = raw.find("{", raw.rfind(_EOS_KEY) + len(_EOS_KEY))
    if start > 0:
        with contextlib.suppress(ValueError):
            eos, _ = _DECODER.raw_decode(raw, start)
            if isinstance(eos, dict) and "txn_state" in eos:
                return eos
    found = json.loads(raw).get("eos", {})
    return found if isinstance(found, dict) else {}


def acknowledged_of(raw: str) -> dict[tuple[str, int], int]:
    """Per topic and partition, the records of the producer's current epoch the broker has
    acknowledged (`next_ack_seq`: the idempotent producer numbers a partition's records from 0
    in each epoch and the broker acknowledges them in order), from a statistics sample."""
    topics = json.loads(raw).get("topics", {}) if raw else {}
    return {
        (topic, int(partition)): int(fields.get("next_ack_seq", 0))
        for topic, stats in topics.items()
        for partition, fields in stats.get("partitions", {}).items()
        if int(partition) >= 0
    }
