"""A task's transactional producer: opens, fills and prepares one transaction, never commits it.

confluent-kafka 2.16's `close()` (and `with Producer(...)`) aborts the open transaction, so a
prepared producer is only dropped: deallocation destroys the client without sending EndTxn,
and the transaction stays Ongoing on the coordinator until the driver completes it.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import random
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property, partial
from operator import length_hint
from typing import Any, cast

import pyarrow as pa
import pyarrow.compute as pc
from confluent_kafka import KafkaError, KafkaException, Producer

from kafka_txn_sink.errors import InputError, KafkaTxnSinkError, KafkaUnavailableError
from kafka_txn_sink.kafka.deliveries import (
    PURGED,
    Deliveries,
    EosStats,
    PartitionReports,
    acknowledged_of,
)
from kafka_txn_sink.kafka.partitioner import by_partition, key_partitions
from kafka_txn_sink.kafka.permissions import refused, topic_permission
from kafka_txn_sink.kafka.produce_errors import kafka_failure, produce_failure
from kafka_txn_sink.kafka.producer_settings import (
    KEY_HASH_PARTITIONER,
    STATS_INTERVAL_MS,
)
from kafka_txn_sink.kafka.quiet import QuietProduce, quiet_produce
from kafka_txn_sink.kafka.security import librdkafka_config
from kafka_txn_sink.protocol.messages import OffsetRanges, Triple

# Delivery reports are served (and their errors checked) every this many records; each one
# holds its message's memory until served.
POLL_EVERY = 1000
# A task's first this many records each get a delivery report. After them, `send_many` reports
# only each call's last record of a partition (and the partition's first, which came before)
# and proves the others delivered by the partition's acknowledged count in a sample after the flush
# (deliveries.acknowledged_of): that sample costs a wait of up to STATS_INTERVAL_MS (12.5 ms on
# average), which the records sent without a report repay in a task this long: each costs about
# 1 us of CPU less (its report, and produce() from C where kafka/quiet.py can: measured with
# benchmarks/records_send.py). The environment variable sets it for a test (the crash suite: 10).
REPORTED_RECORDS = int(os.environ.get("KAFKA_TXN_SINK_REPORTED_RECORDS") or 15_000)
# librdkafka's RD_KAFKA_PARTITION_UA: the partitioner picks the partition.
UNASSIGNED = -1
# The reason of an InputError a delivery report gave: after produce(), so never a row's alone.
DELIVERY = "delivery"


@dataclass(frozen=True)
class Prepared:
    """A flushed, still open transaction: its triple, rows, offsets, when it was prepared and
    the bytes its producer sent."""

    triple: Triple
    rows: int
    offsets: OffsetRanges
    prepared_at_ms: int
    bytes: int = 0  # the records' key and value bytes, as produced (uncompressed, unframed)


class TaskTransaction:
    """One transaction of one task attempt: init, begin, send..., prepare (or abort)."""

    def __init__(self, config: Mapping[str, Any], timeout_s: float):
        self._timeout_s = timeout_s
        self._deliveries = Deliveries()
        self._stats = EosStats()
        self._txn_id = str(config["transactional.id"])
        self._config = config
        self._producer: Producer | None = Producer(
            {
                **librdkafka_config(config),
                "stats_cb": self._stats.on_stats,
            }
        )
        self._sent = 0
        self._bytes = 0
        self._partition_reports: dict[tuple[str, int], PartitionReports] = {}
        self._partition_counts: dict[str, int] = {}

    @property
    def transactional_id(self) -> str:
        """The transactional id of this producer."""
        return self._txn_id

    def init(self) -> None:
        """Fence every earlier producer of this id (aborting its open transaction), then begin."""
        try:
            self._client.init_transactions(self._timeout_s)
            self._client.begin_transaction()
            self._stats.latest = {}  # only a sample taken inside this transaction names it
        except KafkaException as exc:
            what = f"init_transactions for {self._txn_id}"
            raise kafka_failure(what, exc, self._config) from exc

    def send(
        self,
        topic: str,
        value: bytes | None,
        key: bytes | None = None,
        partition: int | None = None,
        headers: list[tuple[str, bytes | None]] | None = None,
        timestamp_ms: int | None = None,
    ) -> None:
        """Produce one record into the transaction (with `timestamp_ms`, the record's
        timestamp; else the producer's clock).

        Raises:
            InputError: the record is refused (too large, unknown topic or partition).
            KafkaTxnSinkError: the producer failed (fenced, or a delivery error).
        """
        extra: dict[str, Any] = {"on_delivery": self._deliveries.on_delivery}
        if partition is not None:
            extra["partition"] = partition
        if headers:
            extra["headers"] = headers
        if timestamp_ms is not None:
            extra["timestamp"] = timestamp_ms
        produce = self._client.produce
        try:
            try:
                produce(topic, value, key, **extra)
            except BufferError:
                self._produce_when_room(partial(produce, topic, value, key, **extra))
        except KafkaException as exc:
            raise produce_failure(topic, value, key, exc, self._config) from exc
        except SystemError as exc:
            raise self._fatal(exc) from exc
        self._sent += 1
        self._bytes += len(value or b"") + len(key or b"")
        if self._sent % POLL_EVERY == 0:
            self._serve_deliveries()

    def send_many(
        self, topic: str, values: Sequence[bytes | None], keys: Sequence[bytes | None] | None
    ) -> None:
        """Produce `values[i]` with `keys[i]` to `topic`, for every i: the columnar fast path.

        The partitions are computed for the whole batch (kafka/partitioner.py: the ones
        librdkafka picks for keys; one random partition per call for null keys, as a sticky
        partitioner does), then each partition's records are produced with an explicit
        partition and a delivery callback in C (`PartitionReports`; past REPORTED_RECORDS,
        none but on each call's last record of a partition): no Python call per record but
        produce(), itself called from C. The same checks as `send`.

        Raises:
            ValueError: `keys` is not as long as `values`.
        """
        if not values:
            return
        if keys is not None and len(keys) != len(values):
            raise ValueError(f"{len(values)} values but {len(keys)} keys")
        self._bytes += _size(values) + (_size(keys) if keys is not None else 0)
        if self._config.get("partitioner") != KEY_HASH_PARTITIONER:
            # librdkafka partitions, as set (UA: unassigned), and reports each record
            self._produce_all(topic, values, keys, UNASSIGNED, self._deliveries.on_delivery)
            return
        partitions = self._partitions_of(topic, keys, len(values))
        for partition, values_of, keys_of in by_partition(partitions, values, keys):
            self._send_to_partition(topic, partition, values_of, keys_of)

    def _send_to_partition(
        self,
        topic: str,
        partition: int,
        values: Sequence[bytes | None],
        keys: Sequence[bytes | None] | None,
    ) -> None:
        """Produce records to one partition, reported to its `PartitionReports` (after the
        task's first REPORTED_RECORDS, only the call's last record reports; the others are
        counted as `unreported`)."""
        reports = self._partition_reports.setdefault((topic, partition), PartitionReports())
        if not reports.sent:  # the partition's first record reports on its own
            first_key = keys[:1] if keys is not None else None
            self._produce_all(topic, values[:1], first_key, partition, reports.callback())
            reports.sent = 1
            values, keys = values[1:], keys[1:] if keys is not None else None
        if self._sent >= REPORTED_RECORDS and len(values) > 1:
            quiet = len(values) - 1
            quiet_keys = keys[:quiet] if keys is not None else None
            self._produce_all(topic, values[:quiet], quiet_keys, partition)
            reports.sent += quiet
            reports.unreported += quiet
            values, keys = values[quiet:], keys[quiet:] if keys is not None else None
        self._produce_all(topic, values, keys, partition, reports.callback())
        reports.sent += len(values)

    def _partitions_of(
        self, topic: str, keys: Sequence[bytes | None] | None, records: int
    ) -> pa.Int64Array:
        """Each record's partition: the key's hash, or one random partition for null keys."""
        count = self.partition_count(topic)
        sticky = pa.scalar(random.randrange(count), pa.int64())
        if keys is None:
            return pa.repeat(sticky, records)
        try:  # cheaper than looking for null keys first: they are rare, and refused at once
            return key_partitions(cast("Sequence[bytes]", keys), count)
        except TypeError:
            pass
        keyed = [key for key in keys if key is not None]
        has_key = pa.array([key is not None for key in keys], pa.bool_())
        hashed = key_partitions(keyed, count)
        partitions: pa.Int64Array = pc.replace_with_mask(
            pa.repeat(sticky, records), has_key, hashed
        )
        return partitions

    def partition_count(self, topic: str) -> int:
        """How many partitions `topic` has (asked once per transaction and topic).

        Raises:
            InputError: the topic does not exist.
        """
        count = self._partition_counts.get(topic)
        if count is not None:
            return count
        try:
            metadata = self._client.list_topics(topic, self._timeout_s).topics[topic]
        except KafkaException as exc:
            raise kafka_failure(f"reading the metadata of {topic}", exc, self._config) from exc
        if metadata.error is not None:
            failure = KafkaException(metadata.error)
            raise produce_failure(topic, None, None, failure, self._config) from failure
        count = self._partition_counts[topic] = len(metadata.partitions)
        return count

    def _produce_all(
        self,
        topic: str,
        values: Sequence[bytes | None],
        keys: Sequence[bytes | None] | None,
        *where: Any,
    ) -> None:
        """produce(topic, value, key, *where) for every record: `where` is (partition, delivery
        callback), or (partition) alone for records that report nothing. Reports are served
        after every POLL_EVERY records of one call (fewer: at the next call that has as many,
        when the queue is full, or in the flush)."""
        for start in range(0, len(values), POLL_EVERY):
            end = min(start + POLL_EVERY, len(values))
            if self._quiet is not None and len(where) == 1:
                self._produce_quietly(topic, values, keys, where[0], start, end)
            else:
                self._produce_range(topic, values, keys, where, start, end)
            if end - start == POLL_EVERY:
                self._serve_deliveries()

    def _produce_range(
        self,
        topic: str,
        values: Sequence[bytes | None],
        keys: Sequence[bytes | None] | None,
        where: tuple[Any, ...],
        start: int,
        end: int,
    ) -> None:
        """Records `start` to `end` through a `map` that calls produce() from C: no Python
        bytecode a record. On a failed call the record is found by what the map had taken."""
        produce = self._client.produce
        while start < end:
            taken = iter(values[start:end])
            key_of = iter(keys[start:end]) if keys is not None else itertools.repeat(None)
            calls = map(
                produce, itertools.repeat(topic), taken, key_of, *map(itertools.repeat, where)
            )
            try:
                deque(calls, maxlen=0)
                self._sent += end - start
                return
            except (BufferError, KafkaException, SystemError) as exc:
                failed = end - length_hint(taken) - 1  # its value was the last one taken
                self._sent += failed - start
                value, key = values[failed], keys[failed] if keys is not None else None
                if not isinstance(exc, BufferError):
                    raise self._produce_error(topic, value, key, exc) from exc
                try:
                    self._produce_when_room(partial(produce, topic, value, key, *where))
                except (KafkaException, SystemError) as again:
                    raise self._produce_error(topic, value, key, again) from again
                self._sent += 1
                start = failed + 1

    @cached_property
    def _quiet(self) -> QuietProduce | None:
        """The C loop bound to this producer (None: records without reports go through
        produce()); bound at the first such record, so a short task never looks for it."""
        return quiet_produce(self._client)

    def _produce_quietly(
        self,
        topic: str,
        values: Sequence[bytes | None],
        keys: Sequence[bytes | None] | None,
        partition: int,
        start: int,
        end: int,
    ) -> None:
        """Records `start` to `end` with no report, through the extension (kafka/quiet.py). A
        record it does not take (refused by librdkafka, a full queue, not bytes) goes through
        produce(), which waits for room or raises the error that names it."""
        assert self._quiet is not None
        while start < end:
            stopped, _ = self._quiet(topic, partition, values, keys, start, end)
            self._sent += stopped - start
            if stopped < end:
                self._produce_range(topic, values, keys, (partition,), stopped, stopped + 1)
            start = stopped + 1

    def _produce_error(
        self, topic: str, value: bytes | None, key: bytes | None, exc: Exception
    ) -> KafkaTxnSinkError:
        """The error of a refused produce() call of this record."""
        if isinstance(exc, SystemError):
            return self._fatal(exc)
        return produce_failure(topic, value, key, cast(KafkaException, exc), self._config)

    def _produce_when_room(self, produce_one: Callable[[], None]) -> None:
        """The producer queue is full: serve delivery reports until `produce_one` is accepted."""
        deadline = time.monotonic() + self._timeout_s
        while True:
            self._client.poll(0.05)
            self._raise_delivery_error()
            try:
                produce_one()
                return
            except BufferError:
                if time.monotonic() > deadline:
                    raise KafkaUnavailableError(
                        f"the producer queue of {self._txn_id} stayed full for "
                        f"{self._timeout_s:.0f}s; is the broker reachable?"
                    ) from None

    def _serve_deliveries(self) -> None:
        self._client.poll(0)
        self._raise_delivery_error()

    def prepare(self) -> Prepared | None:
        """Flush and read the triple. None when nothing was sent (the transaction is aborted).

        Raises:
            InputError / KafkaTxnSinkError: a record was refused; the transaction is aborted.
        """
        if self._sent == 0:
            self.abort()
            return None
        try:
            remaining = self._client.flush(self._timeout_s)
        except (SystemError, KafkaException) as exc:
            # confluent-kafka before 2.16 raises a fatal state (e.g. fenced) from flush itself.
            raise self._fatal(exc) from exc
        self._raise_delivery_error()
        if remaining:
            raise KafkaUnavailableError(
                f"{remaining} records of {self._txn_id} were not delivered within "
                f"{self._timeout_s:.0f}s"
            )
        self._check_every_record_reported()
        if any(reports.unreported for reports in self._partition_reports.values()):
            triple = self._check_acknowledged()
        else:
            triple = self._read_triple()
        return Prepared(
            triple=triple,
            rows=self._sent,
            offsets=self._deliveries.offsets(),
            prepared_at_ms=int(time.time() * 1000),
            bytes=self._bytes,
        )

    def _check_every_record_reported(self) -> None:
        """After a flush without errors: each partition of `send_many` has its first and last
        report (their offsets recorded), and every record sent alone has its own."""
        bulk = sum(reports.sent for reports in self._partition_reports.values())
        for (topic, partition), reports in self._partition_reports.items():
            offsets = reports.offsets()
            if not offsets:
                raise KafkaTxnSinkError(
                    f"{self._txn_id}: no delivery report of the first record to {topic} "
                    f"[{partition}]"
                )
            for offset in offsets:
                self._deliveries.record(topic, partition, offset)
        if self._deliveries.delivered != self._sent - bulk:
            raise KafkaTxnSinkError(
                f"{self._txn_id}: {self._sent - bulk} records sent one by one, "
                f"{self._deliveries.delivered} delivery reports"
            )

    def _check_acknowledged(self) -> Triple:
        """Prove the records sent without a report delivered: a statistics sample served after
        the flush counts, for each partition, the records the broker acknowledged; the task
        sent exactly that many there, and the transaction is still open in the producer's
        first epoch. That sample names the triple.

        librdkafka builds a sample partition by partition and queues it when done, so the
        first one served after the flush may have read a partition before its last
        acknowledgement: a count short of the records sent is checked again in the next
        sample, built wholly after the flush. A count is never ahead of the broker.

        Raises:
            KafkaTxnSinkError: a partition acknowledged fewer records than were sent to it (a
                record was refused or timed out), no sample came, or the transaction failed.
        """
        short = None
        for _ in range(2):
            short = self._short_partition(self._sample_after_flush())
            if short is None:
                return self._read_triple()
        self.abort()
        raise KafkaTxnSinkError(
            f"{self._txn_id}: {short}; a record was refused (too large for the topic's "
            f"max.message.bytes?) or timed out; nothing of this batch is published"
        )

    def _sample_after_flush(self) -> str:
        """The next statistics sample served ("" if none came in the bounded wait)."""
        self._stats.latest, self._stats.raw = {}, ""
        self._wait_for_sample(lambda: bool(self._stats.raw))
        return self._stats.raw

    def _wait_for_sample(self, done: Callable[[], bool]) -> bool:
        """Serve statistics samples until `done()` or the bounded wait for them ends."""
        deadline = time.monotonic() + max(5.0, 20 * STATS_INTERVAL_MS / 1000)
        while not done():
            if time.monotonic() >= deadline:
                return False
            self._client.poll(STATS_INTERVAL_MS / 1000)
        return True

    def _short_partition(self, sample: str) -> str | None:
        """What `sample` shows short of the records sent: a partition's count, or no sample."""
        if not sample:
            return "no statistics sample came to count the records the broker acknowledged"
        acknowledged = acknowledged_of(sample)
        for (topic, partition), reports in self._partition_reports.items():
            sent = reports.sent + self._deliveries.delivered_to.get((topic, partition), 0)
            acked = acknowledged.get((topic, partition), 0)
            if acked != sent:
                where = f"{topic} [{partition}]"
                return f"the broker acknowledged {acked} of the {sent} records sent to {where}"
        return None

    def abort(self) -> None:
        """Abort the open transaction, best effort (never raises)."""
        if self._producer is None:
            return
        # On failure the coordinator aborts it on timeout, or the next attempt's init fences it.
        with contextlib.suppress(KafkaException, SystemError):
            self._producer.abort_transaction(self._timeout_s)

    def detach(self) -> None:
        """Drop the client without closing it, so a prepared transaction stays open."""
        self._producer = None

    def _fatal(self, exc: Exception) -> KafkaTxnSinkError:
        # confluent-kafka 2.16 can run delivery callbacks while the error of a fatal state
        # (e.g. fenced) is pending; the callback's first call then fails as a SystemError.
        self.abort()
        return KafkaTxnSinkError(
            f"the producer of {self._txn_id} hit a fatal error (fenced by a later attempt?): "
            f"{exc}; nothing of this batch is published"
        )

    @property
    def _client(self) -> Producer:
        if self._producer is None:
            raise KafkaTxnSinkError(f"the producer of {self._txn_id} was already detached")
        return self._producer

    def _take_partition_errors(self) -> None:
        """Hand the failures `send_many`'s reports hold to the one place that picks the cause."""
        for reports in self._partition_reports.values():
            for error, msg in reports.take_errors():
                self._deliveries.on_delivery(error, msg)

    def _raise_delivery_error(self) -> None:
        self._take_partition_errors()
        if self._deliveries.error is None:
            return
        if self._deliveries.purged_only:  # collect the report of the cause first (bounded)
            with contextlib.suppress(KafkaException, SystemError):
                self._client.flush(self._timeout_s)
            self._take_partition_errors()
        error = self._deliveries.error
        assert error is not None
        self.abort()
        if error.code() == KafkaError.MSG_SIZE_TOO_LARGE:
            # Reported after produce(): the transaction is aborted, so no row may be set aside.
            raise InputError(
                f"a record for topic {self._deliveries.error_topic} is larger than the "
                f"broker accepts (message.max.bytes / max.message.bytes): check the value "
                f"and key columns; nothing of this batch is published",
                reason=DELIVERY,
            )
        topic = self._deliveries.error_topic
        step = f"producing to {topic} in {self._txn_id} (nothing of this batch is published)"
        denial = refused(
            error.code(),
            error.str(),
            self._config,
            step,
            topic_permission("Write", str(topic)),
            self._txn_id,
        )
        if denial is not None:
            raise denial
        cause = (
            " (the transaction failed before these records were sent: an earlier record was "
            "refused, e.g. one larger than the topic's max.message.bytes, or Write on the topic "
            "is missing (TOPIC_AUTHORIZATION_FAILED); the producer's log names why)"
            if error.code() in PURGED
            else ""
        )
        raise KafkaTxnSinkError(
            f"delivery to {topic} failed in {self._txn_id}: "
            f"{error.str()}{cause}; nothing of this batch is published"
        )

    def _read_triple(self) -> Triple:
        """The producer id and epoch of the open transaction, from a statistics sample taken
        inside it: the one already seen if any, else the next (bounded wait).

        A sample from any time after begin_transaction names the ids the records carry: the
        producer takes a new epoch only in abort_transaction or init_transactions, and what
        makes it need one fails a record first, which `prepare` has already refused (from its
        report, or from its partition's acknowledged count)."""

        def open_in_first_epoch() -> bool:
            eos = self._stats.latest
            return eos.get("txn_state") == "InTransaction" and eos.get("epoch_cnt") == 1

        if not self._wait_for_sample(open_in_first_epoch):
            raise KafkaTxnSinkError(
                f"{self._txn_id}: the producer never reported an open transaction with one "
                f"producer id (last eos statistics: {self._stats.latest})"
            )
        eos = self._stats.latest
        return Triple(self._txn_id, int(eos["producer_id"]), int(eos["producer_epoch"]))


def _size(items: Sequence[bytes | None]) -> int:
    """The bytes of `items`, None counting 0 (the common case without None stays in C)."""
    try:
        return sum(map(len, items))  # type: ignore[arg-type]
    except TypeError:
        return sum(map(len, filter(None, items)))
