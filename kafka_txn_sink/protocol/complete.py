"""Phase 2 of the commit: complete a decided batch, whatever happened since its decision.

`Settler.complete(decision)` sends EndTxn(commit) for every participant the decision names
(`txn_admin`), settles each EndTxn error by reading the participant's records back (the fate
probe, `kafka/fate.py`: an error is no proof of abort), publishes again the file references of a
participant the broker aborted first (files mode, in recorded rounds), and writes the completion
marker, recording what was lost. A participant whose records are gone from the log has no
readable fate: the batch stops there, with nothing recorded lost and nothing published again.
Aborting exact triples (`abort`) is the only other thing it does. The driver's `commit()`
(decide.py), the roll-forward at start (recover.py) and `kafka-txn-sink recover` all complete
batches through it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol

from kafka_txn_sink import failpoints
from kafka_txn_sink.commit_log import CommitLog
from kafka_txn_sink.errors import (
    KafkaTxnSinkError,
    TransactionCompletionError,
    TransactionFateUnknownError,
    TransactionLostError,
)
from kafka_txn_sink.kafka.admin_api import (
    EndTxnResult,
    Fate,
    FateAnswer,
    FateProbe,
    TransactionAdmin,
    TxnState,
)
from kafka_txn_sink.protocol.messages import (
    PROGRESS_PARTITION,
    Completion,
    Decision,
    LostParticipant,
    Participant,
    Republish,
    Triple,
    now_ms,
)
from kafka_txn_sink.protocol.stats import CompletionStats, ms_since

log = logging.getLogger(__name__)

# Republish rounds of one batch before recovery gives up until the next attempt: each round
# fails only when the broker aborts the round's transaction between its record and its commit.
MAX_REPUBLISH_ROUNDS = 20


class Republishing(Protocol):
    """Files mode's part in completing: produce lost participants' references once more."""

    def prepare(
        self, decision: Decision, participants: Sequence[Participant], round_: int
    ) -> Republish:
        """Produce the references in an open transaction; the round's record (not yet stored)."""
        ...


@dataclass(frozen=True)
class Settled:
    """A batch's completion marker, and whether this call wrote it."""

    completion: Completion
    newly_written: bool


class Settler:
    """Completes decided batches of one sink, and aborts exact triples."""

    def __init__(
        self,
        sink_id: str,
        commit_log: CommitLog,
        txn_admin: TransactionAdmin,
        cluster: FateProbe,
        deadline_s: float,
        republisher: Republishing | None = None,
    ):
        self._sink_id = sink_id
        self._log = commit_log
        self._txn_admin = txn_admin
        self._cluster = cluster
        self._deadline_s = deadline_s
        self._republisher = republisher

    def complete(self, decision: Decision, decision_write_ms: int | None = None) -> Settled:
        """Commit every participant of a decided batch, then write its completion marker
        (with `decision_write_ms`, how long this run's write of the decision took).

        Raises:
            TransactionCompletionError: a participant's fate is still open; nothing is written,
                and the next attempt (or restart) tries again.
            TransactionFateUnknownError: a participant's fate cannot be read from the log any
                more; nothing is written or published again, and asking again gives the same.
        """
        existing = self._log.completion(decision.batch_id, decision.level)
        if existing is not None:
            return Settled(existing, newly_written=False)
        started = time.monotonic()
        data = [p for p in decision.participants if p.progress is None]
        lost = self._commit_data(decision, data)
        republish = self._republish(decision, [p for p, _ in lost if p.files])
        lost = [(p, reason) for p, reason in lost if _still_lost(p, republish)]
        written = [p.triple for p in data] + ([republish.triple] if republish else [])
        for progress in (p for p in decision.participants if p.progress is not None):
            # Last, once the rows (and references published again) are visible: progress.py.
            lost += self._end_progress(decision, progress, written, rows_lost=bool(lost))
        completion = Completion(
            sink_id=self._sink_id,
            batch_id=decision.batch_id,
            completed_at_ms=now_ms(),
            lost=tuple(_lost(p, reason) for p, reason in lost),
            republished=republish.partitions if republish is not None else (),
            level=decision.level,
            stats=CompletionStats(decision_write_ms, ms_since(started)),
        )
        stored = self._log.put_completion(completion)
        return Settled(stored, newly_written=stored == completion)

    def complete_or_raise_loss(
        self, decision: Decision, decision_write_ms: int | None = None
    ) -> Completion:
        """`complete`, raising once (when the loss is first recorded) if anything was lost."""
        settled = self.complete(decision, decision_write_ms)
        if settled.completion.lost and settled.newly_written:
            raise TransactionLostError(_loss_message(settled.completion))
        self._log.write_hint(decision.batch_id)
        return settled.completion

    def abort(self, triples: Iterable[Triple]) -> list[EndTxnResult]:
        """EndTxn(abort) for exactly these triples; the coordinator's answers (none asked for
        none)."""
        wanted = list(triples)
        if not wanted:
            return []
        return self._txn_admin.end_transactions(wanted, commit=False, deadline_s=self._deadline_s)

    def _republish(self, decision: Decision, lost: Sequence[Participant]) -> Republish | None:
        """Publish the file references of `lost` once more; the round that did it.

        Raises:
            TransactionCompletionError: this settler cannot republish (no files options), or
                the outcome of a round is still open; nothing is marked complete.
        """
        if not lost:
            return None
        for round_ in range(MAX_REPUBLISH_ROUNDS):
            record = self._log.republish(decision.batch_id, round_) or self._record_round(
                decision, lost, round_
            )
            if self._commit_round(decision, record):
                log.warning(
                    "batch %d of sink %s: the broker aborted Spark partition(s) %s; their "
                    "%d file reference(s) were published again (round %d)",
                    decision.batch_id,
                    self._sink_id,
                    list(record.partitions),
                    record.references,
                    round_,
                )
                return record
        raise TransactionCompletionError(
            f"batch {decision.batch_id}: {MAX_REPUBLISH_ROUNDS} rounds of republishing its file "
            f"references were aborted by the broker; recovery retries on the next batch or restart"
        )

    def _record_round(
        self, decision: Decision, lost: Sequence[Participant], round_: int
    ) -> Republish:
        if self._republisher is None:
            raise TransactionCompletionError(
                f"batch {decision.batch_id} was decided, but the broker aborted the transactions "
                f"of Spark partition(s) {[p.partition for p in lost]} which hold file "
                f"references; restart the query (or run recover with the files options) so "
                f"they are published again; nothing is marked complete"
            )
        prepared = self._republisher.prepare(decision, lost, round_)
        failpoints.fire("driver.republish_prepared", decision.batch_id)
        recorded = self._log.put_republish(prepared)
        if not recorded.same_republish(prepared):
            # Another recoverer recorded this round first: ours must never be committed.
            self.abort([prepared.triple])
        failpoints.fire("driver.republish_recorded", decision.batch_id)
        return recorded

    def _commit_round(self, decision: Decision, record: Republish) -> bool:
        """Commit a republish round: True if committed, False if the broker aborted it.

        Raises:
            TransactionFateUnknownError: its records are gone; another round could publish
                the references twice.
        """
        [result] = self._txn_admin.end_transactions(
            [record.triple], commit=True, deadline_s=self._deadline_s
        )
        if result.ok:
            return True
        answer = self._settle(
            record.triple, f"republish {result.error}", self._cluster.fate(record.offsets)
        )
        if answer.fate is Fate.UNDETERMINED:
            raise TransactionFateUnknownError(
                f"batch {decision.batch_id} of sink {self._sink_id}: round {record.round} of "
                f"publishing again the file references of Spark partition(s) "
                f"{list(record.partitions)} ({record.triple}) could not be committed (EndTxn: "
                f"{result.error}), and its fate cannot be read from the log: {answer.evidence}. "
                f"{UNRESOLVED}"
            )
        return answer.fate is Fate.COMMITTED

    def _commit_data(
        self, decision: Decision, participants: list[Participant]
    ) -> list[tuple[Participant, str]]:
        if not participants:
            return []
        first = self._txn_admin.end_transactions(
            [participants[0].triple], commit=True, deadline_s=self._deadline_s
        )
        failpoints.fire("driver.after_first_endtxn", decision.batch_id)
        rest = self._txn_admin.end_transactions(
            [p.triple for p in participants[1:]], commit=True, deadline_s=self._deadline_s
        )
        results = {r.triple: r for r in [*first, *rest]}
        lost, unknown = [], []
        for participant in participants:
            result = results[participant.triple]
            if result.ok:
                continue
            error = result.error or "unknown"
            answer = self._settle(
                participant.triple, error, self._cluster.fate(participant.offsets)
            )
            if answer.fate is Fate.ABORTED:
                lost.append((participant, f"{error}; {self._loss_cause(participant.triple)}"))
            elif answer.fate is Fate.UNDETERMINED:
                unknown.append(
                    f"Spark partition {participant.partition} ({participant.triple}, "
                    f"{participant.rows} rows; EndTxn(commit) failed: {error}): {answer.evidence}"
                )
        if unknown:
            raise TransactionFateUnknownError(
                f"batch {decision.batch_id} of sink {self._sink_id} was decided, but whether the "
                f"brokers committed part of it cannot be read from the log: {'; '.join(unknown)}"
                f". {UNRESOLVED}"
            )
        return lost

    def _end_progress(
        self,
        decision: Decision,
        participant: Participant,
        written: Sequence[Triple],
        rows_lost: bool,
    ) -> list[tuple[Participant, str]]:
        """End the progress transaction after the transactions that `written` names
        (progress.py): commit it once their rows are visible; abort it, recorded lost, when a
        row of the batch was lost.

        Raises:
            TransactionCompletionError: the rows' markers are not all out within the deadline,
                or the progress transaction's fate is still open.
        """
        if rows_lost:
            [result] = self.abort([participant.triple])
            if not result.ok:
                # Open: ask again later. Committed can only mean that the group held these
                # offsets already (a batch that read nothing new): recording it lost costs a
                # repair that commits the same offsets again.
                self._settle_progress(participant, result.error or "unknown")
            return [(participant, PROGRESS_LOST)]
        self._wait_for_markers(decision, written)
        failpoints.fire("driver.before_progress_endtxn", decision.batch_id)
        [result] = self._txn_admin.end_transactions(
            [participant.triple], commit=True, deadline_s=self._deadline_s
        )
        if result.ok:
            return []
        answer = self._settle_progress(participant, result.error or "unknown")
        if answer.fate is Fate.ABORTED:
            cause = self._loss_cause(participant.triple)
            return [(participant, f"{result.error}; {cause}")]
        return []

    def _settle_progress(self, participant: Participant, error: str) -> FateAnswer:
        """The progress transaction's fate, from its group's stable offsets (it has no records).

        Raises:
            TransactionCompletionError: its offsets (or another's) are still pending.
        """
        assert participant.progress is not None
        answer = self._cluster.progress_fate(participant.progress)
        return self._settle(participant.triple, error, answer)

    def wait_visible(self, levels: Sequence[tuple[Decision, Completion | None]]) -> None:
        """After a batch's completion (and repairs): wait until every transaction that wrote
        its rows, at any level (with its completion) or republish round, has its commit markers
        out (asked of each id's own coordinator), so every row is visible.

        Raises:
            TransactionCompletionError: some are still PrepareCommit after the deadline.
        """
        written = [p.triple for level, _ in levels for p in level.participants]
        for level, done in levels:
            rounds = range(MAX_REPUBLISH_ROUNDS) if done is not None and done.republished else ()
            for round_ in rounds:  # read only when the completion says references went again
                record = self._log.republish(level.batch_id, round_)
                if record is None:
                    break
                written.append(record.triple)
        self._wait_for_markers(levels[0][0], written)

    def _wait_for_markers(self, decision: Decision, written: Sequence[Triple]) -> None:
        """Wait until none of `written` is PrepareCommit any more: their commit markers are
        written, so their rows are visible before the group's offsets move.

        Raises:
            TransactionCompletionError: some still are after the deadline.
        """
        deadline = time.monotonic() + self._deadline_s
        pending, pause = list(written), MARKER_POLL_S
        while pending:
            states = self._txn_admin.describe(t.transactional_id for t in pending)
            pending = [t for t in pending if _preparing_commit(states.get(t.transactional_id), t)]
            if not pending:
                return
            if time.monotonic() >= deadline:
                raise TransactionCompletionError(
                    f"batch {decision.batch_id}: the commit markers of {len(pending)} "
                    f"transaction(s) (e.g. {pending[0]}) were not written within "
                    f"{self._deadline_s:.0f} s, so the group's offsets are not committed yet; "
                    f"the next attempt (a roll-forward or the replay) commits them"
                )
            time.sleep(min(pause, max(0.0, deadline - time.monotonic())))
            pause = min(pause * 2, MAX_MARKER_POLL_S)

    def _loss_cause(self, triple: Triple) -> str:
        """Why the coordinator no longer holds `triple`, from the id's producer and epoch now.

        A new InitProducerId on the id (another task attempt or run) bumps the epoch twice, or
        hands out another producer id; the coordinator's timeout bumps it once and aborts.
        """
        try:
            now = self._txn_admin.describe([triple.transactional_id]).get(triple.transactional_id)
        except KafkaTxnSinkError as exc:
            return f"cause unknown: the id could not be described ({exc})"
        if now is None or now.producer_id < 0:
            return "cause unknown: the coordinator no longer knows the id"
        if now.producer_id != triple.producer_id or now.producer_epoch >= triple.producer_epoch + 2:
            return (
                f"{FENCED}: the id was initialised again (now producer {now.producer_id} epoch "
                f"{now.producer_epoch}, {now.state})"
            )
        if now.producer_epoch == triple.producer_epoch + 1 and now.state in ABORTING:
            return (
                f"{TIMED_OUT}: the coordinator aborted it with epoch {now.producer_epoch} "
                f"({now.state})"
            )
        return f"aborted ({now.state} at producer {now.producer_id} epoch {now.producer_epoch})"

    def _settle(self, triple: Triple, error: str, answer: FateAnswer) -> FateAnswer:
        """An EndTxn error is no proof of abort: `answer` is the probe's reading of the
        transaction's records (or, for the progress transaction, of its group's offsets).

        Raises:
            TransactionCompletionError: the fate is not settled within the deadline (still
                open, or no answer); the next attempt or restart asks again.
        """
        if answer.fate is Fate.OPEN:
            raise TransactionCompletionError(
                f"EndTxn for {triple} failed ({error}) and its fate is not settled yet: "
                f"{answer.evidence}; recovery retries on the next batch or restart"
            )
        log.warning(
            "EndTxn for %s failed (%s); probe: %s (%s)",
            triple,
            error,
            answer.fate.value,
            answer.evidence,
        )
        return answer


# How often the progress transaction's end polls for the rows' commit markers: from 5 ms,
# doubling up to 100 ms.
MARKER_POLL_S = 0.005
MAX_MARKER_POLL_S = 0.1
# Why a progress transaction is recorded lost when rows of its batch were.
PROGRESS_LOST = "aborted with its batch's lost rows: the group moves when they are written again"
# How a loss's cause reads in its reason (and how the advice finds it).
FENCED = "fenced by another attempt or run"
TIMED_OUT = "aborted by the coordinator's transaction timeout"
ABORTING = ("PrepareAbort", "CompleteAbort")
# What a participant whose fate cannot be read leaves to the operator.
UNRESOLVED = (
    "So its fate cannot be read from the log: a transaction's records are all committed or all "
    "aborted, and none of them is left to tell. Nothing is recorded lost "
    "and nothing is published again: the batch stays incomplete, and every start of the query "
    "(and kafka-txn-sink recover) stops here with this error. The sink has no command to mark "
    "it settled; it stays unresolved: check by hand whether the consumers of these topics "
    "received these rows."
)


def _preparing_commit(state: TxnState | None, triple: Triple) -> bool:
    """The coordinator still writes this transaction's commit markers (its producer id, in
    PrepareCommit; transaction version 2 bumps the epoch at EndTxn, so only the id is compared)."""
    return (
        state is not None
        and state.state == "PrepareCommit"
        and state.producer_id == triple.producer_id
    )


def _still_lost(participant: Participant, republish: Republish | None) -> bool:
    """Lost unless republished; records beside the references are lost all the same."""
    if republish is None or participant.partition not in republish.partitions:
        return True
    return any(topic not in republish.offsets for topic in participant.offsets)


def _lost(participant: Participant, reason: str) -> LostParticipant:
    return LostParticipant(
        triple=participant.triple,
        partition=participant.partition,
        rows=participant.rows,
        offsets=participant.offsets,
        reason=reason,
        digest=participant.digest,
    )


def describe_lost(lost: LostParticipant) -> str:
    """A lost participant as messages name it."""
    if lost.partition == PROGRESS_PARTITION:
        return f"the consumer group's offsets ({lost.triple.transactional_id})"
    return (
        f"Spark partition {lost.partition} ({lost.triple.transactional_id}, {lost.rows} rows, "
        f"offsets { {t: dict(r) for t, r in lost.offsets.items()} })"
    )


def _loss_message(completion: Completion) -> str:
    parts = "; ".join(f"{describe_lost(x)}: {x.reason}" for x in completion.lost)
    advice = []
    if any(TIMED_OUT in x.reason for x in completion.lost):
        advice.append(
            "The coordinator's transaction timeout struck: raise transactionTimeoutMs (and the "
            "brokers' transaction.max.timeout.ms) and restart crashed drivers sooner."
        )
    if any(FENCED in x.reason for x in completion.lost):
        advice.append(
            "Another process initialised the same transactional id before the commit: a second "
            "driver or a task attempt of an older version of the sink, or another sink with "
            "the same sinkId. Give each sink its own sinkId and run one version at a time."
        )
    return (
        f"batch {completion.batch_id} of sink {completion.sink_id} was decided but part of it "
        f"was aborted before it could be committed: {parts}. The loss is recorded in the commit "
        f"log. Spark runs the batch again, and its replay writes these rows again (repair: the "
        f"query must produce the same rows per input partition). {' '.join(advice)}"
    ).rstrip()
