"""What a batch cost, recorded with its decision and its completion: the numbers the sink's
metrics are made of.

The driver's code runs in short-lived Python workers, so nothing it measures would outlive the
batch in memory; the commit log keeps it instead, in both formats, and `kafka-txn-sink metrics`
reads it from there. A statistic never decides anything: it is left out of the comparison of
a decision written twice (`Decision.same_decision`), and a record without it reads as before.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any, TypeVar

S = TypeVar("S")


@dataclass(frozen=True)
class TaskCost:
    """One prepared task's part: when it started, when its transaction was prepared, and the
    key and value bytes of the records it produced (uncompressed, without framing)."""

    started_at_ms: int
    prepared_at_ms: int
    bytes: int


@dataclass(frozen=True)
class BatchStats:
    """A batch's cost, as its decision records it.

    `bytes`: the key and value bytes of the batch's records, as the tasks produced them;
    `slowest_task_ms`: the longest time a task took from its start to its prepared transaction;
    `decide_ms`: from the last task's prepared transaction to the decision (Spark's hand-over,
    the progress transaction, the check); `margin_left_ms`: the least time any participant had
    left before the brokers' transaction timeout when the check read it (None without
    participants).
    """

    bytes: int
    slowest_task_ms: int
    decide_ms: int
    margin_left_ms: int | None

    def to_json(self) -> dict[str, Any]:
        """The statistics as the decision's `stats` object."""
        return asdict(self)

    @classmethod
    def from_json(cls, body: Mapping[str, Any]) -> BatchStats:
        """The statistics of a decision's `stats` object."""
        margin = body.get("margin_left_ms")
        return cls(
            bytes=int(body["bytes"]),
            slowest_task_ms=int(body["slowest_task_ms"]),
            decide_ms=int(body["decide_ms"]),
            margin_left_ms=int(margin) if margin is not None else None,
        )


@dataclass(frozen=True)
class CompletionStats:
    """What a batch's completion cost, as its completion marker records it.

    `decision_write_ms`: the decision's put-if-absent write (None when the run that completes
    the batch did not write its decision: a restart rolled it forward); `settle_ms`: from the
    start of the completion to the marker (the EndTxn rounds, a republish, the progress).
    """

    decision_write_ms: int | None
    settle_ms: int

    def to_json(self) -> dict[str, Any]:
        """The statistics as the completion's `stats` object."""
        return asdict(self)

    @classmethod
    def from_json(cls, body: Mapping[str, Any]) -> CompletionStats:
        """The statistics of a completion's `stats` object."""
        written = body.get("decision_write_ms")
        return cls(
            decision_write_ms=int(written) if written is not None else None,
            settle_ms=int(body["settle_ms"]),
        )


def batch_stats(
    tasks: Sequence[TaskCost], decided_at_ms: int, margin_left_ms: int | None
) -> BatchStats:
    """The statistics of a batch whose prepared tasks cost `tasks`, decided at `decided_at_ms`
    (a task whose start is unknown, 0, counts for its bytes only)."""
    last_prepared = max((t.prepared_at_ms for t in tasks), default=decided_at_ms)
    timed = [t.prepared_at_ms - t.started_at_ms for t in tasks if t.started_at_ms > 0]
    return BatchStats(
        bytes=sum(t.bytes for t in tasks),
        slowest_task_ms=max(timed, default=0),
        decide_ms=max(0, decided_at_ms - last_prepared),
        margin_left_ms=margin_left_ms,
    )


def read_stats(parse: Callable[[Mapping[str, Any]], S], body: Any) -> S | None:
    """A record's statistics, or None when it has none or none this version can read: they
    decide nothing, so they never make their record unreadable."""
    if not isinstance(body, Mapping):
        return None
    try:
        return parse(body)
    except (KeyError, TypeError, ValueError):
        return None


def ms_since(started: float) -> int:
    """Whole milliseconds since `started`, a `time.monotonic()` reading."""
    return int((time.monotonic() - started) * 1000)
