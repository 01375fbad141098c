"""The sink's metrics for Prometheus: read from the commit log and the brokers, in a registry of
their own, named and labelled by Prometheus' conventions (`kafka_txn_sink_*`, `sink_id`).

`SinkMetrics.refresh()` reads what is new (metrics/batches.py, and the tasks' errors:
protocol/task_errors.py) and adds it to counters and histograms, and takes a new guard reading
(metrics/guard.py) whose series replace the last one's whole: a transaction that ended leaves
no series behind. A read that fails sets `kafka_txn_sink_log_up` or `kafka_txn_sink_guard_up`
to 0 and changes nothing else, so a value is never a guess; the guard's series are dropped
while it cannot look.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from kafka_txn_sink.errors import KafkaTxnSinkError
from kafka_txn_sink.metrics.batches import LogReader, News
from kafka_txn_sink.metrics.guard import DECIDED, LIVE, STRAY, GuardReading
from kafka_txn_sink.protocol.causes import OTHER
from kafka_txn_sink.protocol.messages import Decision
from kafka_txn_sink.protocol.task_errors import TaskErrorReader
from kafka_txn_sink.storage import Storage

log = logging.getLogger(__name__)

PREFIX = "kafka_txn_sink"
NO_CAUSE = "none"  # an abort record without a cause: commit() raised nothing
_CAUSE = re.compile(r"[A-Z][A-Za-z0-9]{0,79}")
SECONDS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 900.0)


@dataclass(frozen=True)
class _Counters:
    batches: Counter
    rows: Counter
    transactions: Counter
    record_bytes: Counter
    files: Counter
    file_bytes: Counter
    aborted_rounds: Counter
    repairs: Counter
    repaired_rows: Counter
    lost_transactions: Counter
    lost_rows: Counter
    republished: Counter
    dead_lettered: Counter
    failed_attempts: Counter
    task_errors: Counter


def _counters(registry: CollectorRegistry) -> _Counters:
    def counter(name: str, doc: str) -> Counter:
        return Counter(f"{PREFIX}_{name}", doc, ["sink_id"], registry=registry)

    return _Counters(
        batches=counter("batches", "Batches decided"),
        rows=counter("rows", "Rows of the batches decided"),
        transactions=counter("transactions", "Transactions the decisions commit"),
        record_bytes=counter(
            "record_bytes", "Key and value bytes of the decided batches' records, as produced"
        ),
        files=counter("files", "Files the decided batches wrote (files mode)"),
        file_bytes=counter("file_bytes", "Bytes of those files"),
        aborted_rounds=counter(
            "aborted_rounds", "Decision rounds closed by an abort record before a decision"
        ),
        repairs=counter("repairs", "Repair levels recorded (a replay wrote lost rows again)"),
        repaired_rows=counter("repaired_rows", "Rows the repairs wrote again"),
        lost_transactions=counter(
            "lost_transactions", "Decided transactions the brokers aborted before their commit"
        ),
        lost_rows=counter("lost_rows", "Rows of those transactions"),
        republished=counter(
            "republished", "Aborted transactions whose file references were published again"
        ),
        dead_lettered=counter(
            "dead_lettered_rows", "Rows of the decided batches written to the dead-letter topic"
        ),
        failed_attempts=Counter(
            f"{PREFIX}_failed_attempts",
            "Attempts of a batch that ended in an abort record, by the kind of error its "
            "commit raised (none: the tasks failed or Spark stopped the batch first)",
            ["sink_id", "cause"],
            registry=registry,
        ),
        task_errors=Counter(
            f"{PREFIX}_task_errors",
            "Task attempts that failed, by the kind of error they raised (the sink's error "
            "class, else other); a task killed outright leaves none",
            ["sink_id", "kind"],
            registry=registry,
        ),
    )


class SinkMetrics:
    """One sink's metrics, in `registry`, updated by `refresh()` (not thread-safe: one refresher;
    scrapes may run at any time)."""

    def __init__(
        self,
        sink_id: str,
        reader: LogReader,
        guard: Callable[[Decision | None], GuardReading] | None,
        registry: CollectorRegistry | None = None,
        task_errors: Storage | None = None,
    ):
        self.registry = registry if registry is not None else CollectorRegistry()
        self._sink_id = sink_id
        self._reader = reader
        self._guard = guard
        self._task_errors = (
            None if task_errors is None else TaskErrorReader(task_errors, self._history_floor)
        )
        self._counters = _counters(self.registry)
        self._histograms = {
            name: Histogram(
                f"{PREFIX}_{name}", doc, ["sink_id"], buckets=SECONDS, registry=self.registry
            )
            for name, doc in (
                ("completion_seconds", "From a batch's decision to its completion marker"),
                ("decide_seconds", "From a batch's last prepared task to its decision"),
                ("slowest_task_seconds", "A batch's slowest task, from its start to prepared"),
                ("decision_write_seconds", "The write of a batch's decision to the commit log"),
                (
                    "settle_seconds",
                    "From the start of a batch's completion (its EndTxn rounds) "
                    "to its completion marker",
                ),
            )
        }
        self._gauges = {
            name: Gauge(f"{PREFIX}_{name}", doc, ["sink_id"], registry=self.registry)
            for name, doc in (
                ("last_decided_batch", "The newest decided batch"),
                ("last_decided_timestamp_seconds", "When the newest batch was decided"),
                ("incomplete_batches", "Decided batches without a completion marker"),
                (
                    "margin_left_seconds",
                    "The least time a participant of the newest batch had "
                    "left before the brokers' transaction timeout when it was decided",
                ),
                ("log_up", "1 if the last read of the commit log succeeded, else 0"),
                ("guard_up", "1 if the last look at the brokers succeeded, else 0"),
            )
        }
        # Every series but those with more labels exists from the start, at 0: a counter that
        # appears only at its first increase would hide that increase from rate().
        for metric in (*vars(self._counters).values(), *self._histograms.values()):
            if metric not in (self._counters.failed_attempts, self._counters.task_errors):
                metric.labels(sink_id)
        self._reading: GuardReading | None = None
        self._up: dict[str, bool] = {}  # log_up and guard_up of the last refresh
        self.registry.register(_GuardCollector(sink_id, lambda: self._reading))

    def refresh(self) -> None:
        """Read the log's news and take a new guard reading; a failed read says so (`*_up`)."""
        # Any error, not only the sink's own: an exporter that stopped would show nothing at
        # all, while one that says `*_up 0` shows where to look.
        try:
            self._count(self._reader.read())
            if self._task_errors is not None:
                for error in self._task_errors.read():
                    self._counters.task_errors.labels(self._sink_id, cause_label(error.kind)).inc()
            self._gauge("log_up", 1)
        except Exception as exc:
            log.warning("the commit log could not be read: %s", _described(exc))
            self._gauge("log_up", 0)
        if self._guard is None:
            return
        try:
            self._reading = self._guard(self._reader.latest)
            self._gauge("guard_up", 1)
        except Exception as exc:
            log.warning(
                "the brokers could not be asked about the sink's transactions: %s", _described(exc)
            )
            self._reading = None
            self._gauge("guard_up", 0)

    def _history_floor(self) -> int | None:
        """The batch above which the first read counts task errors (the log's `history`)."""
        history, latest = self._reader.history, self._reader.latest
        if history <= 0:
            return None
        return -1 if latest is None else latest.batch_id - history

    def all_up(self) -> bool:
        """Whether the last refresh read the log and (with a guard) the brokers."""
        return all(self._up.values())

    def _count(self, news: News) -> None:
        c, sink = self._counters, self._sink_id
        for decided in news.decided:
            decision = decided.decision
            c.batches.labels(sink).inc()
            c.rows.labels(sink).inc(decision.rows)
            c.transactions.labels(sink).inc(decided.transactions)
            c.files.labels(sink).inc(decided.files)
            c.file_bytes.labels(sink).inc(decided.file_bytes)
            c.aborted_rounds.labels(sink).inc(decision.round)
            c.dead_lettered.labels(sink).inc(decided.dead_lettered)
            if decision.stats is not None:
                c.record_bytes.labels(sink).inc(decision.stats.bytes)
                self._observe("decide_seconds", decision.stats.decide_ms / 1000)
                self._observe("slowest_task_seconds", decision.stats.slowest_task_ms / 1000)
        if news.latest is not None:
            self._newest(news.latest)
        for completed in news.completed:
            self._observe("completion_seconds", completed.seconds)
            stats = completed.completion.stats
            if stats is not None:
                self._observe("settle_seconds", stats.settle_ms / 1000)
                if stats.decision_write_ms is not None:
                    self._observe("decision_write_seconds", stats.decision_write_ms / 1000)
            c.lost_transactions.labels(sink).inc(len(completed.completion.lost))
            c.lost_rows.labels(sink).inc(completed.lost_rows)
            c.republished.labels(sink).inc(len(completed.completion.republished))
        for abort in news.aborted:
            c.failed_attempts.labels(sink, cause_label(abort.cause)).inc()
        for repaired in news.repaired:
            c.repairs.labels(sink).inc(repaired.levels)
            c.repaired_rows.labels(sink).inc(repaired.rows)
        self._gauge("incomplete_batches", len(self._reader.incomplete))

    def _newest(self, decision: Decision) -> None:
        """The gauges of the newest decision (its margin: the newest that recorded one)."""
        self._gauge("last_decided_batch", decision.batch_id)
        self._gauge("last_decided_timestamp_seconds", decision.decided_at_ms / 1000)
        if decision.stats is not None and decision.stats.margin_left_ms is not None:
            self._gauge("margin_left_seconds", decision.stats.margin_left_ms / 1000)

    def _observe(self, name: str, seconds: float) -> None:
        self._histograms[name].labels(self._sink_id).observe(seconds)

    def _gauge(self, name: str, value: float) -> None:
        self._gauges[name].labels(self._sink_id).set(value)
        if name in ("log_up", "guard_up"):
            self._up[name] = value == 1


class _GuardCollector(Collector):
    """The guard's series, from the newest reading only."""

    def __init__(self, sink_id: str, reading: Callable[[], GuardReading | None]):
        self._sink_id = sink_id
        self._reading = reading

    def collect(self) -> Iterator[Metric]:
        reading = self._reading()
        if reading is None:
            return
        sink = self._sink_id
        open_ = GaugeMetricFamily(
            f"{PREFIX}_open_transactions",
            "The sink's open transactions: decided (completing), live (a run may still decide "
            "them) or stray (no run can; recover aborts them)",
            labels=["sink_id", "state"],
        )
        for kind in (DECIDED, LIVE, STRAY):
            open_.add_metric([sink, kind], reading.count(kind))
        yield open_
        oldest = reading.oldest
        if oldest is not None:
            yield _single(
                "oldest_open_transaction_age_seconds",
                "Age of the sink's oldest open transaction",
                sink,
                oldest.age_ms / 1000,
            )
            yield _single(
                "oldest_open_transaction_timeout_left_seconds",
                "Time the sink's oldest open transaction has left before the brokers abort it",
                sink,
                oldest.left_ms / 1000,
            )
        behind = GaugeMetricFamily(
            f"{PREFIX}_partition_lso_lag",
            "Offsets of an output partition a read_committed consumer cannot read yet (high "
            "watermark minus last stable offset)",
            labels=["sink_id", "topic", "partition"],
        )
        held = GaugeMetricFamily(
            f"{PREFIX}_partition_held_seconds",
            "How long an open transaction of the sink has held the partition's last stable offset",
            labels=["sink_id", "topic", "partition"],
        )
        for partition in reading.partitions:
            labels = [sink, partition.topic, str(partition.partition)]
            behind.add_metric(labels, partition.behind)
            if partition.since_ms is not None:
                held.add_metric(labels, max(0, reading.at_ms - partition.since_ms) / 1000)
        yield behind
        yield held


def cause_label(cause: str | None) -> str:
    """An abort record's cause as a label value: `none` without one, `other` for one that is
    not an error class's name (labels stay few and plain)."""
    if cause is None:
        return NO_CAUSE
    return cause if _CAUSE.fullmatch(cause) else OTHER


def _described(exc: Exception) -> str:
    """The sink's own errors by their message (which names what to do); others by their class
    alone, as their text may carry a setting's value."""
    return str(exc) if isinstance(exc, KafkaTxnSinkError) else f"{type(exc).__name__} (unexpected)"


def _single(name: str, doc: str, sink_id: str, value: float) -> GaugeMetricFamily:
    family = GaugeMetricFamily(f"{PREFIX}_{name}", doc, labels=["sink_id"])
    family.add_metric([sink_id], value)
    return family
