"""Reading bounded ranges of Kafka topics for the verifier, at `read_committed`.

Each partition is read from a start offset up to an end offset fixed beforehand (the end of
the query's last committed batch, or the topic's end when the verification started), so the
verifier compares two well-defined sets even while producers go on writing. A read_committed
reader never sees an aborted record, and cannot pass an open transaction: a partition that
makes no progress for `stall_timeout_s` is an error that says so.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np
from confluent_kafka import Consumer, KafkaError, KafkaException, Message, TopicPartition

from kafka_txn_sink.errors import ConfigError, KafkaUnavailableError
from kafka_txn_sink.kafka.cluster import client_config
from kafka_txn_sink.kafka.security import librdkafka_config

CHUNK = 20_000  # messages handed over at a time
_POLL_S = 0.5

# topic -> partition -> offset
Offsets = dict[str, dict[int, int]]


class ProgressTask(Protocol):
    """One long read's progress: advanced as it goes, finished at the end."""

    def advance(self, amount: int) -> None:
        """`amount` more units (records, batches, files) are done."""
        ...

    def finish(self) -> None:
        """The read is over."""
        ...


class Progress(Protocol):
    """Where long reads report how far they got (a progress bar, or nothing)."""

    def task(self, description: str, total: int | None) -> ProgressTask:
        """A new task of `total` units (None: unknown)."""
        ...


class _Silent:
    def advance(self, amount: int) -> None:
        pass

    def finish(self) -> None:
        pass


class NoProgress:
    """Progress that shows nothing."""

    def task(self, description: str, total: int | None) -> ProgressTask:
        """A task that reports nowhere."""
        return _Silent()


@dataclass(frozen=True)
class Chunk:
    """Records of one topic as read, with their partitions and offsets as arrays."""

    topic: str
    messages: list[Message]
    partitions: np.ndarray
    offsets: np.ndarray


@dataclass(frozen=True)
class PartitionRange:
    """Offsets [start, end) of one partition."""

    topic: str
    partition: int
    start: int
    end: int

    @property
    def size(self) -> int:
        """How many offsets the range spans (0 if it is empty)."""
        return max(0, self.end - self.start)


@dataclass(frozen=True)
class Watermarks:
    """Per partition: the first offset still stored, and the end a read_committed reader can
    reach now (the last stable offset: below any open transaction)."""

    low: Offsets
    end: Offsets

    def ranges(
        self, topic: str, start: Mapping[int, int], end: Mapping[int, int]
    ) -> list[PartitionRange]:
        """[start, end) per partition of `topic`, never below what the broker still stores."""
        return [
            PartitionRange(topic, p, max(start.get(p, low), low), end.get(p, low))
            for p, low in sorted(self.low[topic].items())
        ]


class KafkaReader:
    """One read_committed consumer that reads ranges and hands records over in chunks."""

    def __init__(
        self,
        bootstrap: str,
        kafka: Mapping[str, str] | None = None,
        timeout_s: float = 30.0,
        stall_timeout_s: float = 60.0,
    ) -> None:
        self.bootstrap = bootstrap
        self.timeout_s = timeout_s
        self.stall_timeout_s = stall_timeout_s
        self._consumer = Consumer(
            {
                # librdkafka logs every refused connection to stderr; the error raised says it.
                "log_level": 2,
                # Bound what librdkafka prefetches: the verifier's memory goes to the ids.
                "queued.max.messages.kbytes": 16384,
                **librdkafka_config(
                    client_config(bootstrap, kafka or {}, max(int(timeout_s * 1000), 10))
                ),
                "group.id": f"kafka-txn-sink-verify-{uuid.uuid4()}",
                "isolation.level": "read_committed",
                "enable.auto.commit": False,
                "enable.partition.eof": True,
                "auto.offset.reset": "earliest",
            }
        )

    def close(self) -> None:
        """Close the consumer."""
        self._consumer.close()

    def __enter__(self) -> KafkaReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def watermarks(self, topics: Iterable[tuple[str, str]]) -> Watermarks:
        """Low and read_committed end offsets of every partition of each (topic, option).

        Raises:
            ConfigError: a topic does not exist (the message names the option that gave it).
            KafkaUnavailableError: the brokers cannot be reached in time.
        """
        low: Offsets = {}
        end: Offsets = {}
        for topic, option in topics:
            if topic in low:
                continue
            low[topic], end[topic] = {}, {}
            for partition in self._partitions(topic, option):
                tp = TopicPartition(topic, partition)
                try:
                    first, last = self._consumer.get_watermark_offsets(
                        tp, timeout=self.timeout_s, cached=False
                    )
                except KafkaException as exc:
                    raise self._unreachable(exc) from exc
                low[topic][partition], end[topic][partition] = first, last
        return Watermarks(low, end)

    def _partitions(self, topic: str, option: str) -> list[int]:
        try:
            metadata = self._consumer.list_topics(topic, timeout=self.timeout_s)
        except KafkaException as exc:
            raise self._unreachable(exc) from exc
        found = metadata.topics.get(topic)
        if found is None or found.error is not None:
            if found is not None and found.error.code() != KafkaError.UNKNOWN_TOPIC_OR_PART:
                raise KafkaUnavailableError(f"cannot describe topic {topic!r}: {found.error.str()}")
            raise ConfigError(f"{option} {topic}: no such topic at {self.bootstrap}")
        return sorted(found.partitions)

    def _unreachable(self, exc: KafkaException) -> KafkaUnavailableError:
        error = exc.args[0] if exc.args else exc
        detail = error.str() if isinstance(error, KafkaError) else str(error)
        return KafkaUnavailableError(f"cannot reach Kafka at {self.bootstrap}: {detail}")

    def read(
        self,
        topic: str,
        ranges: Sequence[PartitionRange],
        on_chunk: Callable[[Chunk], None],
        task: ProgressTask | None = None,
    ) -> None:
        """Hand every visible record of `ranges` (partitions of `topic`) to `on_chunk`, in
        chunks, in offset order per partition.

        Raises:
            KafkaUnavailableError: a partition made no progress for `stall_timeout_s` (an open
                transaction holds read_committed readers back), or reading failed.
        """
        if any(r.topic != topic for r in ranges):
            raise ValueError(f"every range must be of topic {topic}")
        wanted = [r for r in ranges if r.size]
        if not wanted:
            return
        ends = np.full(max(r.partition for r in wanted) + 1, -1, np.int64)
        for r in wanted:
            ends[r.partition] = r.end
        assignment = [TopicPartition(topic, r.partition, r.start) for r in wanted]
        self._consumer.assign(assignment)
        self._consumer.resume(assignment)  # paused when an earlier read finished them
        try:
            self._drain(topic, ends, on_chunk, task or _Silent())
        finally:
            self._consumer.unassign()

    def _drain(
        self,
        topic: str,
        ends: np.ndarray,
        on_chunk: Callable[[Chunk], None],
        progress: ProgressTask,
    ) -> None:
        """`ends[p]`: where partition p's range ends; -1 once it is read (or not read at all)."""
        last_progress = time.monotonic()
        while (ends >= 0).any():
            messages = self._consumer.consume(CHUNK, _POLL_S)
            if messages:
                last_progress = time.monotonic()
            elif time.monotonic() - last_progress > self.stall_timeout_s:
                self._finish_by_position(topic, ends)
                if (ends >= 0).any():
                    raise self._stalled(topic, ends)
                last_progress = time.monotonic()
            records, ended = self._split(topic, messages)
            chunk = self._visible(topic, records, ends)
            if chunk is not None:
                on_chunk(chunk)
                progress.advance(len(chunk.messages))
            # After the records: a partition-EOF event follows the records before it.
            for partition, offset in ended:
                if 0 <= ends[partition] <= offset:  # everything below `offset` has been read
                    self._finish(topic, partition, ends)

    def _split(
        self, topic: str, messages: list[Message]
    ) -> tuple[list[Message], list[tuple[int, int]]]:
        """The records among `messages`, and the (partition, offset) of partition-EOF events."""
        events = [m for m in messages if m.error() is not None]
        ended: list[tuple[int, int]] = []
        for event in events:
            error = event.error()
            if error is None or event.topic() != topic:
                continue
            partition = event.partition() or 0
            if error.code() != KafkaError._PARTITION_EOF:
                raise KafkaUnavailableError(
                    f"reading {topic}[{partition}] from {self.bootstrap} failed: {error.str()}"
                )
            ended.append((partition, event.offset() or 0))
        # Only records of this read: never one a previous assignment had fetched.
        records = [m for m in messages if m.error() is None and m.topic() == topic]
        return records, ended

    def _visible(self, topic: str, records: list[Message], ends: np.ndarray) -> Chunk | None:
        """The records inside their ranges; partitions whose end is reached are finished."""
        if not records:
            return None
        partitions = np.fromiter((m.partition() for m in records), np.int64, len(records))
        offsets = np.fromiter((m.offset() for m in records), np.int64, len(records))
        limit = ends[partitions]
        keep = offsets < limit
        for partition in np.unique(partitions[(offsets >= limit - 1) & (limit >= 0)]).tolist():
            self._finish(topic, partition, ends)
        if not keep.all():
            records = [m for m, k in zip(records, keep.tolist(), strict=True) if k]
            partitions, offsets = partitions[keep], offsets[keep]
        return Chunk(topic, records, partitions, offsets) if records else None

    def _finish(self, topic: str, partition: int, ends: np.ndarray) -> None:
        ends[partition] = -1
        self._consumer.pause([TopicPartition(topic, partition)])

    def _finish_by_position(self, topic: str, ends: np.ndarray) -> None:
        """Ranges whose fetch position passed their end (the rest was aborted or markers)."""
        pending = [TopicPartition(topic, p) for p in np.flatnonzero(ends >= 0).tolist()]
        for tp in self._consumer.position(pending):
            if 0 <= ends[tp.partition] <= tp.offset:
                self._finish(topic, tp.partition, ends)

    def _stalled(self, topic: str, ends: np.ndarray) -> KafkaUnavailableError:
        stuck = ", ".join(
            f"{topic}[{p}] (up to {ends[p]})" for p in np.flatnonzero(ends >= 0).tolist()
        )
        return KafkaUnavailableError(
            f"no progress in {self.stall_timeout_s:g} s reading {stuck} from {self.bootstrap}: "
            "an open transaction holds read_committed readers back, or the brokers stopped "
            "answering; stop the query (or run `kafka-txn-sink recover`) and verify again"
        )


def offsets_json(offsets: Mapping[str, Mapping[int, int]]) -> dict[str, dict[str, int]]:
    """Offsets per topic and partition as JSON spells them: string keys, sorted."""
    return {
        t: {str(p): o for p, o in sorted(parts.items())} for t, parts in sorted(offsets.items())
    }
