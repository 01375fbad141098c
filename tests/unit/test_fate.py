"""The fate probe's conclusion from what single records showed (kafka/fate.py).

What each record shows is read from a real broker in tests/integration/test_fate_probe.py;
here the rule that turns readings into a fate is pinned down, case by case.
"""

from __future__ import annotations

from kafka_txn_sink.kafka.admin_api import Fate
from kafka_txn_sink.kafka.fate import Reading, Seen, conclude, owned_offsets
from kafka_txn_sink.protocol.messages import OffsetRanges

OFFSETS: OffsetRanges = {"out": {0: (10, 19), 1: (5, 5)}}


def read(partition: int, offset: int, seen: Seen, log_start: int | None = 0) -> Reading:
    return Reading("out", partition, offset, seen, log_start)


def test_the_first_and_last_record_of_each_partition_are_read_firsts_first() -> None:
    assert owned_offsets(OFFSETS) == [("out", 0, 10), ("out", 1, 5), ("out", 0, 19)]


def test_one_visible_record_proves_a_commit_whatever_else_is_gone() -> None:
    readings = [read(0, 10, "gone", 15), read(1, 5, "gone", 8), read(0, 19, "visible", 15)]

    assert conclude(readings, OFFSETS).fate is Fate.COMMITTED


def test_one_hidden_record_still_in_the_log_proves_an_abort() -> None:
    answer = conclude([read(0, 10, "gone", 11), read(1, 5, "hidden")], OFFSETS)

    assert answer.fate is Fate.ABORTED
    assert "out[1]@5" in answer.evidence


def test_an_open_record_leaves_the_fate_open_not_undetermined() -> None:
    readings = [read(0, 10, "gone", 20), read(1, 5, "open"), read(0, 19, "gone", 20)]

    assert conclude(readings, OFFSETS).fate is Fate.OPEN


def test_records_all_gone_are_undetermined_and_say_where_and_why() -> None:
    readings = [read(0, 10, "gone", 20), read(1, 5, "gone", 3), read(0, 19, "gone", 20)]

    answer = conclude(readings, OFFSETS)

    assert answer.fate is Fate.UNDETERMINED
    assert "out[0]@10-19: its first record is gone (log start 20): retention or deleteRecords" in (
        answer.evidence
    )
    assert "out[1]@5-5: its records at [5] are gone (log start 3): compaction" in answer.evidence
