"""The driver's protocol steps in order, with a fake TxnAdmin and a real local commit log.

The broker's side of each step is tested against Apache Kafka in tests/integration and
tests/e2e; here the order and the decisions of the driver are pinned down one by one.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from kafka_txn_sink.commit_log import CommitLog, open_commit_log
from kafka_txn_sink.errors import (
    KafkaTxnSinkError,
    ParticipantNotCommittableError,
    QueryIdMismatchError,
    SupersededError,
    TransactionCompletionError,
    TransactionFateUnknownError,
    TransactionLostError,
    TransactionTooOldError,
)
from kafka_txn_sink.kafka.admin_api import ONGOING, EndTxnResult, Fate, FateAnswer, TxnState
from kafka_txn_sink.options import parse_options
from kafka_txn_sink.protocol.complete import Settler
from kafka_txn_sink.protocol.decide import Committer
from kafka_txn_sink.protocol.messages import (
    Decision,
    FileRef,
    OffsetRanges,
    Participant,
    Republish,
    Triple,
    now_ms,
)
from kafka_txn_sink.protocol.run_records import Owner
from kafka_txn_sink.protocol.runs import RunRef
from kafka_txn_sink.protocol.task_commit import TaskCommit
from kafka_txn_sink.protocol.txn_ids import transactional_id

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
    answer: Fate = Fate.COMMITTED
    probes: list[OffsetRanges] = field(default_factory=list)

    def fate(self, offsets: OffsetRanges) -> FateAnswer:
        self.probes.append(offsets)
        return FateAnswer(self.answer, f"{self.answer.value}: the fake says so")


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
    committer = Committer(options, log, txn_admin, settler, RunRef(0, 0))
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
    driver.cluster.answer = Fate.COMMITTED

    driver.committer.commit([task], 0)

    assert driver.cluster.probes == [{"out": {0: (0, 9)}}]
    completion = driver.log.completion(0)
    assert completion is not None and completion.lost == ()


def test_a_real_loss_is_recorded_and_raised_once(driver: Driver) -> None:
    task = prepared(driver, 0, 0)
    driver.txn_admin.failing[task.prepared_triple] = "ProducerFencedError"
    driver.cluster.answer = Fate.ABORTED

    with pytest.raises(TransactionLostError, match=r"batch 0 .*Spark partition 0"):
        driver.committer.commit([task], 0)
    skipped = dataclasses.replace(task, status="skipped", triple=None)
    # A replay whose tasks wrote nothing again (no repair was planned for them) may not pass:
    # Spark would record the batch with its rows lost (tests/unit/test_repair.py repairs it).
    with pytest.raises(TransactionLostError, match=r"not written again yet"):
        driver.committer.commit([skipped], 0)

    completion = driver.log.completion(0)
    assert completion is not None
    assert [(x.transactional_id, x.rows) for x in completion.lost] == [(f"{SINK}-0", 10)]


def test_an_unsettled_fate_writes_no_completion(driver: Driver) -> None:
    task = prepared(driver, 0, 0)
    driver.txn_admin.failing[task.prepared_triple] = "deadline exceeded"
    driver.cluster.answer = Fate.OPEN

    with pytest.raises(TransactionCompletionError):
        driver.committer.commit([task], 0)

    assert driver.log.decision(0) is not None
    assert driver.log.completion(0) is None


def test_an_undeterminable_fate_records_no_loss_and_stops_the_batch(driver: Driver) -> None:
    task = prepared(driver, 0, 0)
    driver.txn_admin.failing[task.prepared_triple] = "InvalidProducerIdMappingError"
    driver.cluster.answer = Fate.UNDETERMINED

    for _ in range(2):  # the restarted query is stopped the same way: never a loss
        with pytest.raises(TransactionFateUnknownError, match=r"batch 0 .*Spark partition 0"):
            driver.committer.commit([task], 0)

    assert driver.log.decision(0) is not None
    assert driver.log.completion(0) is None


@dataclass
class GoneRounds:
    """A republisher whose rounds are refused by the coordinator and gone from the log."""

    driver: Driver
    rounds: list[int] = field(default_factory=list)

    def prepare(
        self, decision: Decision, participants: Sequence[Participant], round_: int
    ) -> Republish:
        self.rounds.append(round_)
        triple = Triple(f"{SINK}-republish", 200 + round_, 0)
        self.driver.txn_admin.failing[triple] = "ProducerFencedError"
        self.driver.cluster.answer = Fate.UNDETERMINED
        offsets = {"refs": {0: (round_, round_)}}
        return Republish(SINK, decision.batch_id, round_, (0,), triple, 1, offsets, now_ms())


def test_a_republish_round_whose_fate_is_gone_is_never_followed_by_another(
    driver: Driver,
) -> None:
    ref = FileRef("/f/part-0.avro", "", {}, records=1, bytes=10, schema_fingerprint="f" * 64)
    participant = Participant(0, 0, Triple(f"{SINK}-0-0", 100, 0), 1, {"refs": {0: (5, 5)}}, (ref,))
    driver.txn_admin.failing[participant.triple] = "ProducerFencedError"
    driver.cluster.answer = Fate.ABORTED
    decision = Decision(SINK, QUERY, 0, (participant,), 1, 1, now_ms())
    driver.log.put_decision(decision)
    republisher = GoneRounds(driver)
    settler = Settler(SINK, driver.log, driver.txn_admin, driver.cluster, 1, republisher)

    with pytest.raises(TransactionFateUnknownError, match=r"round 0 .*Spark partition\(s\) \[0\]"):
        settler.complete(decision)

    assert republisher.rounds == [0]
    assert driver.log.completion(0) is None


def test_abort_never_touches_a_decided_participant(driver: Driver) -> None:
    task = prepared(driver, 0, 0)
    driver.txn_admin.failing[task.prepared_triple] = "deadline exceeded"
    driver.cluster.answer = Fate.OPEN
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


# -- two runs of the query on one sink (protocol/runs.py) -------------------------------------


def run_task(driver: Driver, batch: int, partition: int, slot: int) -> TaskCommit:
    """A prepared task of the run holding id slot `slot`."""
    task = TaskCommit(
        query_id=QUERY,
        batch_id=batch,
        partition=partition,
        attempt=0,
        status="prepared",
        rows=10,
        triple=Triple(transactional_id(SINK, partition, slot=slot), 200 + 10 * slot + partition, 0),
        offsets={"out": {partition: (batch * 10, batch * 10 + 9)}},
    )
    driver.txn_admin.open(task.prepared_triple)
    return task


def two_runs(driver: Driver) -> tuple[Committer, Committer]:
    """The old run (0, slot 0) and the new one (1, slot 1) that took the sink over."""
    driver.log.put_owner(Owner(SINK, 0, 0, "old-driver", now_ms()))
    driver.log.put_owner(Owner(SINK, 1, 1, "new-driver", now_ms()))
    settler = Settler(SINK, driver.log, driver.txn_admin, driver.cluster, deadline_s=1)
    options = driver.committer._options
    old = Committer(options, driver.log, driver.txn_admin, settler, RunRef(0, 0))
    new = Committer(options, driver.log, driver.txn_admin, settler, RunRef(1, 1))
    return old, new


def test_a_superseded_run_decides_nothing_and_names_the_newer_run(driver: Driver) -> None:
    old, _ = two_runs(driver)
    tasks = [run_task(driver, 2, p, slot=0) for p in range(2)]

    with pytest.raises(SupersededError, match=r"run 0 .* superseded by run 1 \(driver new-driver"):
        old.commit(tasks, 2)

    assert driver.log.decision(2) is None
    assert ends(driver, commit=True) == []
    assert [c for c in driver.txn_admin.calls if c[0] == "end"] == []


def test_the_newer_run_completes_a_batch_the_older_run_decided_first(driver: Driver) -> None:
    _, new = two_runs(driver)
    old_tasks = [run_task(driver, 2, p, slot=0) for p in range(2)]
    new_tasks = [run_task(driver, 2, p, slot=1) for p in range(2)]
    participants = tuple(t.participant() for t in old_tasks)
    driver.log.put_decision(Decision(SINK, QUERY, 2, participants, 2, 20, now_ms(), run=0))

    new.commit(new_tasks, 2)

    assert sorted(ends(driver, commit=True), key=str) == [t.prepared_triple for t in old_tasks]
    assert sorted(ends(driver, commit=False), key=str) == [t.prepared_triple for t in new_tasks]
    completion = driver.log.completion(2)
    assert completion is not None and completion.lost == ()


def test_clean_up_spares_another_runs_transactions_until_a_newer_run_decides(
    driver: Driver,
) -> None:
    old, new = two_runs(driver)
    old_prepared = run_task(driver, 2, 0, slot=0)  # the old run may still decide batch 2

    new.abort([None], 2)  # a failed batch of the new run runs the clean-up
    assert ends(driver, commit=False) == []

    new.commit([run_task(driver, 2, 0, slot=1)], 2)  # now the old run's commit of 2 must fail
    assert old_prepared.prepared_triple in ends(driver, commit=False)
    with pytest.raises(SupersededError):
        old.commit([old_prepared], 2)


@pytest.mark.parametrize(
    ("now", "cause"),
    [
        (TxnState(f"{SINK}-0-0", "Empty", 100, 2), "fenced by another attempt or run"),
        (TxnState(f"{SINK}-0-0", "Ongoing", 555, 0), "fenced by another attempt or run"),
        (TxnState(f"{SINK}-0-0", "CompleteAbort", 100, 1), "transaction timeout"),
    ],
)
def test_a_loss_names_its_cause_from_the_epoch_the_coordinator_reports(
    driver: Driver, now: TxnState, cause: str
) -> None:
    task = run_task(driver, 0, 0, slot=0)
    task = dataclasses.replace(task, triple=Triple(f"{SINK}-0-0", 100, 0))
    driver.txn_admin.failing[task.prepared_triple] = "ProducerFencedError"
    driver.txn_admin.states[now.transactional_id] = now
    driver.cluster.answer = Fate.ABORTED

    with pytest.raises(TransactionLostError, match=cause):
        driver.committer._check_prepared = lambda *_: None  # type: ignore[method-assign]
        driver.committer.commit([task], 0)


def test_a_decision_conflict_with_an_older_runs_decision_rolls_it_forward(
    driver: Driver, monkeypatch: pytest.MonkeyPatch
) -> None:
    _, new = two_runs(driver)
    old_tasks = [run_task(driver, 2, p, slot=0) for p in range(2)]
    new_tasks = [run_task(driver, 2, p, slot=1) for p in range(2)]
    older = Decision(
        SINK, QUERY, 2, tuple(t.participant() for t in old_tasks), 2, 20, now_ms(), run=0
    )
    put = driver.log.put_decision

    def older_run_writes_first(decision: Decision) -> None:
        put(older)  # the frozen older run's decision lands between the check and the write
        put(decision)

    monkeypatch.setattr(driver.log, "put_decision", older_run_writes_first)

    new.commit(new_tasks, 2)

    assert driver.log.decision(2) == older
    assert sorted(ends(driver, commit=True), key=str) == [t.prepared_triple for t in old_tasks]
    assert sorted(ends(driver, commit=False), key=str) == [t.prepared_triple for t in new_tasks]
