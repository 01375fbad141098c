"""The oracle's check for aborted reads, on decisions shaped like the sink's (no services)."""

from __future__ import annotations

from types import SimpleNamespace

from kafka_txn_sink.testing.topics import Seen
from tests.chaos.oracle import outside_decisions

TOPIC = "out"


def decision(*offsets: dict[int, tuple[int, int]]) -> SimpleNamespace:
    return SimpleNamespace(participants=[SimpleNamespace(offsets={TOPIC: o}) for o in offsets])


def visible(partition: int, *offsets: int) -> list[Seen]:
    return [Seen(b"k", b"v", partition, offset) for offset in offsets]


def test_records_of_participants_that_interleave_are_not_aborted_reads() -> None:
    # Two tasks of one batch wrote to partition 1 at once: their ranges overlap.
    decided = [decision({1: (2585, 2613)}, {1: (2586, 2594)})]

    found = outside_decisions(visible(1, 2585, 2594, 2595, 2613), decided, TOPIC)

    assert found == []


def test_a_visible_record_outside_every_decided_range_is_an_aborted_read() -> None:
    decided = [decision({0: (0, 9)}), decision({0: (12, 20)})]

    found = outside_decisions(visible(0, 9, 10, 12) + visible(2, 0), decided, TOPIC)

    assert found == ["0:10", "2:0"]
