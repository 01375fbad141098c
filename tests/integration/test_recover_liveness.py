"""`kafka-txn-sink recover` judges each open transaction by its own timeout and the owner records,
never by the CLI's `--transaction-timeout-ms`, on the real broker.

A sink whose transactions run with a 10-minute timeout (the test bed's brokers allow 15) has
three runs: run 0 released its slot, run 1 was superseded by run 2's decision of batch 0, and
run 2 is the latest owner, not released. Each left a prepared, undecided transaction. With a CLI
timeout of 1 s, long past, `recover --execute` must abort the first two and leave run 2's alone,
listed as live with why.
"""

from __future__ import annotations

import time

import pytest

from kafka_txn_sink.protocol.messages import Completion, Decision
from kafka_txn_sink.protocol.run_records import Owner, Release
from kafka_txn_sink.protocol.txn_ids import transactional_id
from tests.integration.test_cli_cluster import (
    Sink,
    abort_quietly,
    open_ids,
    prepare,
    run,
    sink,
    status,
    visible,
)

pytestmark = pytest.mark.kafka

__all__ = ["sink"]  # the fixture

TXN_TIMEOUT_MS = 600_000
SLOTS = {0: 0, 1: 2, 2: 1}  # run -> slot


def record_runs(sink: Sink) -> None:
    """Runs 0, 1 and 2; run 0 released; run 2 decided (and completed) batch 0."""
    now = int(time.time() * 1000)
    for number, slot in SLOTS.items():
        owner = Owner(sink.sink_id, number, slot, f"host:{100 + number}@1", now - 120_000)
        sink.log.put_owner(owner)
    sink.log.put_release(Release(sink.sink_id, 0, now - 100_000))
    decided_at = now - 60_000
    sink.log.put_decision(
        Decision(sink.sink_id, "query-1", 0, (), 1, 0, decided_at_ms=decided_at, run=2)
    )
    sink.log.put_completion(Completion(sink.sink_id, 0, decided_at + 1000))


def test_recover_aborts_stale_runs_transactions_and_leaves_the_live_runs_alone(
    sink: Sink, capsys: pytest.CaptureFixture[str]
) -> None:
    record_runs(sink)
    released, superseded, live = (
        prepare(sink, transactional_id(sink.sink_id, 0, slot=SLOTS[r]), TXN_TIMEOUT_MS)
        for r in (0, 1, 2)
    )
    time.sleep(1.2)  # older than the CLI's 1 s: that must not count
    timeout = ["--transaction-timeout-ms", "1000"]
    try:
        code_plan, plan = run(capsys, [*sink.args("recover"), *timeout])
        code, done = run(capsys, [*sink.args("recover", "--execute"), *timeout])
        after = status(sink, capsys)
    finally:
        abort_quietly(sink.bootstrap, released.triple, superseded.triple, live.triple)

    aborted = {a["transaction"] for a in done.get("result", {}).get("aborted", [])}
    assert str(live.triple) not in aborted, "recover aborted a live run's prepared transaction"
    assert open_ids(after) == [live.transactional_id]
    assert visible(sink, live.transactional_id) == 0  # still open: nothing of it visible
    assert aborted == {str(released.triple), str(superseded.triple)}
    assert code == 1, done  # not everything settled: a live run's transaction is left open
    assert [t["transactional_id"] for t in done["live"]] == [live.transactional_id]
    [row] = after["open_transactions"]
    assert "run 2" in row["live"]  # status says why too
    assert code_plan == 0
    planned = {t["transactional_id"]: t["why"] for t in plan["abort"]}
    assert sorted(planned) == sorted([released.transactional_id, superseded.transactional_id])
    assert "run 0" in planned[released.transactional_id]
    assert "released" in planned[released.transactional_id]
    assert "run 2" in planned[superseded.transactional_id]
    [kept] = plan["live"]
    assert kept["transactional_id"] == live.transactional_id
    assert "run 2" in kept["why"] and "not released" in kept["why"]
