"""Repair: Spark's replay of a decided batch writes again the rows the brokers aborted.

A decided batch not completed within the transaction timeout (a driver down longer than
`transactionTimeoutMs`) has participants the coordinators aborted; the completion records them
`lost`. Spark never recorded that batch in its checkpoint (its commit() did not return), so the
restarted query replays it with the same offsets, and a deterministic query produces the same
records per input partition again. This module turns that replay into a repair:

1. plan (driver, `plan_repair`): when every level of the latest decided batch is settled and
   some lost participant is neither repaired nor refused, the tasks of its replay write at the
   next level. A level is the decision (0) or a repair (1, 2, ...);
2. write (tasks, prepare.py): each task of the replay writes its records again in a new
   transaction, unless that level is recorded already; the task's message carries the records'
   digest (records/digest.py);
3. commit (driver, `Repairer`): each lost participant is matched to the replayed transaction
   with the same digest (Spark's Kafka source does not keep partition indexes on a replay),
   and the lost ones left to the remaining replayed transactions together when their records
   together are the same (rows that moved between tasks: `match`);
   the matched ones must still be open, then the repair record is put put-if-absent per
   (batch, level), naming the new participants, the lost triples they replace and the lost
   ones no replayed task wrote again (`refused`: kept lost for good). Another run's repair of
   that level wins and ours are aborted. The repair is completed like a decision;
4. Spark may record the batch only when every row of it is committed or refused: `commit()`
   raises `TransactionLostError` while any lost participant waits for a repair, so Spark
   replays it again.

A participant counts as lost only when the fate probe says the brokers aborted it, never while
its fate is unknown, so nothing of a batch is visible twice.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from kafka_txn_sink.commit_log import CommitLog
from kafka_txn_sink.errors import (
    CommitLogError,
    DecisionInDoubtError,
    ParticipantNotCommittableError,
    TransactionCompletionError,
    TransactionLostError,
)
from kafka_txn_sink.kafka.admin_api import TransactionAdmin
from kafka_txn_sink.protocol.complete import Settler, describe_lost
from kafka_txn_sink.protocol.messages import (
    PROGRESS_PARTITION,
    Completion,
    Decision,
    LostParticipant,
    Participant,
    SchemaUse,
    Triple,
    format_version,
    now_ms,
)
from kafka_txn_sink.protocol.record import check_open, record_with_progress
from kafka_txn_sink.protocol.runs import RunRef, check_current, check_decided_by
from kafka_txn_sink.records.digest import combine

if TYPE_CHECKING:
    from kafka_txn_sink.protocol.task_commit import TaskCommit

log = logging.getLogger(__name__)

REFUSED = "not repaired: no task of the replay wrote the same records"
NO_GROUP = "not repaired: the query has no option consumerGroup now"


@dataclass(frozen=True)
class RepairPlan:
    """What the tasks of a replay of batch `batch_id` write: level `level`, for `lost`."""

    batch_id: int
    level: int
    lost: tuple[LostParticipant, ...]
    schemas: tuple[SchemaUse, ...] = ()  # the decision's: the replay encodes with these ids


@dataclass(frozen=True)
class BatchLevels:
    """A decided batch's levels (its decision, then its repairs) and their completions."""

    levels: tuple[Decision, ...]
    completions: tuple[Completion | None, ...]

    @property
    def settled(self) -> bool:
        """Every level has its completion."""
        return all(c is not None for c in self.completions)

    @property
    def next_level(self) -> int:
        """The level a repair of the batch takes next."""
        return len(self.levels)

    def unsettled(self) -> list[Decision]:
        """The repairs that have no completion yet."""
        return [d for d, c in zip(self.levels, self.completions, strict=True) if c is None]

    def refused(self) -> list[LostParticipant]:
        """Lost participants a repair refused: lost for good."""
        return [x for repair in self.levels[1:] for x in repair.refused]

    def waiting(self) -> list[LostParticipant]:
        """Lost participants that no repair wrote again nor refused: what a replay repairs."""
        done = {t for repair in self.levels[1:] for t in repair.repaired}
        done |= {x.triple for x in self.refused()}
        lost = (x for c in self.completions if c is not None for x in c.lost)
        return [x for x in lost if x.triple not in done]

    def repaired_rows(self) -> int:
        """Rows written again by repairs."""
        return sum(p.rows for repair in self.levels[1:] for p in repair.participants)


def batch_levels(commit_log: CommitLog, decision: Decision) -> BatchLevels:
    """The levels of `decision`'s batch. A batch without recorded losses has no repairs, so
    for it this reads only the decision's completion."""
    first = commit_log.completion(decision.batch_id)
    if first is None or not first.lost:
        return BatchLevels((decision,), (first,))
    repairs = commit_log.repairs(decision.batch_id)
    completions = [commit_log.completion(r.batch_id, r.level) for r in repairs]
    return BatchLevels((decision, *repairs), (first, *completions))


# Per log, the latest batch seen complete without losses: what spares the reads before a batch.
_LOSSLESS: dict[str, int] = {}
_LOSSLESS_LOCK = threading.Lock()


def remember_lossless(commit_log: CommitLog, completion: Completion) -> None:
    """Note that `completion`'s batch is complete with nothing lost (never changes after)."""
    if not completion.lost and completion.level == 0:
        with _LOSSLESS_LOCK:
            _LOSSLESS[commit_log.uri] = completion.batch_id


def plan_repair(
    commit_log: CommitLog, decision: Decision | None, settler: Settler | None = None
) -> RepairPlan | None:
    """The repair a replay of `decision`'s batch writes, or None when nothing waits. With a
    `settler`, repairs left without their completion are completed first (`settle_repairs`);
    without one, a batch with such a level plans nothing.

    A batch this process saw complete without losses costs no read; any other, one read of
    its completion, and more only when that records a loss.

    Raises:
        TransactionCompletionError / TransactionFateUnknownError: as `Settler.complete`.
    """
    if decision is None:
        return None
    with _LOSSLESS_LOCK:
        if _LOSSLESS.get(commit_log.uri) == decision.batch_id:
            return None
    levels = batch_levels(commit_log, decision)
    if levels.unsettled() and settler is not None:
        levels = settle_repairs(commit_log, settler, decision, levels)
    if not levels.settled:
        return None
    waiting = levels.waiting()
    if not waiting:
        if levels.completions[0] is not None:
            remember_lossless(commit_log, levels.completions[0])
        return None
    return RepairPlan(decision.batch_id, levels.next_level, tuple(waiting), decision.schemas)


def settle_repairs(
    commit_log: CommitLog,
    settler: Settler,
    decision: Decision,
    levels: BatchLevels | None = None,
) -> BatchLevels:
    """Complete every level of `decision`'s batch left without its completion (a run that
    stopped after putting a repair); the batch's levels read afterwards.

    Raises:
        TransactionCompletionError / TransactionFateUnknownError: as `Settler.complete`.
    """
    levels = levels or batch_levels(commit_log, decision)
    if not levels.unsettled():
        return levels
    for level in levels.unsettled():
        log.warning("completing level %d of batch %d", level.level, level.batch_id)
        settler.complete(level)
    return batch_levels(commit_log, decision)


def latest_word(commit_log: CommitLog) -> Decision | None:
    """The latest decision, or the repair of its batch by the newest run if that run is newer:
    what tells the clean-up which runs can decide nothing more (runs.may_abort), since a run
    that repaired a batch superseded every older one just as a decision does."""
    latest = commit_log.latest_decision()
    if latest is None:
        return None
    repairs = batch_levels(commit_log, latest).levels[1:]
    newest = max(repairs, key=_run_of, default=None)
    return newest if newest is not None and _run_of(newest) > _run_of(latest) else latest


def _run_of(decision: Decision) -> int:
    return -1 if decision.run is None else decision.run


def held_by_repairs(commit_log: CommitLog, decision: Decision) -> set[Triple]:
    """Triples of repairs of `decision`'s batch, complete or not: never aborted as strays."""
    return {p.triple for r in batch_levels(commit_log, decision).levels[1:] for p in r.participants}


class Repairer:
    """The driver's part of a replayed batch: settle its repairs, repair what waits."""

    def __init__(
        self,
        sink_id: str,
        commit_log: CommitLog,
        txn_admin: TransactionAdmin,
        settler: Settler,
        run: RunRef,
        margin_ms: int,
        open_progress: Callable[[int], tuple[Participant, ...]] = lambda _: (),
    ):
        self._open_progress = open_progress  # a batch's new progress (option consumerGroup)
        self._sink_id = sink_id
        self._log = commit_log
        self._txn_admin = txn_admin
        self._settler = settler
        self._run = run
        self._margin_ms = margin_ms

    def finish(self, decision: Decision, tasks: Sequence[TaskCommit]) -> None:
        """After the decision's own completion: settle, repair with the replay's tasks, and let
        the batch through only when no row of it waits for a repair.

        Raises:
            TransactionLostError: rows of the batch are still lost (Spark replays it again),
                or a repair refused some just now (raised once; they stay lost).
            ParticipantNotCommittableError: a repair transaction is no longer open.
            SupersededError: a newer run repaired the batch.
            TransactionCompletionError: a level of the batch is not settled yet.
            DecisionInDoubtError: the repair's write got no answer.
        """
        levels = self._settled(decision)
        waiting = levels.waiting()
        mine = [t for t in tasks if t.level == levels.next_level] if waiting else []
        self._abort(t for t in tasks if t.level > 0 and t not in mine)
        if not waiting:
            return
        if not mine:
            raise TransactionLostError(_waiting_message(decision, waiting))
        repair, ours = self._record(decision, levels.next_level, waiting, mine)
        self._settler.complete(repair)
        if ours:
            _log_repaired(decision, repair)
        # Read again: another run may have put a level above ours meanwhile. The batch passes
        # only once every level is settled and nothing waits, never on "no loss recorded".
        after = self._settled(decision)
        if after.waiting():
            raise TransactionLostError(_waiting_message(decision, after.waiting()))
        if repair.refused and ours:
            raise TransactionLostError(_refused_message(decision, repair))

    def _settled(self, decision: Decision) -> BatchLevels:
        """The batch's levels, each completed (another run's too), none by a newer run.

        Raises:
            SupersededError: a newer run repaired the batch.
            TransactionCompletionError: a level's fate is still open.
        """
        levels = settle_repairs(self._log, self._settler, decision)
        for level in levels.levels[1:]:
            check_decided_by(level, self._run, self._log)
        if not levels.settled:  # a level put after our completion read: settled next time
            raise TransactionCompletionError(
                f"batch {decision.batch_id} of sink {self._sink_id}: repair "
                f"{levels.unsettled()[0].level} is not settled yet; the next attempt settles it"
            )
        return levels

    def _record(
        self,
        decision: Decision,
        level: int,
        waiting: list[LostParticipant],
        tasks: list[TaskCommit],
    ) -> tuple[Decision, bool]:
        """Match, check and put the repair of `level`; the repair that holds the level, and
        whether it is ours."""
        rows = [x for x in waiting if x.partition != PROGRESS_PARTITION]
        found = match(rows, [t for t in tasks if t.status == "prepared"])
        refused = found.refused
        chosen = {t.prepared_triple for t in found.tasks}
        self._abort(t for t in tasks if t.status == "prepared" and t.triple not in chosen)
        progress_lost = [x for x in waiting if x.partition == PROGRESS_PARTITION]
        progress = self._open_progress(decision.batch_id) if progress_lost else ()
        refusals = [replace(x, reason=f"{x.reason}; {REFUSED}") for x in refused]
        if not progress:  # without option consumerGroup now: its offsets stay uncommitted
            refusals += [replace(x, reason=f"{x.reason}; {NO_GROUP}") for x in progress_lost]
            progress_lost = []
        participants = (*(t.participant() for t in found.tasks), *progress)
        repaired = [*(x.triple for x in found.repaired), *(x.triple for x in progress_lost)]
        holder, ours = record_with_progress(
            self._settler,
            progress,
            lambda: self._checked(decision, level, participants, len(tasks), refusals, repaired),
            self._put,
        )
        if not ours:  # the level is another run's: ours can never be committed
            self._abort(t for t in tasks if t.status == "prepared" and t.triple in chosen)
        return holder, ours

    def _checked(
        self,
        decision: Decision,
        level: int,
        participants: tuple[Participant, ...],
        tasks: int,
        refused: list[LostParticipant],
        repaired: list[Triple],
    ) -> Decision:
        """The repair of `level`, once its participants are open with time left, by a run
        that still owns the sink."""
        self._check_open(decision.batch_id, participants)
        repair = replace(
            decision,
            participants=participants,
            tasks=tasks,
            rows=sum(p.rows for p in participants),
            decided_at_ms=now_ms(),
            run=self._run.run,
            round=0,
            level=level,
            repaired=tuple(repaired),
            refused=tuple(refused),
            stats=None,  # the decision's cost is not the repair's
            version=max(decision.version, format_version(participants)),
        )
        check_current(self._sink_id, self._log, self._run)
        return repair

    def _put(self, repair: Decision) -> tuple[Decision, bool]:
        """Put the repair; the repair that holds its level, and whether it is ours.

        Raises:
            DecisionInDoubtError: the write got no answer; it may still land.
        """
        try:
            holder = self._log.put_repair(repair)
        except CommitLogError as exc:
            raise DecisionInDoubtError(
                f"batch {repair.batch_id} of sink {self._sink_id}: repair {repair.level} could "
                f"not be written to {self._log.uri} and its outcome is unknown ({exc}); the next "
                f"run settles it"
            ) from exc
        ours = holder.same_decision(repair)
        if not ours:
            log.warning(
                "repair %d of batch %d was recorded by run %s first; aborting ours",
                repair.level,
                repair.batch_id,
                holder.run,
            )
        return holder, ours

    def _check_open(self, batch_id: int, participants: Sequence[Participant]) -> None:
        found = check_open(self._txn_admin, participants, self._margin_ms)
        failing = [
            *((p, f"the coordinator reports {state}") for p, state in found.closed),
            *((p, f"{left} ms left, {self._margin_ms} needed") for p, left in found.short),
        ]
        for participant, why in failing[:1]:
            raise ParticipantNotCommittableError(
                f"batch {batch_id}: the repair transaction of {participant.describe()} "
                f"({participant.triple}) is not open with enough time left ({why}); nothing "
                f"of the repair is recorded and the batch runs again"
            )

    def _abort(self, tasks: Iterable[TaskCommit]) -> None:
        triples = [t.prepared_triple for t in tasks if t.status == "prepared"]
        if triples:
            self._settler.abort(triples)


@dataclass(frozen=True)
class Match:
    """What a repair takes of a replay: `tasks`, the replayed transactions it commits, for
    `repaired`, the lost participants whose records they hold; `refused`, the lost ones no
    replayed records match."""

    tasks: tuple[TaskCommit, ...]
    repaired: tuple[LostParticipant, ...]
    refused: tuple[LostParticipant, ...]


def match(waiting: Sequence[LostParticipant], tasks: Sequence[TaskCommit]) -> Match:
    """Pair each lost participant with a replayed task that wrote the same records (the same
    digest, which counts them: their order does not matter). Then, if lost ones remain, take
    every remaining replayed task for all of them together when their records together are
    the same (records/digest.py `combine`): a replay that moved rows between tasks, as Spark's
    round-robin `repartition(n)` does when a replay numbers the map tasks anew. Records of a
    participant that was not lost are never among the lost ones, so a partial loss whose rows
    moved is refused, never written twice."""
    free = list(tasks)
    taken: list[TaskCommit] = []
    repaired: list[LostParticipant] = []
    rest: list[LostParticipant] = []
    for lost in waiting:
        found = next((t for t in free if lost.digest and t.digest == lost.digest), None)
        if found is None:
            rest.append(lost)
        else:
            free.remove(found)
            taken.append(found)
            repaired.append(lost)
    if rest and free and _same_records(rest, free):
        return Match((*taken, *free), (*repaired, *rest), ())
    return Match(tuple(taken), tuple(repaired), tuple(rest))


def _same_records(lost: Sequence[LostParticipant], tasks: Sequence[TaskCommit]) -> bool:
    together = combine(x.digest for x in lost)
    return together is not None and together == combine(t.digest for t in tasks)


def _describe(lost: Sequence[LostParticipant]) -> str:
    return "; ".join(describe_lost(x) for x in lost)


def _waiting_message(decision: Decision, waiting: Sequence[LostParticipant]) -> str:
    return (
        f"batch {decision.batch_id} of sink {decision.sink_id} has rows the brokers aborted "
        f"after its decision, not written again yet: {_describe(waiting)}. Spark runs the "
        f"batch again, and the replay repairs them (the query must produce the same rows per "
        f"input partition)"
    )


def _log_repaired(decision: Decision, repair: Decision) -> None:
    """One INFO line for a repair this run committed, as the loss it mends was logged."""
    rows = [p for p in repair.participants if p.partition != PROGRESS_PARTITION]
    count = len(rows)
    refused = f"; {len(repair.refused)} refused, recorded lost" if repair.refused else ""
    log.info(
        "batch %d of sink %s: repair %d committed: %d transaction%s the brokers aborted after the "
        "decision written again by the replay (%d rows)%s",
        decision.batch_id,
        decision.sink_id,
        repair.level,
        count,
        "" if count == 1 else "s",
        sum(p.rows for p in rows),
        refused,
    )


def _refused_message(decision: Decision, repair: Decision) -> str:
    return (
        f"batch {decision.batch_id} of sink {decision.sink_id}: the replay did not write the "
        f"same records as the lost transactions of {_describe(repair.refused)} (no replayed "
        f"task has their digest: the query is not deterministic, or its input changed). Their "
        f"rows stay recorded lost in repair {repair.level}; the restarted query continues "
        f"after them"
    )
