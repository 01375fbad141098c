"""The fate probe: whether the brokers committed or aborted a transaction, read from the log.

After an EndTxn(commit) error the driver cannot take the error as proof of an abort (the answer
may have been lost). It reads the transaction's own records back instead: the first and the last
record it wrote to each partition (the only offsets known to be its own: other producers'
records interleave between them). A transaction's records are all committed or all aborted, so
one of them settles it:

- visible to a read_committed consumer: **committed**;
- still in the log (a read_uncommitted consumer returns it) and skipped at read_committed:
  **aborted**;
- neither yet (the last stable offset has not passed it), or no answer within the deadline:
  **open**, ask again later;
- below the partition's log start (retention, deleteRecords) or missing from the log above it
  (compaction): it says nothing. When every record read says nothing, the fate is
  **undetermined**, and asking again will not change that. A missing record is never taken for
  an abort.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from confluent_kafka import Consumer, KafkaError, KafkaException, Message, TopicPartition

from kafka_txn_sink.kafka.admin_api import Fate, FateAnswer
from kafka_txn_sink.kafka.security import librdkafka_config
from kafka_txn_sink.protocol.messages import OffsetRanges

# What one record of the transaction showed: visible at read_committed; in the log but hidden
# at read_committed; not settled yet (or no answer); gone from the log.
Seen = Literal["visible", "hidden", "open", "gone"]
# What one consumer showed: it returned the record; it went past it; it stopped before it.
Polled = Literal["visible", "skipped", "open"]

_POLL_S = 0.2
_REFUSED = (KafkaError.TOPIC_AUTHORIZATION_FAILED, KafkaError._AUTHENTICATION)
_NO_ANSWER = (KafkaError._TIMED_OUT, KafkaError._TRANSPORT)


class ProbeFailed(Exception):
    """The brokers refused or failed a read of `topic` (the caller names the permission)."""

    def __init__(self, topic: str, error: KafkaError):
        super().__init__(error.str())
        self.topic = topic
        self.error = error


@dataclass(frozen=True)
class Reading:
    """What the record at `offset` of `topic`[`partition`] showed."""

    topic: str
    partition: int
    offset: int
    seen: Seen
    log_start: int | None = None  # the partition's log-start offset, if it was read


def probe_fate(config: Mapping[str, Any], offsets: OffsetRanges, timeout_s: float) -> FateAnswer:
    """The fate of the transaction that wrote `offsets`, read within `timeout_s`.

    Raises:
        ProbeFailed: a read was refused or failed other than by a timeout.
    """
    with _Reader(config, time.monotonic() + timeout_s) as reader:
        readings: list[Reading] = []
        for topic, partition, offset in owned_offsets(offsets):
            readings.append(reader.read(topic, partition, offset, wait=False))
            if readings[-1].seen in ("visible", "hidden"):
                return conclude(readings, offsets)
        waiting = next((i for i, r in enumerate(readings) if r.seen == "open"), None)
        if waiting is not None:
            # Nothing settled it yet: watch one open record, as long as the deadline allows.
            was = readings[waiting]
            readings[waiting] = reader.read(was.topic, was.partition, was.offset, wait=True)
        return conclude(readings, offsets)


def owned_offsets(offsets: OffsetRanges) -> list[tuple[str, int, int]]:
    """The first record of each partition, then the last (when it is another one)."""
    ranges = [(t, p, r) for t in sorted(offsets) for p, r in sorted(offsets[t].items())]
    firsts = [(t, p, first) for t, p, (first, _) in ranges]
    lasts = [(t, p, last) for t, p, (first, last) in ranges if last != first]
    return firsts + lasts


def conclude(readings: Sequence[Reading], offsets: OffsetRanges) -> FateAnswer:
    """The fate the readings show: one visible record proves a commit, one hidden record that
    is still in the log an abort; an open one leaves it open; only gone ones, undetermined."""
    for seen, fate in (("visible", Fate.COMMITTED), ("hidden", Fate.ABORTED)):
        found = next((r for r in readings if r.seen == seen), None)
        if found is not None:
            return FateAnswer(fate, f"record {_at(found)} is {seen} at read_committed")
    still = [r for r in readings if r.seen == "open"]
    if still:
        return FateAnswer(Fate.OPEN, f"record {_at(still[0])} is neither visible nor skipped yet")
    gone = "; ".join(_gone(offsets, readings))
    return FateAnswer(Fate.UNDETERMINED, gone or "no offsets of its records were recorded")


def _at(reading: Reading) -> str:
    return f"{reading.topic}[{reading.partition}]@{reading.offset}"


def _gone(offsets: OffsetRanges, readings: Sequence[Reading]) -> Iterator[str]:
    """Per partition, why its records say nothing."""
    for topic in sorted(offsets):
        for partition, (first, last) in sorted(offsets[topic].items()):
            mine = [r for r in readings if (r.topic, r.partition) == (topic, partition)]
            start = max((r.log_start for r in mine if r.log_start is not None), default=None)
            where = f"{topic}[{partition}]@{first}-{last}"
            if start is not None and last < start:
                yield (
                    f"{where}: its first record is gone (log start {start}): retention or "
                    f"deleteRecords removed it"
                )
            else:
                yield (
                    f"{where}: its records at {sorted({r.offset for r in mine})} are gone "
                    f"(log start {start}): compaction, retention or deleteRecords removed them"
                )


class _Reader:
    """Reads single records back, at read_committed and (to tell hidden from gone) at
    read_uncommitted, with one consumer each, all before one deadline."""

    def __init__(self, config: Mapping[str, Any], deadline: float):
        self._config = config
        self._deadline = deadline
        self._consumers: dict[str, Consumer] = {}
        self._log_starts: dict[tuple[str, int], int | None] = {}

    def __enter__(self) -> _Reader:
        return self

    def __exit__(self, *_: object) -> None:
        for consumer in self._consumers.values():
            consumer.close()

    def read(self, topic: str, partition: int, offset: int, wait: bool) -> Reading:
        """What the record at `offset` shows; with `wait`, an open one is watched until the
        deadline instead of reported at once.

        Raises:
            ProbeFailed: the brokers refused or failed a request.
        """
        try:
            return self._read(topic, partition, offset, wait)
        except KafkaException as exc:
            raise ProbeFailed(topic, exc.args[0]) from exc

    def _read(self, topic: str, partition: int, offset: int, wait: bool) -> Reading:
        start = self._log_start(topic, partition)
        if start is None:
            return Reading(topic, partition, offset, "open")
        if offset < start:
            return Reading(topic, partition, offset, "gone", start)
        committed = self._poll(topic, partition, offset, "read_committed", wait)
        if committed != "skipped":
            return Reading(topic, partition, offset, committed, start)
        # Skipped at read_committed: hidden if the record is there, else it is gone.
        there = self._poll(topic, partition, offset, "read_uncommitted", wait=False)
        seen: Seen = "hidden" if there == "visible" else "gone" if there == "skipped" else "open"
        return Reading(topic, partition, offset, seen, start)

    def _log_start(self, topic: str, partition: int) -> int | None:
        """The partition's log-start offset; None without an answer before the deadline."""
        key = (topic, partition)
        if key not in self._log_starts:
            consumer = self._consumer("read_committed")  # the log start is the same for both
            try:
                marks = consumer.get_watermark_offsets(
                    TopicPartition(topic, partition), timeout=self._left()
                )
            except KafkaException as exc:
                if exc.args[0].code() not in _NO_ANSWER:
                    raise
                marks = None
            self._log_starts[key] = marks[0] if marks else None
        return self._log_starts[key]

    def _poll(self, topic: str, partition: int, offset: int, isolation: str, wait: bool) -> Polled:
        """'visible' (returned at this isolation), 'skipped' (the consumer went past it),
        'open' (stopped before it: not stable yet, or no answer before the deadline)."""
        consumer = self._consumer(isolation)
        consumer.assign([TopicPartition(topic, partition, offset)])
        while self._left() > 0:
            message = consumer.poll(min(_POLL_S, self._left()))
            if message is None or (message.topic(), message.partition()) != (topic, partition):
                continue
            seen = _classify(message, offset)
            if seen == "open" and wait:
                continue
            if seen is not None:
                return seen
        return "open"

    def _consumer(self, isolation: str) -> Consumer:
        if isolation not in self._consumers:
            self._consumers[isolation] = Consumer(
                {
                    **librdkafka_config(self._config),
                    "group.id": f"kafka-txn-sink-probe-{uuid.uuid4()}",
                    "isolation.level": isolation,
                    "enable.auto.commit": False,
                    "enable.partition.eof": True,
                    "auto.offset.reset": "earliest",
                }
            )
        return self._consumers[isolation]

    def _left(self) -> float:
        return max(0.0, self._deadline - time.monotonic())


def _classify(message: Message, offset: int) -> Polled | None:
    """What one consumer event says of the record at `offset`; None: nothing yet."""
    error = message.error()
    position = message.offset() or 0
    if error is None:
        if position == offset:
            return "visible"
        return "skipped" if position > offset else None
    if error.code() in _REFUSED:
        raise KafkaException(error)
    if error.code() == KafkaError._PARTITION_EOF:
        # At the end of what this consumer may see: past the offset means it went over it.
        return "skipped" if position > offset else "open"
    return None
