"""Repair (protocol/repair.py): a replay of a decided batch writes again what the brokers aborted.

The driver's side against a real commit log in a local directory and a fake coordinator (the
same as tests/unit/test_decide.py); the e2e tests on the real broker are in
tests/e2e/test_repair.py.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

import pytest

from kafka_txn_sink.errors import SupersededError, TransactionCompletionError, TransactionLostError
from kafka_txn_sink.kafka.admin_api import Fate
from kafka_txn_sink.protocol.messages import Triple
from kafka_txn_sink.protocol.recover import sink_holdings
from kafka_txn_sink.protocol.repair import batch_levels, latest_word, plan_repair
from kafka_txn_sink.protocol.runs import RunRef
from kafka_txn_sink.protocol.task_commit import TaskCommit
from kafka_txn_sink.records.digest import DigestingTransaction
from tests.unit.test_decide import SINK, Driver, driver, ends

__all__ = ["driver"]


def task(
    drv: Driver,
    partition: int,
    digest: str,
    epoch: int = 0,
    level: int = 0,
    rows: int = 10,
    status: str = "prepared",
) -> TaskCommit:
    """A prepared task of batch 0 whose records have `digest`; its transaction is open."""
    triple = Triple(f"{SINK}-{partition}", 100 + partition, epoch)
    message = TaskCommit(
        query_id="query-a",
        batch_id=0,
        partition=partition,
        attempt=0,
        status=status,  # type: ignore[arg-type]
        rows=rows,
        triple=triple if status == "prepared" else None,
        offsets={"out": {partition: (epoch * 100, epoch * 100 + rows - 1)}}
        if status == "prepared"
        else {},
        digest=digest,
        level=level,
    )
    if status == "prepared":
        drv.txn_admin.open(triple)
    return message


def lose(drv: Driver, *tasks: TaskCommit) -> None:
    """The brokers aborted these tasks' transactions before the driver's EndTxn(commit)."""
    for t in tasks:
        drv.txn_admin.failing[t.prepared_triple] = "ProducerFencedError"
    drv.cluster.answer = Fate.ABORTED


def decide_and_lose(drv: Driver) -> list[TaskCommit]:
    """Batch 0 of two partitions, decided; partition 1's transaction aborted by the brokers."""
    tasks = [task(drv, 0, "10-aaaa"), task(drv, 1, "10-bbbb")]
    lose(drv, tasks[1])
    with pytest.raises(TransactionLostError, match="Spark partition 1"):
        drv.committer.commit(tasks, 0)
    drv.txn_admin.failing.clear()
    drv.cluster.answer = Fate.COMMITTED
    return tasks


def replay(
    drv: Driver, digests: dict[int, str], level: int = 1, epoch: int = 1
) -> list[TaskCommit]:
    """Every task of a replay writes again at `level` (partition -> its records' digest)."""
    return [task(drv, p, d, epoch=epoch, level=level) for p, d in digests.items()]


def test_a_lost_participant_is_written_again_by_the_replay_and_the_batch_passes(
    driver: Driver,
) -> None:
    decide_and_lose(driver)
    plan = plan_repair(driver.log, driver.log.decision(0))
    assert plan is not None and plan.level == 1
    assert [x.partition for x in plan.lost] == [1]
    again = replay(driver, {0: "10-aaaa", 1: "10-bbbb"})

    driver.committer.commit(again, 0)  # no raise: every row of the batch is committed

    repair = driver.log.repair(0, 1)
    assert repair is not None
    assert [p.triple for p in repair.participants] == [again[1].prepared_triple]
    assert repair.refused == ()
    assert again[1].prepared_triple in ends(driver, commit=True)
    assert ends(driver, commit=False) == [again[0].prepared_triple]  # partition 0 committed
    levels = batch_levels(driver.log, driver.log.decision(0))  # type: ignore[arg-type]
    assert levels.settled and levels.waiting() == [] and levels.repaired_rows() == 10
    assert plan_repair(driver.log, driver.log.decision(0)) is None


def test_a_repair_that_commits_says_so_in_one_info_line(
    driver: Driver, caplog: pytest.LogCaptureFixture
) -> None:
    decide_and_lose(driver)
    again = replay(driver, {0: "10-aaaa", 1: "10-bbbb"})

    with caplog.at_level(logging.INFO, logger="kafka_txn_sink.protocol.repair"):
        driver.committer.commit(again, 0)

    said = [r for r in caplog.records if r.name == "kafka_txn_sink.protocol.repair"]
    assert [r.levelno for r in said] == [logging.INFO], [r.getMessage() for r in said]
    assert said[0].getMessage() == (
        f"batch 0 of sink {SINK}: repair 1 committed: 1 transaction the brokers aborted after "
        f"the decision written again by the replay (10 rows)"
    )


def test_the_replay_is_matched_by_its_records_not_by_partition_index(driver: Driver) -> None:
    decide_and_lose(driver)
    # Spark's Kafka source gave the input partitions other indexes on the replay.
    again = replay(driver, {0: "10-bbbb", 1: "10-aaaa"})

    driver.committer.commit(again, 0)

    repair = driver.log.repair(0, 1)
    assert repair is not None
    assert [p.partition for p in repair.participants] == [0]
    assert ends(driver, commit=False) == [again[1].prepared_triple]


def test_a_replay_that_differs_is_refused_once_and_the_loss_kept(driver: Driver) -> None:
    decide_and_lose(driver)
    again = replay(driver, {0: "10-aaaa", 1: "10-cccc"})  # not the rows the lost one held

    with pytest.raises(TransactionLostError, match="did not write the same records"):
        driver.committer.commit(again, 0)

    repair = driver.log.repair(0, 1)
    assert repair is not None and repair.participants == ()
    assert [x.partition for x in repair.refused] == [1]
    assert {t.prepared_triple for t in again} <= set(ends(driver, commit=False))
    assert plan_repair(driver.log, driver.log.decision(0)) is None  # never repaired again
    skipped = [dataclasses.replace(t, status="skipped", triple=None, level=0) for t in again]
    driver.committer.commit(skipped, 0)  # the next replay passes: the loss stays recorded
    levels = batch_levels(driver.log, driver.log.decision(0))  # type: ignore[arg-type]
    assert [x.partition for x in levels.refused()] == [1]


def test_a_repair_aborted_by_the_brokers_too_is_repaired_at_the_next_level(
    driver: Driver,
) -> None:
    decide_and_lose(driver)
    first = replay(driver, {1: "10-bbbb"})
    lose(driver, first[0])
    with pytest.raises(TransactionLostError, match="not written again yet"):
        driver.committer.commit(first, 0)
    driver.txn_admin.failing.clear()
    driver.cluster.answer = Fate.COMMITTED
    plan = plan_repair(driver.log, driver.log.decision(0))
    assert plan is not None and plan.level == 2

    second = replay(driver, {1: "10-bbbb"}, level=2, epoch=2)
    driver.committer.commit(second, 0)

    assert driver.log.repair(0, 2) is not None
    assert plan_repair(driver.log, driver.log.decision(0)) is None


def test_another_runs_repair_of_the_level_wins_and_ours_is_aborted(driver: Driver) -> None:
    decide_and_lose(driver)
    theirs = replay(driver, {1: "10-bbbb"}, epoch=7)
    decision = driver.log.decision(0)
    assert decision is not None
    lost = driver.log.completion(0).lost  # type: ignore[union-attr]
    driver.log.put_repair(
        dataclasses.replace(
            decision,
            participants=(dataclasses.replace(decision.participants[1], triple=theirs[0].triple),),
            run=0,
            level=1,
            repaired=(lost[0].triple,),
        )
    )
    ours = replay(driver, {1: "10-bbbb"}, epoch=8)

    driver.committer.commit(ours, 0)

    assert ours[0].prepared_triple in ends(driver, commit=False)
    assert theirs[0].prepared_triple in ends(driver, commit=True)
    assert ours[0].prepared_triple not in ends(driver, commit=True)


def test_a_replay_without_repair_tasks_does_not_let_the_batch_pass(driver: Driver) -> None:
    decide_and_lose(driver)
    skipped = [task(driver, p, "", status="skipped") for p in (0, 1)]

    with pytest.raises(TransactionLostError, match="not written again yet"):
        driver.committer.commit(skipped, 0)

    assert driver.log.repair(0, 1) is None


def test_a_batch_without_losses_plans_no_repair_and_aborts_stray_repair_tasks(
    driver: Driver,
) -> None:
    tasks = [task(driver, 0, "10-aaaa")]
    driver.committer.commit(tasks, 0)
    assert plan_repair(driver.log, driver.log.decision(0)) is None
    late = replay(driver, {0: "10-aaaa"})

    driver.committer.commit(late, 0)

    assert driver.log.repair(0, 1) is None
    assert ends(driver, commit=False) == [late[0].prepared_triple]


def test_the_clean_up_holds_a_repair_without_its_completion(driver: Driver) -> None:
    decide_and_lose(driver)
    decision = driver.log.decision(0)
    lost = driver.log.completion(0).lost  # type: ignore[union-attr]
    assert decision is not None
    pending = replay(driver, {1: "10-bbbb"}, epoch=3)[0]
    driver.log.put_repair(
        dataclasses.replace(
            decision,
            participants=(dataclasses.replace(decision.participants[1], triple=pending.triple),),
            run=1,  # a newer run, stopped after its put: its transaction is open
            level=1,
            repaired=(lost[0].triple,),
        )
    )

    holdings = sink_holdings(SINK, driver.log, driver.txn_admin, RunRef(0, 0))

    assert holdings.held.get(pending.prepared_triple) == 0
    assert pending.prepared_triple not in {s.triple for s in holdings.stale()}
    # The newer run's repair tells the clean-up that run 0 can decide nothing more.
    assert latest_word(driver.log).run == 1  # type: ignore[union-attr]


def test_a_level_put_above_ours_meanwhile_does_not_let_the_batch_through(
    driver: Driver, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Run 0 puts repair 1; before it completes it, a newer run completed that level (finding
    it lost again) and put repair 2, which is not settled: run 0 must not let Spark record the
    batch on "nothing waits" (the model's rejected design `loss-recorded`)."""
    decide_and_lose(driver)
    ours = replay(driver, {1: "10-bbbb"})
    settler = driver.committer._settler
    complete = settler.complete

    def complete_then_a_newer_run_acts(decision: Any, *timing: Any) -> Any:
        settled = complete(decision, *timing)
        if decision.level == 1 and driver.log.repair(0, 2) is None:
            lost = driver.log.completion(0).lost  # type: ignore[union-attr]
            newer = dataclasses.replace(decision, run=1, level=2, repaired=(lost[0].triple,))
            driver.log.put_repair(newer)
        return settled

    monkeypatch.setattr(settler, "complete", complete_then_a_newer_run_acts)

    with pytest.raises((SupersededError, TransactionCompletionError)):
        driver.committer.commit(ours, 0)


def records_digest(*values: bytes) -> str:
    """The digest a task that wrote `values` (no keys) to topic out reports."""
    txn = DigestingTransaction(_Discard())
    txn.send_many("out", list(values), None)
    return txn.digest()


class _Discard:
    def send(self, *_: Any, **__: Any) -> None:
        pass

    def send_many(self, *_: Any, **__: Any) -> None:
        pass


FIRST = {0: records_digest(b"a", b"b"), 1: records_digest(b"c", b"d")}
# The replay's tasks hold the same four rows split otherwise (round-robin repartition(n)).
REGROUPED = {0: records_digest(b"a", b"c"), 1: records_digest(b"b", b"d")}


def test_a_batch_lost_whole_is_repaired_by_a_replay_that_moved_rows_between_tasks(
    driver: Driver,
) -> None:
    tasks = [task(driver, p, d) for p, d in FIRST.items()]
    lose(driver, *tasks)
    with pytest.raises(TransactionLostError):
        driver.committer.commit(tasks, 0)
    driver.txn_admin.failing.clear()
    driver.cluster.answer = Fate.COMMITTED
    again = replay(driver, REGROUPED)

    driver.committer.commit(again, 0)  # no raise: the batch's rows are all written again

    repair = driver.log.repair(0, 1)
    assert repair is not None and repair.refused == ()
    assert {p.triple for p in repair.participants} == {t.prepared_triple for t in again}
    assert set(repair.repaired) == {t.prepared_triple for t in tasks}
    assert {t.prepared_triple for t in again} <= set(ends(driver, commit=True))


def test_a_partial_loss_whose_rows_moved_is_refused_not_written_twice(driver: Driver) -> None:
    tasks = [task(driver, p, d) for p, d in FIRST.items()]
    lose(driver, tasks[1])  # partition 0's rows (a, b) are committed
    with pytest.raises(TransactionLostError):
        driver.committer.commit(tasks, 0)
    driver.txn_admin.failing.clear()
    driver.cluster.answer = Fate.COMMITTED
    again = replay(driver, REGROUPED)

    with pytest.raises(TransactionLostError, match="did not write the same records"):
        driver.committer.commit(again, 0)

    repair = driver.log.repair(0, 1)
    assert repair is not None and repair.participants == ()
    assert [x.partition for x in repair.refused] == [1]
    assert not {t.prepared_triple for t in again} & set(ends(driver, commit=True))
