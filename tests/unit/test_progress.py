"""Option consumerGroup's protocol steps, with the fakes of test_decide.py and a real local commit
log: the progress transaction joins the decision, is ended after every row is visible, aborted
and recorded lost with lost rows, and opened again by the replay's repair. The broker's side runs
in tests/e2e/test_consumer_group.py."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from confluent_kafka import KafkaError

from kafka_txn_sink.commit_log import open_commit_log
from kafka_txn_sink.errors import (
    ConfigError,
    DecisionInDoubtError,
    ParticipantNotCommittableError,
    TransactionCompletionError,
    TransactionLostError,
)
from kafka_txn_sink.group_options import parse_group_options
from kafka_txn_sink.kafka import groups
from kafka_txn_sink.kafka.admin_api import EndTxnResult, Fate, FateAnswer, TxnState
from kafka_txn_sink.options import parse_options
from kafka_txn_sink.protocol import progress_across, progress_txn
from kafka_txn_sink.protocol.complete import PROGRESS_LOST, Settler
from kafka_txn_sink.protocol.decide import Committer
from kafka_txn_sink.protocol.messages import (
    PROGRESS_PARTITION,
    Decision,
    GroupProgress,
    Participant,
    Triple,
)
from kafka_txn_sink.protocol.recover import sink_holdings
from kafka_txn_sink.protocol.runs import RunRef
from kafka_txn_sink.protocol.task_commit import TaskCommit
from kafka_txn_sink.protocol.txn_ids import owns, progress_id, slot_of
from kafka_txn_sink.spark_checkpoint import batch_end_offsets, newest_batch
from kafka_txn_sink.testing.consumer_groups import group_offsets, parse_describe
from tests.unit.test_decide import SINK, FakeCluster, FakeTxnAdmin

GROUP = "orders-reader"
END = {"in": {0: 30, 1: 12}}


@dataclass
class MarkerAdmin(FakeTxnAdmin):
    """A coordinator that writes commit markers slowly: an id stays PrepareCommit for
    `describes_until_complete` describes after its EndTxn(commit)."""

    describes_until_complete: int = 0
    order: list[str] = field(default_factory=list)
    _left: dict[str, int] = field(default_factory=dict)

    def end_transactions(
        self, triples: Iterable[Triple], commit: bool, deadline_s: float
    ) -> list[EndTxnResult]:
        wanted = list(triples)
        results = super().end_transactions(wanted, commit, deadline_s)
        for triple in wanted:
            self.order.append(f"{'commit' if commit else 'abort'} {triple.transactional_id}")
            if commit and triple not in self.failing:
                self._left[triple.transactional_id] = self.describes_until_complete
                self.states[triple.transactional_id] = TxnState(
                    triple.transactional_id, "PrepareCommit", triple.producer_id
                )
        return results

    def describe(self, txn_ids: Iterable[str]) -> dict[str, TxnState]:
        found = super().describe(txn_ids)
        for txn_id, state in found.items():
            if state.state == "PrepareCommit":
                self.order.append(f"describe {txn_id}")
                self._left[txn_id] -= 1
                if self._left[txn_id] < 0:
                    self.states[txn_id] = dataclasses.replace(state, state="CompleteCommit")
        return found


@dataclass
class GroupCluster(FakeCluster):
    """The fate probe, and the group's answer for a progress transaction."""

    group_answer: Fate = Fate.COMMITTED
    group_probes: list[GroupProgress] = field(default_factory=list)

    def progress_fate(self, progress: GroupProgress) -> FateAnswer:
        self.group_probes.append(progress)
        return FateAnswer(self.group_answer, f"{self.group_answer.value}: the fake group says so")


@dataclass
class GroupDriver:
    log: object
    txn_admin: MarkerAdmin
    cluster: GroupCluster
    committer: Committer
    opened: list[Triple]


def _checkpoint(path: Path, batches: int) -> Path:
    (path / "offsets").mkdir(parents=True)
    for batch in range(batches):
        end = {"in": {str(p): o + batch for p, o in ((0, 30), (1, 12))}}
        meta = '{"batchWatermarkMs":0,"batchTimestampMs":0,"conf":{}}'
        (path / "offsets" / str(batch)).write_text(f"v1\n{meta}\n{json.dumps(end)}")
    return path


@pytest.fixture
def gdriver(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> GroupDriver:
    options = parse_options(
        {
            "kafka.bootstrap.servers": "h:1",
            "sinkId": SINK,
            "topic": "out",
            "commitLog": str(tmp_path / "log"),
            "checkpointLocation": str(_checkpoint(tmp_path / "checkpoint", 2)),
            "consumerGroup": GROUP,
            "commitTimeoutMs": "1000",
            "commitLogTimeoutMs": "1000",
            "clockSkewMs": "1000",
        }
    ).with_transaction_timeout(60_000)
    log = open_commit_log(options.commit_log)
    txn_admin, cluster = MarkerAdmin(), GroupCluster()
    opened: list[Triple] = []

    def open_progress(_: object, run: RunRef, progress: GroupProgress) -> Participant:
        triple = Triple(progress_id(SINK, slot=run.slot), 900, len(opened))
        opened.append(triple)
        txn_admin.open(triple)
        return Participant(PROGRESS_PARTITION, 0, triple, 0, {}, progress=progress)

    monkeypatch.setattr(progress_txn, "open_progress", open_progress)
    settler = Settler(SINK, log, txn_admin, cluster, deadline_s=1)
    committer = Committer(options, log, txn_admin, settler, RunRef(0, 0))
    return GroupDriver(log, txn_admin, cluster, committer, opened)


def _task(drv: GroupDriver, partition: int, batch: int = 0, epoch: int = 0) -> TaskCommit:
    task = TaskCommit(
        query_id="query-a",
        batch_id=batch,
        partition=partition,
        attempt=0,
        status="prepared",
        rows=10,
        triple=Triple(f"{SINK}-0-{partition}", 100 + partition, epoch),
        offsets={"out": {partition: (epoch * 100, epoch * 100 + 9)}},
        digest=f"10-{partition}",
    )
    drv.txn_admin.open(task.prepared_triple)
    return task


def _decision(drv: GroupDriver, batch: int = 0) -> Decision:
    found = drv.log.decision(batch)  # type: ignore[attr-defined]
    assert isinstance(found, Decision)
    return found


def test_the_progress_joins_the_decision_with_the_batch_end_offsets(gdriver: GroupDriver) -> None:
    gdriver.committer.commit([_task(gdriver, 0), _task(gdriver, 1)], 0)

    decision = _decision(gdriver)
    [progress] = [p for p in decision.participants if p.progress is not None]
    assert progress.triple == gdriver.opened[0] and progress.partition == PROGRESS_PARTITION
    assert progress.progress == GroupProgress(GROUP, END)
    assert decision.rows == 20 and decision.version == 3
    assert decision == Decision.from_json(decision.to_json())


def test_the_progress_commits_only_after_the_rows_markers_are_out(gdriver: GroupDriver) -> None:
    gdriver.txn_admin.describes_until_complete = 2
    tasks = [_task(gdriver, 0), _task(gdriver, 1)]

    gdriver.committer.commit(tasks, 0)

    order = gdriver.txn_admin.order
    progress = f"commit {progress_id(SINK, slot=0)}"
    data = {f"describe {t.prepared_triple.transactional_id}" for t in tasks}
    data_describes = [i for i, step in enumerate(order) if step in data]
    assert len(data_describes) >= 4  # two ids, each PrepareCommit for at least two describes
    assert order.index(progress) > max(data_describes)
    assert order.count(progress) == 1
    assert all(order.index(f"commit {t.prepared_triple.transactional_id}") < order.index(progress)
               for t in tasks)  # fmt: skip
    completion = gdriver.log.completion(0)  # type: ignore[attr-defined]
    assert completion is not None and completion.lost == ()


def test_markers_that_never_come_leave_the_progress_open_and_the_batch_incomplete(
    gdriver: GroupDriver,
) -> None:
    gdriver.txn_admin.describes_until_complete = 10**9

    with pytest.raises(TransactionCompletionError, match="commit markers"):
        gdriver.committer.commit([_task(gdriver, 0)], 0)

    assert f"commit {progress_id(SINK, slot=0)}" not in gdriver.txn_admin.order
    assert gdriver.log.completion(0) is None  # type: ignore[attr-defined]


def test_a_lost_row_aborts_the_progress_and_records_both(gdriver: GroupDriver) -> None:
    tasks = [_task(gdriver, 0), _task(gdriver, 1)]
    gdriver.txn_admin.failing[tasks[1].prepared_triple] = "ProducerFencedError"
    gdriver.cluster.answer = Fate.ABORTED

    with pytest.raises(TransactionLostError, match="the consumer group's offsets"):
        gdriver.committer.commit(tasks, 0)

    assert f"abort {progress_id(SINK, slot=0)}" in gdriver.txn_admin.order
    assert f"commit {progress_id(SINK, slot=0)}" not in gdriver.txn_admin.order
    completion = gdriver.log.completion(0)  # type: ignore[attr-defined]
    assert completion is not None
    lost = {x.partition: x.reason for x in completion.lost}
    assert set(lost) == {1, PROGRESS_PARTITION} and lost[PROGRESS_PARTITION] == PROGRESS_LOST


@pytest.mark.parametrize(
    ("answer", "outcome"),
    [(Fate.COMMITTED, "complete"), (Fate.ABORTED, "lost"), (Fate.OPEN, "open")],
)
def test_an_endtxn_error_on_the_progress_is_settled_by_the_group(
    gdriver: GroupDriver, answer: Fate, outcome: str
) -> None:
    task = _task(gdriver, 0)
    gdriver.txn_admin.failing[Triple(progress_id(SINK, slot=0), 900, 0)] = "RequestTimedOut"
    gdriver.cluster.group_answer = answer

    if outcome == "open":
        with pytest.raises(TransactionCompletionError, match="not settled yet"):
            gdriver.committer.commit([task], 0)
    elif outcome == "lost":
        with pytest.raises(TransactionLostError):
            gdriver.committer.commit([task], 0)
    else:
        gdriver.committer.commit([task], 0)

    assert gdriver.cluster.group_probes == [GroupProgress(GROUP, END)]
    assert gdriver.cluster.probes == []  # no records to read back
    completion = gdriver.log.completion(0)  # type: ignore[attr-defined]
    if outcome == "open":
        assert completion is None
    else:
        assert completion is not None
        assert [x.partition for x in completion.lost] == (
            [PROGRESS_PARTITION] if outcome == "lost" else []
        )


def test_a_batch_not_decided_aborts_its_progress(gdriver: GroupDriver) -> None:
    task = _task(gdriver, 0)
    gdriver.txn_admin.states.pop(task.prepared_triple.transactional_id)  # fenced meanwhile

    with pytest.raises(ParticipantNotCommittableError):
        gdriver.committer.commit([task], 0)

    assert gdriver.txn_admin.order == [f"abort {progress_id(SINK, slot=0)}"]
    assert gdriver.log.decision(0) is None  # type: ignore[attr-defined]


def test_a_decision_in_doubt_keeps_its_progress_open(
    gdriver: GroupDriver, monkeypatch: pytest.MonkeyPatch
) -> None:
    def no_answer(_: Decision) -> None:
        raise DecisionInDoubtError("the write timed out")

    monkeypatch.setattr(gdriver.committer, "_put_decision", no_answer)
    with pytest.raises(DecisionInDoubtError):
        gdriver.committer.commit([_task(gdriver, 0)], 0)

    assert gdriver.txn_admin.order == []  # it may still land, holding the progress


def test_abort_after_a_decision_in_doubt_ends_the_progress_transaction(
    gdriver: GroupDriver, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Review N8: Spark's abort() gets the tasks' messages only; once its abort record holds
    the round, its clean-up aborts the progress transaction commit() left open."""

    def no_answer(_: Decision) -> None:
        raise DecisionInDoubtError("the write timed out")

    monkeypatch.setattr(gdriver.committer, "_put_decision", no_answer)
    task = _task(gdriver, 0)
    with pytest.raises(DecisionInDoubtError):
        gdriver.committer.commit([task], 0)

    gdriver.committer.abort([task], 0)

    assert f"abort {progress_id(SINK, slot=0)}" in gdriver.txn_admin.order
    assert f"abort {task.prepared_triple.transactional_id}" in gdriver.txn_admin.order


def test_the_replay_repairs_a_lost_progress_with_a_new_one(gdriver: GroupDriver) -> None:
    task = _task(gdriver, 0)
    gdriver.txn_admin.failing[Triple(progress_id(SINK, slot=0), 900, 0)] = "ProducerFencedError"
    gdriver.cluster.group_answer = Fate.ABORTED
    with pytest.raises(TransactionLostError):
        gdriver.committer.commit([task], 0)
    gdriver.txn_admin.failing.clear()
    replayed = dataclasses.replace(_task(gdriver, 0, epoch=1), level=1)

    gdriver.committer.commit([replayed], 0)  # the rows were committed: only the group waited

    repair = gdriver.log.repair(0, 1)  # type: ignore[attr-defined]
    assert repair is not None
    assert [p.triple for p in repair.participants] == [gdriver.opened[1]]
    assert repair.repaired == (gdriver.opened[0],)
    repair_id, replayed_id = progress_id(SINK, slot=0), replayed.prepared_triple.transactional_id
    commits = [i for i, s in enumerate(gdriver.txn_admin.order) if s == f"commit {repair_id}"]
    assert len(commits) == 2  # the lost one's EndTxn, then the repair's
    assert commits[-1] > gdriver.txn_admin.order.index(f"abort {replayed_id}")


def test_progress_ids_belong_to_their_sink_and_slot() -> None:
    txn_id = progress_id("orders", slot=2)
    assert txn_id == "orders-2-g" and owns("orders", txn_id) and slot_of("orders", txn_id) == 2
    assert not owns("order", txn_id) and not owns("orders", "orders-2-h")


def test_the_group_option_names_what_it_needs(tmp_path: Path) -> None:
    assert parse_group_options({}, records_mode=True) is None
    parsed = parse_group_options(
        {"consumergroup": "g", "checkpointlocation": "/c"}, records_mode=True
    )
    assert parsed is not None and (parsed.group, parsed.checkpoint) == ("g", "/c")
    with pytest.raises(ConfigError, match=r"consumerGroup .*checkpointLocation"):
        parse_group_options({"consumergroup": "g"}, records_mode=True)
    with pytest.raises(ConfigError, match="consumerGroup is for records mode"):
        parse_group_options({"consumergroup": "g", "checkpointlocation": "/c"}, records_mode=False)
    with pytest.raises(ConfigError, match="consumerGroup must be"):
        parse_group_options({"consumergroup": "a b", "checkpointlocation": "/c"}, records_mode=True)


def test_the_describe_table_is_read_by_its_headers() -> None:
    text = (
        "\nGROUP  TOPIC  PARTITION  CURRENT-OFFSET  LOG-END-OFFSET  LAG  CONSUMER-ID  HOST  "
        "CLIENT-ID\n"
        "g      in     0          30              31              1    -            -     -\n"
        "g      in     1          -               12              -    -            -     -\n"
    )
    rows = parse_describe(text)
    assert [(r.partition, r.current, r.lag) for r in rows] == [(0, 30, 1), (1, None, None)]
    assert group_offsets(rows) == {"in": {0: 30}}


def test_the_offsets_are_read_from_spark_checkpoint_forms(tmp_path: Path) -> None:
    checkpoint = _checkpoint(tmp_path / "c", 2)
    assert newest_batch(str(checkpoint)) == 1
    assert newest_batch(f"file:{checkpoint}") == 1  # Hadoop's form
    assert batch_end_offsets(f"file://{checkpoint}", 0) == END
    with pytest.raises(ConfigError, match=r"checkpointLocation 'dbfs:/c'"):
        newest_batch("dbfs:/c")
    with pytest.raises(ConfigError, match="offsets/7 is missing"):
        batch_end_offsets(str(checkpoint), 7)


def test_rows_lost_and_an_abort_that_errs_still_record_the_progress_lost(
    gdriver: GroupDriver,
) -> None:
    """Even when the group answers committed: a batch that read nothing new leaves the group at
    the same offsets, so a repair that commits them again is harmless."""
    tasks = [_task(gdriver, 0)]
    gdriver.txn_admin.failing[tasks[0].prepared_triple] = "ProducerFencedError"
    gdriver.txn_admin.failing[Triple(progress_id(SINK, slot=0), 900, 0)] = "ProducerFencedError"
    gdriver.cluster.answer, gdriver.cluster.group_answer = Fate.ABORTED, Fate.COMMITTED

    with pytest.raises(TransactionLostError, match="the consumer group's offsets"):
        gdriver.committer.commit(tasks, 0)

    completion = gdriver.log.completion(0)  # type: ignore[attr-defined]
    assert completion is not None
    assert sorted(x.partition for x in completion.lost) == [PROGRESS_PARTITION, 0]


def test_another_runs_decision_found_first_aborts_our_progress(
    gdriver: GroupDriver, monkeypatch: pytest.MonkeyPatch
) -> None:
    def theirs(decision: Decision) -> tuple[Decision, bool]:
        return dataclasses.replace(decision, participants=decision.participants[:1]), False

    monkeypatch.setattr(gdriver.committer, "_put_decision", theirs)
    gdriver.committer.commit([_task(gdriver, 0)], 0)  # completes theirs

    assert gdriver.txn_admin.order[0] == f"abort {progress_id(SINK, slot=0)}"
    assert f"commit {progress_id(SINK, slot=0)}" not in gdriver.txn_admin.order


def test_a_failure_after_the_decision_is_put_keeps_the_progress(gdriver: GroupDriver) -> None:
    """The decision may have landed: nothing it may hold is aborted (an unknown is no no)."""

    def lands_then_fails(decision: Decision) -> tuple[Decision, bool]:
        gdriver.log.put_decision(decision)  # type: ignore[attr-defined]
        raise KeyboardInterrupt

    gdriver.committer._put_decision = lands_then_fails  # type: ignore[method-assign]
    with pytest.raises(KeyboardInterrupt):
        gdriver.committer.commit([_task(gdriver, 0)], 0)

    assert gdriver.txn_admin.order == []
    assert _decision(gdriver).participants[-1].triple == gdriver.opened[0]


def test_a_stale_progress_transaction_is_cleaned_up_and_a_decided_one_kept(
    gdriver: GroupDriver,
) -> None:
    stale = Triple(progress_id(SINK, slot=0), 7, 3)  # a crashed attempt's, in no decision
    gdriver.txn_admin.open(stale)
    gdriver.txn_admin.list_fails = True  # found by the ids the log knows, not by a listing

    holdings = sink_holdings(SINK, gdriver.log, gdriver.txn_admin, RunRef(0, 0))  # type: ignore[arg-type]

    assert [s.triple for s in holdings.stale()] == [stale]


@pytest.mark.parametrize(
    ("held", "fate"),
    [({"in": {0: 30, 1: 12}}, Fate.COMMITTED), ({"in": {0: 31, 1: 12}}, Fate.COMMITTED),
     ({"in": {0: 29, 1: 12}}, Fate.ABORTED), ({}, Fate.ABORTED), (None, Fate.OPEN)],
)  # fmt: skip
def test_the_group_settles_a_progress_fate(
    monkeypatch: pytest.MonkeyPatch, held: dict[str, dict[int, int]] | None, fate: Fate
) -> None:
    def fetch(*_: object, stable: bool) -> dict[str, dict[int, int]]:
        assert stable  # pending offsets must read as pending, never as the old ones
        if held is None:
            raise groups.GroupRefused(KafkaError(KafkaError.UNSTABLE_OFFSET_COMMIT, "pending"))
        return held

    monkeypatch.setattr(groups, "fetch_offsets", fetch)
    answer = groups.progress_fate(None, GroupProgress(GROUP, END), 1.0)  # type: ignore[arg-type]
    assert answer.fate is fate, answer.evidence


def test_the_groups_cluster_without_a_group_is_refused_naming_both() -> None:
    from kafka_txn_sink.errors import ConfigError
    from kafka_txn_sink.options import parse_options

    raw = {
        "kafka.bootstrap.servers": "b:9092", "topic": "t", "sinkId": "s", "commitLog": "/l",
        "consumerGroup.kafka.bootstrap.servers": "elsewhere:9092",
    }  # fmt: skip
    pattern = r"consumergroup\.kafka\.bootstrap\.servers .*consumerGroup"
    with pytest.raises(ConfigError, match=pattern):
        parse_options(raw)


@pytest.fixture
def across_driver(gdriver: GroupDriver, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[
    GroupDriver, list[list[str]]
]:
    """`gdriver` with the group on another cluster: commit_across records what the
    coordinator held for each data id when it was called."""
    options = dataclasses.replace(
        gdriver.committer._options,
        progress=dataclasses.replace(gdriver.committer._options.progress, bootstrap="other:9092"),
    )
    gdriver.committer._options = options
    seen: list[list[str]] = []

    def commit_across(_: object, batch_id: int) -> dict[str, dict[int, int]]:
        states = gdriver.txn_admin.states
        seen.append(sorted(s.state for i, s in states.items() if not i.endswith("-g")))
        return {}

    monkeypatch.setattr(progress_across, "commit_across", commit_across)
    return gdriver, seen


def test_a_group_elsewhere_is_committed_once_every_rows_markers_are_out(
    across_driver: tuple[GroupDriver, list[list[str]]],
) -> None:
    drv, seen = across_driver
    drv.txn_admin.describes_until_complete = 2

    drv.committer.commit([_task(drv, 0), _task(drv, 1)], 0)

    assert seen == [["CompleteCommit", "CompleteCommit"]]
    assert not drv.opened  # no progress participant: the decision holds the rows only
    assert all(p.progress is None for p in _decision(drv).participants)


def test_markers_that_never_come_leave_a_group_elsewhere_untouched(
    across_driver: tuple[GroupDriver, list[list[str]]],
) -> None:
    drv, seen = across_driver
    drv.txn_admin.describes_until_complete = 10**6

    with pytest.raises(TransactionCompletionError, match="group's offsets are not committed"):
        drv.committer.commit([_task(drv, 0), _task(drv, 1)], 0)
    assert seen == []


def test_settings_the_sink_sets_on_the_groups_cluster_are_refused() -> None:
    from kafka_txn_sink.options import parse_options

    raw = {
        "kafka.bootstrap.servers": "b:9092", "topic": "t", "sinkId": "s", "commitLog": "/l",
        "checkpointLocation": "/c", "consumerGroup": "g",
        "consumerGroup.kafka.bootstrap.servers": "elsewhere:9092",
        "consumerGroup.kafka.transactional.id": "mine",
    }  # fmt: skip
    with pytest.raises(ConfigError, match=r"consumergroup\.kafka\.transactional\.id cannot"):
        parse_options(raw)
