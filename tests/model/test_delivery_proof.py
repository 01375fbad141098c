"""The proof-of-delivery model (model/txn_model/delivery.py, issue 43 item 1): which designs
let a commit miss a record, with the shortest traces found, and what the fate probe keeps."""

from __future__ import annotations

import pytest

from model.txn_model.delivery import Bounds, search, shortest_counterexample

# A report on each partition's first and last record only: a record in between fails unseen.
D1_TRACE = (
    "produce r1 to p0 (no metadata yet)",
    "the topic's metadata arrives",
    "send r1: written at p0@0",
    "produce r2 to p0",
    "F3: p0 leaves the metadata and comes back; r2 fails",
    "produce r3 to p0",
    "send r3: written at p0@1",
    "flush() returns 0, serving the reports of r1 r3",
    "prepare: prepared, offsets p0 [0, 1]",
    "the driver commits (EndTxn)",
)

# A report on each partition's last record only (docs/performance.md's trace).
D1_LAST_TRACE = (
    "produce r1 to p0 (no metadata yet)",
    "produce r2 to p0 (no metadata yet)",
    "produce r3 to p0 (no metadata yet)",
    "F1: r1 times out on the unassigned queue",
    "the topic's metadata arrives",
    "send r2, r3: written at p0@0-1",
    "flush() returns 0, serving the reports of r3",
    "prepare: prepared, offsets p0 [1]",
    "the driver commits (EndTxn)",
)


def test_first_and_last_reports_miss_a_record_in_between() -> None:
    result = search("D1")

    assert result.violation == "delivery: the driver committed without r2"
    assert result.trace == D1_TRACE


def test_first_and_last_reports_hold_when_failures_leave_no_hole() -> None:
    # librdkafka's sequence numbers: a silent failure only before the partition's first write.
    assert shortest_counterexample("D1", Bounds(holes=False)) is None
    assert shortest_counterexample("D1", Bounds(records=4, failures=2, holes=False)) is None
    # Three records on two partitions: each is its partition's first or last.
    assert shortest_counterexample("D1", Bounds(partitions=2)) is None


@pytest.mark.parametrize("holes", [True, False])
def test_a_report_on_the_last_record_only_misses_the_first(holes: bool) -> None:
    result = search("D1-last", Bounds(holes=holes))

    assert result.violation == "delivery: the driver committed without r1"
    assert result.trace == D1_LAST_TRACE


@pytest.mark.parametrize(
    "bounds", [Bounds(), Bounds(partitions=2), Bounds(records=4, failures=2)], ids=str
)
@pytest.mark.parametrize("design", ["D0", "D3"])
def test_a_report_per_record_and_failure_only_reports_are_safe(design: str, bounds: Bounds) -> None:
    result = search(design, bounds)

    assert result.violation is None, result.trace
    assert result.states > 1000


def test_a_count_of_acked_records_is_a_proof_but_txmsgs_is_not() -> None:
    assert shortest_counterexample("D2") is None  # if librdkafka counted acked records

    result = search("D2-txmsgs")  # the statistics count sends, a retry twice
    assert result.violation == "delivery: the driver committed without r2"
    assert len(result.trace) == 10
    assert result.trace[6] == "send r3: written at p0@1, answer lost, sent again (deduplicated)"


def test_failure_only_reports_leave_the_probe_without_offsets() -> None:
    result = search("D3-bare")

    assert result.violation == "probe: no offset of p0, which the transaction wrote"
    assert result.trace[-1] == "prepare: prepared, offsets p0 []"
    assert len(result.trace) == 7


def test_describe_producers_gives_the_first_offset_but_no_last() -> None:
    assert search("D3").violation is None  # CurrentTxnStartOffset: a record of its own

    guessed = search("D3-guess")  # start + count - 1: another producer's record in between
    assert guessed.violation == "probe: an offset of p0 the driver holds is another producer's"
    assert "another producer writes p0@2" in guessed.trace


def test_with_the_first_offset_only_one_compaction_can_leave_the_probe_nothing() -> None:
    assert search("D0", Bounds(removals=1)).violation is None  # the last record is still there

    result = search("D3", Bounds(removals=1))
    assert result.violation == "settles: every record at the offsets the driver holds is gone"
    assert result.trace[-2:] == (
        "the driver commits (EndTxn)",
        "compaction removes p0@0 (r1)",
    )
    # Two partitions: two first records, one compaction leaves the other.
    assert search("D3", Bounds(records=4, partitions=2, removals=1)).violation is None
