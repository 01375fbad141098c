"""What holds back read_committed consumers: the sink's open transactions and the partitions
whose last stable offset they keep behind the high watermark.

An open transaction keeps the last stable offset (LSO) of every partition it wrote to at its
first record there: a read_committed consumer reads nothing beyond it, whoever wrote what comes
after, until the transaction ends (its EndTxn, or the coordinator's timeout). `status` shows
each such partition with how far it trails and since when, and the open transactions of the
sink with their age against their timeout, and whether a decision holds them.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol

from kafka_txn_sink.kafka.admin_api import TxnState
from kafka_txn_sink.protocol.messages import Decision, GroupOffsets


class Ends(Protocol):
    """The cluster's end offsets (kafka/cluster.py `Cluster.log_ends`)."""

    def log_ends(self, offsets: GroupOffsets, stable: bool = False) -> GroupOffsets:
        """High watermarks, or with `stable` last stable offsets."""
        ...


@dataclass(frozen=True)
class HeldBack:
    """One partition an open transaction of the sink wrote to (or one watched besides: then
    `since_ms` is None and `transactional_ids` empty)."""

    topic: str
    partition: int
    high_watermark: int
    last_stable: int
    since_ms: int | None  # the start of the oldest open transaction of the sink that wrote to it
    transactional_ids: tuple[str, ...]

    @property
    def behind(self) -> int:
        """Offsets a read_committed consumer cannot read yet."""
        return max(0, self.high_watermark - self.last_stable)


def held_back(
    open_: Sequence[TxnState], cluster: Ends, also: Iterable[tuple[str, int]] = ()
) -> list[HeldBack]:
    """Each partition the sink's open transactions wrote to, and each of `also`, with its high
    watermark and last stable offset (`behind` is 0 where nothing holds the partition back; an
    `also` partition may be held back by another producer's transaction)."""
    writers: dict[tuple[str, int], list[TxnState]] = {p: [] for p in also}
    for state in open_:
        for topic_partition in state.partitions:
            writers.setdefault(topic_partition, []).append(state)
    if not writers:
        return []
    wanted: GroupOffsets = {}
    for topic, partition in writers:
        wanted.setdefault(topic, {})[partition] = 0
    high, stable = cluster.log_ends(wanted), cluster.log_ends(wanted, stable=True)
    found = []
    for (topic, partition), states in sorted(writers.items()):
        found.append(
            HeldBack(
                topic=topic,
                partition=partition,
                high_watermark=high.get(topic, {}).get(partition, -1),
                last_stable=stable.get(topic, {}).get(partition, -1),
                since_ms=min((s.start_ms for s in states), default=None),
                transactional_ids=tuple(sorted(s.transactional_id for s in states)),
            )
        )
    return found


def decision_partitions(decision: Decision | None) -> list[tuple[str, int]]:
    """The partitions `decision` wrote to: watched beside those the open transactions hold,
    so a lag that another producer causes shows too."""
    if decision is None:
        return []
    return [(topic, p) for topic, parts in decision.output_ranges().items() for p in parts]
