"""Step 2, on the driver: decide a batch (`commit(messages, batchId)`), or abort it.

`Committer.commit` does, in this order:
1. checks that every task sent a message and that they add up;
2. checks that the tasks' query is the one the commit log belongs to (not for a batch write,
   whose decision carries the write's own query id);
3. rolls forward a batch that is decided already, and does nothing more for it (a batch write's
   batch decided for another write is refused: two writes ran at once; a batch decided by a
   newer run means this run is superseded), aborting what its tasks prepared outside it;
4. checks that every prepared transaction is still Ongoing with its triple and has time left
   before the brokers would abort it (the margin: every step from this check to the last
   EndTxn, each at its deadline: margin.py; the check and the put are record.py's);
5. stops with `SupersededError`, having written nothing, if a newer run owns the sink
   (runs.py); else writes the decision record, with its run, put-if-absent at the batch's open
   round of its outcome key: the commit point of the batch. A write that fails without an
   answer (a timeout, a 5xx) may still land: the batch is then in doubt
   (`DecisionInDoubtError`), and nothing of it is aborted until a record holds the key;
6. completes the batch (complete.py): EndTxn(commit) for every participant, settled by a probe
   when it errs, then the completion marker; a replay of a batch whose decided transactions
   the brokers aborted repairs them with its tasks' new transactions (repair.py), and the batch
   passes only when none of its rows waits for a repair; with the consumer group on another
   cluster, commits the batch's offsets there once every row is visible (progress_across.py);
7. runs the clean-up of this sink's leftovers when it is due (recover.py).
`abort` first closes the batch's open round with an abort record (put-if-absent, racing any
decision write still in flight for that key); only when that record holds the key does it abort
the prepared transactions. If a decision got there first, it aborts only what the decision does
not hold; if the abort record's own write gets no answer, it aborts nothing and leaves the batch
to the next run. A superseded run records that it released its id slot, and stops.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence

from pyspark.sql.datasource import WriterCommitMessage

from kafka_txn_sink import failpoints
from kafka_txn_sink.commit_log import CommitLog
from kafka_txn_sink.errors import (
    CommitLogConflictError,
    CommitLogError,
    DecisionInDoubtError,
    KafkaTxnSinkError,
    ParticipantNotCommittableError,
    QueryIdMismatchError,
    SupersededError,
    TransactionTooOldError,
)
from kafka_txn_sink.kafka.admin_api import TransactionAdmin
from kafka_txn_sink.options import SinkOptions
from kafka_txn_sink.protocol import causes
from kafka_txn_sink.protocol.complete import Settler
from kafka_txn_sink.protocol.messages import (
    Abort,
    Completion,
    Decision,
    Participant,
    format_version,
    now_ms,
)
from kafka_txn_sink.protocol.progress import batch_progress
from kafka_txn_sink.protocol.record import check_open, record_with_progress
from kafka_txn_sink.protocol.recover import CleanupSchedule, clean_up
from kafka_txn_sink.protocol.repair import (
    Repairer,
    batch_levels,
    held_by_repairs,
    remember_lossless,
)
from kafka_txn_sink.protocol.runs import RunRef, check_current, check_decided_by, release
from kafka_txn_sink.protocol.session import cleanup_schedule, driver_session
from kafka_txn_sink.protocol.stats import batch_stats, ms_since
from kafka_txn_sink.protocol.task_commit import TaskCommit
from kafka_txn_sink.protocol.write_ids import BatchWrite

log = logging.getLogger(__name__)


def commit_batch(
    options: SinkOptions,
    messages: Sequence[WriterCommitMessage | None],
    batch_id: int,
    run: RunRef,
    write: BatchWrite | None = None,
) -> None:
    """Spark's `commit(messages, batchId)`: decide batch `batch_id` and complete it
    (`run`: the driver's run; `write`: the batch write it is, None in a streaming query).

    Raises:
        SupersededError: a newer run owns the sink; nothing was decided.
        KafkaTxnSinkError: the batch cannot be decided (nothing of it is published; Spark
            runs it again, or the user re-runs the write) or its completion failed (recovery
            finishes it).
    """
    schedule = cleanup_schedule(options)
    with driver_session(options) as session:
        committer = Committer(
            options, session.commit_log, session.txn_admin, session.settler, run, schedule, write
        )
        try:
            committer.commit(messages, batch_id)
        except SupersededError:
            # Spark's abort() will not get this far (its streamWriter() is refused), so the
            # run's own prepared transactions, undecided by construction, are aborted here.
            committer.abort_prepared(messages)
            release(options.sink_id, session.commit_log, run)
            raise
        except BaseException as exc:
            schedule.make_due("the previous commit failed")
            causes.leave(options.sink_id, run.run, batch_id, exc)
            raise
        if write is not None:
            release(options.sink_id, session.commit_log, run)


def abort_batch(
    options: SinkOptions,
    messages: Sequence[WriterCommitMessage | None],
    batch_id: int,
    run: RunRef,
) -> None:
    """Spark's `abort(messages, batchId)`: abort what the tasks prepared, unless decided."""
    cleanup_schedule(options).make_due("a batch was aborted")
    cause = causes.take(options.sink_id, run.run, batch_id)
    with driver_session(options) as session:
        Committer(options, session.commit_log, session.txn_admin, session.settler, run).abort(
            messages, batch_id, cause
        )


class Committer:
    """The driver's decision of one batch, and what follows it, for one sink.

    With `write`, the batch is that batch write's: its decision carries the write's query id,
    and the tasks' query is not checked against the log's (a log of batch writes has a query
    id per write).
    """

    def __init__(
        self,
        options: SinkOptions,
        commit_log: CommitLog,
        txn_admin: TransactionAdmin,
        settler: Settler,
        run: RunRef,
        cleanup: CleanupSchedule | None = None,
        write: BatchWrite | None = None,
    ):
        self._options = options
        self._log = commit_log
        self._txn_admin = txn_admin
        self._settler = settler
        self._run = run
        self._cleanup = cleanup  # None: the full clean-up after every commit
        self._write = write
        self._decision_write_ms: int | None = None  # this run's write of the decision

    def commit(self, messages: Sequence[WriterCommitMessage | None], batch_id: int) -> None:
        """Decide batch `batch_id` from its tasks' messages, complete it, clean up when due: the
        steps of the module's docstring, each once, in that order.

        Raises:
            SupersededError: a newer run owns the sink; this did nothing.
            QueryIdMismatchError, ParticipantNotCommittableError, TransactionTooOldError,
            CommitLogError: the batch is not decided; nothing of it is published.
            TransactionLostError / TransactionCompletionError: decided, but not completed.
        """
        tasks = _complete_messages(messages, batch_id)
        query_id = self._query_of(tasks)
        decision = self._decided_or_decide(tasks, batch_id, query_id)
        self._abort_strays(tasks, decision)
        completion = self._settler.complete_or_raise_loss(decision, self._decision_write_ms)
        remember_lossless(self._log, completion)
        repaired = bool(completion.lost) or any(t.level > 0 for t in tasks)
        if repaired:
            self._repairer().finish(decision, tasks)
        self._commit_group_elsewhere(decision, completion, repaired)
        failpoints.fire("driver.after_completion", batch_id)
        if self._cleanup is None or self._cleanup.take_due():
            self._clean_up()

    def _query_of(self, tasks: Sequence[TaskCommit]) -> str:
        """The batch's query id: the tasks', checked against the log's; a batch write's own."""
        if self._write is not None:
            return self._write.query_id
        check_query_id(self._log, {t.query_id for t in tasks})
        return tasks[0].query_id if tasks else ""

    def _decided_or_decide(self, tasks: list[TaskCommit], batch_id: int, query_id: str) -> Decision:
        """The batch's decision: the one the log holds (rolled forward by the caller), or ours."""
        decision, round_ = self._log.settled(batch_id)
        if decision is None:
            return self._decide(tasks, batch_id, query_id, round_)
        check_decided_by(decision, self._run, self._log)
        self._check_decided_for(decision, query_id)
        log.info(
            "batch %d of sink %s was decided before; rolling it forward",
            batch_id,
            self._options.sink_id,
        )
        self._make_cleanup_due("a decided batch was rolled forward")
        return decision

    def _abort_strays(self, tasks: Sequence[TaskCommit], decision: Decision) -> None:
        """Abort the level-0 transactions the decision does not hold (a decision found in the
        log); a retried task makes the clean-up due too (a zombie attempt may remain)."""
        if self._abort_undecided([t for t in tasks if t.level == 0], decision):
            self._make_cleanup_due("prepared transactions outside the decision were aborted")
        if any(t.attempt > 0 for t in tasks):
            self._make_cleanup_due("a task of the batch was retried")

    def _commit_group_elsewhere(
        self, decision: Decision, completion: Completion, repaired: bool
    ) -> None:
        """Option consumerGroup with the group on another cluster: once every row of every
        level is visible, commit the batch's offsets there (progress_across.py)."""
        if self._options.progress is None or not self._options.progress.elsewhere:
            return
        levels: list[tuple[Decision, Completion | None]] = [(decision, completion)]
        if repaired:
            found = batch_levels(self._log, decision)
            levels = list(zip(found.levels, found.completions, strict=True))
        self._settler.wait_visible(levels)
        failpoints.fire("driver.before_group_commit", decision.batch_id)
        from kafka_txn_sink.protocol.progress_across import commit_across  # consumerGroup only

        commit_across(self._options, decision.batch_id)

    def abort(
        self,
        messages: Sequence[WriterCommitMessage | None],
        batch_id: int,
        cause: str | None = None,
    ) -> None:
        """Close the batch's open round, then abort each prepared transaction that no decision
        holds; never touch a decided one, nor anything while the outcome is unknown.

        With the progress transaction in the output's cluster (option consumerGroup), abort()
        also runs the clean-up unless the batch's decision is this run's own: the messages are
        the tasks' only, and commit() may have left its progress transaction open for a
        decision or repair whose write got no answer (or whose conflict could not be read);
        the clean-up aborts it unless a record holds it (review N8)."""
        tasks = [m for m in messages if isinstance(m, TaskCommit)]
        repairing = any(t.level for t in tasks)
        try:
            decision = self._close_round(tasks, batch_id, cause)
        except CommitLogError as exc:
            log.error(
                "batch %d of sink %s: its outcome is unknown (%s); nothing is aborted: the next "
                "run of the query settles it, or the brokers abort its transactions after "
                "transactionTimeoutMs",
                batch_id,
                self._options.sink_id,
                exc,
            )
            return
        if decision is not None:
            held = held_by_repairs(self._log, decision) if repairing else set()
            self._abort_undecided([t for t in tasks if t.triple not in held], decision)
        else:
            self.abort_prepared(tasks)
        ours = decision is not None and decision.run == self._run.run and not repairing
        progress_left = not ours and self._open_progress_possible()
        if len(tasks) < len(messages) or not messages or progress_left:
            self._clean_up()

    def _close_round(
        self, tasks: Sequence[TaskCommit], batch_id: int, cause: str | None
    ) -> Decision | None:
        """The batch's decision if one holds its outcome key, else None once an abort record
        closed the round a decision still in flight could take.

        Raises:
            CommitLogError: the abort record's write got no answer; the outcome is unknown.
        """
        decision, round_ = self._log.settled(batch_id)
        if decision is not None:
            return decision
        prepared = tuple(t.prepared_triple for t in tasks if t.status == "prepared")
        record = Abort(
            self._options.sink_id, batch_id, round_, prepared, now_ms(), self._run.run, cause=cause
        )
        holder = self._log.put_abort(record)
        return holder if isinstance(holder, Decision) else None

    def abort_prepared(self, messages: Sequence[WriterCommitMessage | None]) -> None:
        """Abort, by exact triple, every transaction the messages say was prepared: only for
        a batch this run cannot have decided."""
        prepared = [
            m.prepared_triple
            for m in messages
            if isinstance(m, TaskCommit) and m.status == "prepared"
        ]
        for result in self._settler.abort(prepared):
            if not result.ok:
                log.warning("abort of %s failed: %s", result.triple, result.error)

    def _repairer(self) -> Repairer:
        return Repairer(
            self._options.sink_id,
            self._log,
            self._txn_admin,
            self._settler,
            self._run,
            self._options.margin_ms,
            self._open_progress,
        )

    def _clean_up(self) -> None:
        clean_up(self._options.sink_id, self._log, self._txn_admin, self._settler, self._run)

    def _decide(
        self, tasks: list[TaskCommit], batch_id: int, query_id: str, round_: int
    ) -> Decision:
        if any(t.status == "skipped" for t in tasks):
            raise CommitLogError(
                f"tasks of batch {batch_id} found it decided, but the commit log "
                f"{self._options.commit_log} has no decision for it; was the log changed?"
            )
        participants = tuple(t.participant() for t in tasks if t.status == "prepared")
        progress = self._open_progress(batch_id)
        found, ours = record_with_progress(
            self._settler,
            progress,
            lambda: self._checked(tasks, batch_id, query_id, round_, (*participants, *progress)),
            self._put_decision,
        )
        if not ours:  # an older run's decision counts: commit() completes it
            check_decided_by(found, self._run, self._log)
            log.warning(
                "batch %d of sink %s was decided by run %s first; rolling that decision forward",
                batch_id,
                self._options.sink_id,
                found.run,
            )
            return found
        failpoints.fire("driver.after_decision", batch_id)
        return found

    def _open_progress_possible(self) -> bool:
        """Whether commit() opens a progress transaction in the output's cluster."""
        where = self._options.progress
        return where is not None and not where.elsewhere

    def _open_progress(self, batch_id: int) -> tuple[Participant, ...]:
        """The progress transaction of the batch, open (progress.py); none without option
        consumerGroup, or with the group on another cluster (committed after the rows)."""
        if not self._open_progress_possible():
            return ()
        progress = batch_progress(self._options, batch_id)
        assert progress is not None
        from kafka_txn_sink.protocol.progress_txn import open_progress  # consumerGroup only

        return (open_progress(self._options, self._run, progress),)

    def _checked(
        self,
        tasks: list[TaskCommit],
        batch_id: int,
        query_id: str,
        round_: int,
        participants: tuple[Participant, ...],
    ) -> Decision:
        """The decision of `participants`, once checked open with time left, by a run that
        still owns the sink."""
        failpoints.fire("driver.before_prepare_check", batch_id)
        margin_left_ms = self._check_prepared(participants, batch_id)
        decided_at_ms = now_ms()
        costs = [t.cost() for t in tasks if t.status == "prepared"]
        decision = Decision(
            sink_id=self._options.sink_id,
            query_id=query_id,
            batch_id=batch_id,
            participants=participants,
            tasks=len(tasks),
            rows=sum(p.rows for p in participants),
            decided_at_ms=decided_at_ms,
            run=self._run.run,
            round=round_,
            schemas=tuple(sorted({s for t in tasks for s in t.schemas}, key=str)),
            version=format_version(participants),
            stats=batch_stats(costs, decided_at_ms, margin_left_ms),
        )
        failpoints.fire("driver.before_decision", batch_id)
        # As late as possible: a driver frozen since its streamWriter() may have lost the sink
        # meanwhile. (A decision that still lands after a newer owner record counts, and the
        # newer run rolls it forward: runs.py.)
        check_current(self._options.sink_id, self._log, self._run)
        return decision

    def _put_decision(self, decision: Decision) -> tuple[Decision, bool]:
        """Put `decision` at its round of the batch's outcome key; returns the decision that
        holds the batch, and whether it is ours (another run's may have been put first; refused
        for a batch write).

        Raises:
            DecisionInDoubtError: the write got no answer; it may still land. Spark's abort()
                then races it for the key (`abort`), so nothing is aborted while it may.
            CommitLogConflictError: another record holds the key (another write's decision, or
                an abort record); nothing of the batch is published.
        """
        started = time.monotonic()
        try:
            self._log.put_decision(decision)
            self._decision_write_ms = ms_since(started)
            return decision, True
        except CommitLogConflictError:
            found = self._log.decision(decision.batch_id)
            if found is None or self._write is not None:
                raise
            return found, False
        except CommitLogError as exc:
            raise DecisionInDoubtError(
                f"batch {decision.batch_id} of sink {self._options.sink_id}: the decision could "
                f"not be written to {self._options.commit_log} and its outcome is unknown "
                f"({exc}); it may still land. Nothing of the batch is aborted while it may: "
                f"abort() closes its round first, else the next run settles it"
            ) from exc

    def _check_prepared(self, participants: Sequence[Participant], batch_id: int) -> int | None:
        """The least time a participant has left (ms); raises when one cannot be committed."""
        found = check_open(self._txn_admin, participants, self._options.margin_ms)
        for participant, state in found.closed:
            raise ParticipantNotCommittableError(
                f"batch {batch_id}: the transaction of {participant.describe()} "
                f"({participant.triple}) is no longer open: the "
                f"coordinator reports {state}. It was fenced or aborted; nothing of the "
                f"batch is published and {self._runs_again()}."
            )
        if found.short:
            raise TransactionTooOldError(
                _too_old_message(batch_id, list(found.short), self._options, self._write)
            )
        return found.least_left_ms

    def _check_decided_for(self, decision: Decision, query_id: str) -> None:
        """A batch write's batch decided for another write: both ran at once.

        Raises:
            CommitLogConflictError: this write is not the one decided; nothing of it is
                published.
        """
        if self._write is None or decision.query_id == query_id:
            return
        raise CommitLogConflictError(
            f"batch {decision.batch_id} of sink {self._options.sink_id} was decided for "
            f"{decision.query_id} while write {self._write.write_id!r} ran: a sink takes one "
            f"write at a time. Nothing of write {self._write.write_id!r} is published; run it "
            f"again."
        )

    def _runs_again(self) -> str:
        if self._write is None:
            return "the batch runs again"
        return f"write {self._write.write_id!r} can be run again with the same writeId"

    def _abort_undecided(self, tasks: Sequence[TaskCommit], decision: Decision) -> bool:
        decided = {p.triple for p in decision.participants}
        stray = [
            t.prepared_triple
            for t in tasks
            if t.status == "prepared" and t.prepared_triple not in decided
        ]
        if stray:
            log.warning(
                "aborting %d prepared transactions that batch %d did not decide",
                len(stray),
                decision.batch_id,
            )
            self._settler.abort(stray)
        return bool(stray)

    def _make_cleanup_due(self, reason: str) -> None:
        if self._cleanup is not None:
            self._cleanup.make_due(reason)


def check_query_id(commit_log: CommitLog, query_ids: set[str]) -> None:
    """The writing query must be the one the log belongs to.

    Raises:
        QueryIdMismatchError: the checkpoint was replaced (batch ids restart at 0), so batches
            would be skipped or mixed up silently.
    """
    latest = commit_log.latest_decision()
    if latest is not None:
        QueryIdMismatchError.check(latest.sink_id, commit_log.uri, latest.query_id, query_ids)


def _complete_messages(
    messages: Sequence[WriterCommitMessage | None], batch_id: int
) -> list[TaskCommit]:
    tasks = []
    for index, message in enumerate(messages):
        if not isinstance(message, TaskCommit):
            raise KafkaTxnSinkError(
                f"batch {batch_id}: Spark partition {index} has no commit message "
                f"(got {type(message).__name__}); the batch cannot be decided"
            )
        if message.batch_id != batch_id:
            raise KafkaTxnSinkError(
                f"batch {batch_id}: Spark partition {index} prepared batch {message.batch_id}"
            )
        if message.status == "prepared" and message.rows < sum(
            len(parts) for parts in message.offsets.values()
        ):
            raise KafkaTxnSinkError(
                f"batch {batch_id}: Spark partition {index} reports {message.rows} rows over "
                f"more output partitions than that"
            )
        tasks.append(message)
    return tasks


def _too_old_message(
    batch_id: int,
    too_old: list[tuple[Participant, int]],
    options: SinkOptions,
    write: BatchWrite | None,
) -> str:
    worst = min(left for _, left in too_old)
    timeouts = (
        f"transaction.max.timeout.ms on the brokers and transactionTimeoutMs on the sink "
        f"(now {options.transaction_timeout_ms} ms)"
    )
    if write is None:
        what = f"batch {batch_id}"
        advice = (
            f"Nothing of the batch is published. Spark re-runs the batch with the same offsets, "
            f"so bound batches with maxOffsetsPerTrigger, and raise {timeouts}."
        )
    else:
        what = f"write {write.write_id!r} (batch {batch_id})"
        advice = (
            f"Nothing of the write is published. Raise {timeouts} and run the write again with "
            f"the same writeId, or split it into smaller writes."
        )
    return (
        f"{what} took too long: {len(too_old)} prepared transaction(s) have "
        f"{max(worst, 0)} ms left before the brokers abort them, less than the "
        f"{options.margin_ms} ms the commit needs ({options.explain_margin()}). {advice}"
    )
