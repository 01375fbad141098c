"""The driver's protocol steps in order, with a fake TxnAdmin and a real local commit log.

The broker's side of each step is tested against Apache Kafka in tests/integration and
tests/e2e; here the order and the decisions of the driver are pinned down one by one.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from kafka_txn_sink.commit_log import CommitLog, open_commit_log
from kafka_txn_sink.errors import (
    KafkaTxnSinkError,
    ParticipantNotCommittableError,
    QueryIdMismatchError,
    TransactionCompletionError,
    TransactionLostError,
    TransactionTooOldError,
)
from kafka_txn_sink.kafka.admin_api import ONGOING, EndTxnResult, TxnState
from kafka_txn_sink.options import parse_options
from kafka_txn_sink.protocol.complete import Settler
from kafka_txn_sink.protocol.decide import Committer
from kafka_txn_sink.protocol.messages import Triple
from kafka_txn_sink.protocol.task_commit import TaskCommit

SINK = "orders"
QUERY = "query-a"


@dataclass
class FakeTxnAdmin:
    """Answers like a coordinator whose transactions are all open, unless told otherwise."""

    states: dict[str, TxnState] = field(default_factory=dict)
    failing: dict[Triple, str] = field(default_factory=dict)
    calls: list[tuple[str, bool, tuple[Triple, ...]]] = field(default_factory=list)
    list_fails: bool = False

    def open(self, triple: Triple, start_ms: int | None = None, timeout_ms: int = 60_000) -> None:
        self.states[triple.transactional_id] = TxnState(
            triple.transactional_id,
            ONGOING,
            triple.producer_id,
            triple.producer_epoch,
            timeout_ms,
            start_ms if start_ms is not None else int(time.time() * 1000),
        )

    def describe(self, txn_ids: Iterable[str]) -> dict[str, TxnState]:
        return {i: self.states.get(i, TxnState(i, "NotFound")) for i in txn_ids}

    def end_transactions(
        self, triples: Iterable[Triple], commit: bool, deadline_s: float
    ) -> list[EndTxnResult]:
        wanted = tuple(triples)
        self.calls.append(("end", commit, wanted))
        results = []
        for triple in wanted:
            error = self.failing.get(triple)
            if error is None:
                state = "CompleteCommit" if commit else "CompleteAbort"
                self.states[triple.transactional_id] = TxnState(triple.transactional_id, state)
            results.append(EndTxnResult(triple, error))
        return results

    def list_ids(self, states: Iterable[str] = ()) -> list[str]:
        if self.list_fails:
            raise KafkaTxnSinkError("no DESCRIBE permission")
        wanted = set(states)
        return [i for i, s in self.states.items() if not wanted or s.state in wanted]


@dataclass
class FakeCluster:
    visible: bool | None = True
    probes: list[tuple[str, int, int]] = field(default_factory=list)

    def is_visible(self, topic: str, partition: int, offset: int) -> bool | None:
        self.probes.append((topic, partition, offset))
        return self.visible


@dataclass
class Driver:
    log: CommitLog
    txn_admin: FakeTxnAdmin
    cluster: FakeCluster
    committer: Committer


@pytest.fixture
def driver(tmp_path: Path) -> Driver:
    options = parse_options(
        {
            "kafka.bootstrap.servers": "h:1",
            "sinkId": SINK,
            "commitLog": str(tmp_path / "log"),
            "commitTimeoutMs": "1000",
            "commitLogTimeoutMs": "1000",
            "clockSkewMs": "1000",
        }
    ).with_transaction_timeout(60_000)
    log = open_commit_log(options.commit_log)
    txn_admin, cluster = FakeTxnAdmin(), FakeCluster()
    settler = Settler(SINK, log, txn_admin, cluster, deadline_s=1)
    committer = Committer(options, log, txn_admin, settler)
    return Driver(log, txn_admin, cluster, committer)


def prepared(
    driver: Driver, batch: int, partition: int, epoch: int = 0, query: str = QUERY
) -> TaskCommit:
    task = TaskCommit(
        query_id=query,
        batch_id=batch,
        partition=partition,
        attempt=0,
        status="prepared",
        rows=10,
        triple=Triple(f"{SINK}-{partition}", 100 + partition, epoch),
        offsets={"out": {partition: (batch * 10, batch * 10 + 9)}},
    )
    driver.txn_admin.open(task.prepared_triple)
    return task


def ends(driver: Driver, commit: bool) -> list[Triple]:
    return [t for kind, c, triples in driver.txn_admin.calls if c is commit for t in triples]


def test_commit_decides_then_commits_every_participant(driver: Driver) -> None:
    tasks = [prepared(driver, 0, p) for p in range(3)]

    driver.committer.commit(tasks, 0)

    decision = driver.log.decision(0)
    assert decision is not None and len(decision.participants) == 3
    assert sorted(ends(driver, commit=True), key=str) == sorted(
        (t.prepared_triple for t in tasks), key=str
    )
    completion = driver.log.completion(0)
    assert completion is not None and completion.lost == ()


def test_query_id_is_checked_before_the_already_decided_shortcut(driver: Driver) -> None:
    driver.committer.commit([prepared(driver, 0, 0)], 0)
    driver.txn_admin.calls.clear()

    with pytest.raises(QueryIdMismatchError, match="checkpoint was deleted or replaced"):
        driver.committer.commit([prepared(driver, 0, 0, epoch=1, query="query-b")], 0)

    assert driver.txn_admin.calls == []


def test_a_decided_batch_is_rolled_forward_and_new_attempts_aborted(driver: Driver) -> None:
    first = prepared(driver, 0, 0)
    driver.committer.commit([first], 0)
    driver.txn_admin.calls.clear()
    retry = prepared(driver, 0, 0, epoch=1)  # a later run of the same batch

    driver.committer.commit([retry], 0)

    assert ends(driver, commit=False) == [retry.prepared_triple]
    assert retry.prepared_triple not in ends(driver, commit=True)


def test_a_missing_message_fails_the_batch_before_anything(driver: Driver) -> None:
    with pytest.raises(KafkaTxnSinkError, match="partition 1 has no commit message"):
        driver.committer.commit([prepared(driver, 0, 0), None], 0)

    assert driver.log.decision(0) is None
    assert driver.txn_admin.calls == []


def test_a_fenced_participant_leaves_the_batch_undecided(driver: Driver) -> None:
    tasks = [prepared(driver, 0, 0), prepared(driver, 0, 1)]
    driver.txn_admin.open(Triple(f"{SINK}-1", 101, 1))  # fenced: epoch bumped

    with pytest.raises(ParticipantNotCommittableError, match="partition 1"):
        driver.committer.commit(tasks, 0)

    assert driver.log.decision(0) is None
    assert ends(driver, commit=True) == []


def test_a_transaction_without_enough_time_left_is_too_old(driver: Driver) -> None:
    task = prepared(driver, 0, 0)
    driver.txn_admin.open(task.prepared_triple, start_ms=int(time.time() * 1000) - 59_000)

    with pytest.raises(TransactionTooOldError, match=r"maxOffsetsPerTrigger.*transaction\.max"):
        driver.committer.commit([task], 0)

    assert driver.log.decision(0) is None


def test_an_endtxn_error_with_the_rows_visible_is_not_a_loss(driver: Driver) -> None:
    task = prepared(driver, 0, 0)
    driver.txn_admin.failing[task.prepared_triple] = "ProducerFencedError"
    driver.cluster.visible = True

    driver.committer.commit([task], 0)

    assert driver.cluster.probes == [("out", 0, 0)]
    completion = driver.log.completion(0)
    assert completion is not None and completion.lost == ()


def test_a_real_loss_is_recorded_and_raised_once(driver: Driver) -> None:
    task = prepared(driver, 0, 0)
    driver.txn_admin.failing[task.prepared_triple] = "ProducerFencedError"
    driver.cluster.visible = False

    with pytest.raises(TransactionLostError, match=r"batch 0 .*Spark partition 0"):
        driver.committer.commit([task], 0)
    driver.committer.commit([task], 0)  # the restarted query re-runs the batch: no raise

    completion = driver.log.completion(0)
    assert completion is not None
    assert [(x.transactional_id, x.rows) for x in completion.lost] == [(f"{SINK}-0", 10)]


def test_an_unsettled_fate_writes_no_completion(driver: Driver) -> None:
    task = prepared(driver, 0, 0)
    driver.txn_admin.failing[task.prepared_triple] = "deadline exceeded"
    driver.cluster.visible = None

    with pytest.raises(TransactionCompletionError):
        driver.committer.commit([task], 0)

    assert driver.log.decision(0) is not None
    assert driver.log.completion(0) is None


def test_abort_never_touches_a_decided_participant(driver: Driver) -> None:
    task = prepared(driver, 0, 0)
    driver.txn_admin.failing[task.prepared_triple] = "deadline exceeded"
    driver.cluster.visible = None
    with pytest.raises(TransactionCompletionError):
        driver.committer.commit([task], 0)
    driver.txn_admin.calls.clear()
    stray = prepared(driver, 0, 1)

    driver.committer.abort([task, stray], 0)

    assert ends(driver, commit=False) == [stray.prepared_triple]


def test_abort_of_an_undecided_batch_aborts_its_prepared_transactions(driver: Driver) -> None:
    tasks = [prepared(driver, 0, 0), prepared(driver, 0, 1)]

    driver.committer.abort([*tasks, None], 0)

    assert sorted(ends(driver, commit=False), key=str) == sorted(
        (t.prepared_triple for t in tasks), key=str
    )


def test_clean_up_aborts_leftovers_of_this_sink_only(driver: Driver) -> None:
    leftover = Triple(f"{SINK}-7", 7, 0)
    other_sink = Triple(f"{SINK}_b-0", 9, 0)
    driver.txn_admin.open(leftover)
    driver.txn_admin.open(other_sink)

    driver.committer.commit([prepared(driver, 0, 0)], 0)

    assert leftover in ends(driver, commit=False)
    assert other_sink not in ends(driver, commit=False)


def test_clean_up_never_raises(driver: Driver) -> None:
    driver.txn_admin.list_fails = True
    driver.txn_admin.open(Triple(f"{SINK}-0", 5, 0))

    driver.committer.abort([None], 0)  # falls back to the ids the log knows; no error
