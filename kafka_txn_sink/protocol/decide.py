"""The driver's side of the two-phase commit: `commit(messages, batchId)` and `abort(...)`.

Steps of `commit`, in this order (DESIGN §3):
1. the tasks' query id equals the log's (checked before anything else);
2. a batch already decided is rolled forward, nothing more;
3. the messages are complete and add up;
4. every prepared transaction is still Ongoing with its triple and has time left;
5. the decision record is written, put-if-absent: the commit point;
6. EndTxn(commit) for every participant, settled by a probe when it errs;
7. the completion marker;
8. the best-effort clean-up of this sink's leftovers, when due (`CleanupSchedule`).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Sequence

from pyspark.sql.datasource import WriterCommitMessage

from kafka_txn_sink import failpoints
from kafka_txn_sink.commit_log import CommitLog
from kafka_txn_sink.errors import (
    CommitLogError,
    KafkaTxnSinkError,
    ParticipantNotCommittableError,
    QueryIdMismatchError,
    TransactionTooOldError,
)
from kafka_txn_sink.kafka.txn_admin import ONGOING, TxnAdmin
from kafka_txn_sink.options import SinkOptions
from kafka_txn_sink.protocol.complete import Settler
from kafka_txn_sink.protocol.messages import Decision, Participant, TaskCommit

log = logging.getLogger(__name__)


class Committer:
    def __init__(
        self,
        options: SinkOptions,
        commit_log: CommitLog,
        txn_admin: TxnAdmin,
        settler: Settler,
        cleanup: CleanupSchedule | None = None,
    ):
        self._options = options
        self._log = commit_log
        self._txn_admin = txn_admin
        self._settler = settler
        self._cleanup = cleanup  # None: the full clean-up after every commit

    def commit(self, messages: Sequence[WriterCommitMessage | None], batch_id: int) -> None:
        tasks = _complete_messages(messages, batch_id)
        check_query_id(self._log, {t.query_id for t in tasks})
        decision = self._log.decision(batch_id)
        if decision is None:
            decision = self._decide(tasks, batch_id)
        else:
            log.info(
                "batch %d of sink %s was decided before; rolling it forward",
                batch_id,
                self._options.sink_id,
            )
            self._make_cleanup_due("a decided batch was rolled forward")
        if self._abort_undecided(tasks, decision):
            self._make_cleanup_due("prepared transactions outside the decision were aborted")
        if any(t.attempt > 0 for t in tasks):
            self._make_cleanup_due("a task of the batch was retried")
        self._settler.complete_or_raise_loss(decision)
        failpoints.fire("driver.after_completion", batch_id)
        if self._cleanup is None or self._cleanup.take_due():
            self._settler.clean_up()

    def abort(self, messages: Sequence[WriterCommitMessage | None], batch_id: int) -> None:
        """Abort each prepared transaction that no decision holds; never touch a decided one."""
        decision = self._log.decision(batch_id)
        tasks = [m for m in messages if isinstance(m, TaskCommit)]
        if decision is not None:
            self._abort_undecided(tasks, decision)
        else:
            prepared = [t.triple for t in tasks if t.status == "prepared"]
            for result in self._settler.abort(prepared):
                if not result.ok:
                    log.warning("abort of %s failed: %s", result.triple, result.error)
        if len(tasks) < len(messages) or not messages:
            self._settler.clean_up()

    def _decide(self, tasks: list[TaskCommit], batch_id: int) -> Decision:
        if any(t.status == "skipped" for t in tasks):
            raise CommitLogError(
                f"tasks of batch {batch_id} found it decided, but the commit log "
                f"{self._options.commit_log} has no decision for it; was the log changed?"
            )
        participants = tuple(Participant.from_task(t) for t in tasks if t.status == "prepared")
        failpoints.fire("driver.before_prepare_check", batch_id)
        self._check_prepared(participants, batch_id)
        decision = Decision(
            sink_id=self._options.sink_id,
            query_id=tasks[0].query_id if tasks else "",
            batch_id=batch_id,
            participants=participants,
            tasks=len(tasks),
            rows=sum(p.rows for p in participants),
            decided_at_ms=_now_ms(),
        )
        failpoints.fire("driver.before_decision", batch_id)
        self._log.put_decision(decision)
        failpoints.fire("driver.after_decision", batch_id)
        return decision

    def _check_prepared(self, participants: Sequence[Participant], batch_id: int) -> None:
        states = self._txn_admin.describe(p.transactional_id for p in participants)
        now_ms = _now_ms()
        too_old = []
        for participant in participants:
            state = states.get(participant.transactional_id)
            if state is None or state.state != ONGOING or state.triple != participant.triple:
                raise ParticipantNotCommittableError(
                    f"batch {batch_id}: the transaction of Spark partition "
                    f"{participant.partition} ({participant.triple}) is no longer open: the "
                    f"coordinator reports {state}. It was fenced or aborted; nothing of the "
                    f"batch is published and the batch runs again."
                )
            left_ms = state.start_ms + state.timeout_ms - now_ms
            if left_ms < self._options.margin_ms:
                too_old.append((participant, left_ms))
        if too_old:
            raise TransactionTooOldError(_too_old_message(batch_id, too_old, self._options))

    def _abort_undecided(self, tasks: Sequence[TaskCommit], decision: Decision) -> bool:
        decided = {p.triple for p in decision.participants}
        stray = [t.triple for t in tasks if t.status == "prepared" and t.triple not in decided]
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


class CleanupSchedule:
    """When `commit()` runs the full clean-up (ListTransactions, DescribeTransactions, aborts).

    The clean-up finds leftovers: transactions of crashed runs, of losing task attempts, of ids
    of partitions that no longer exist. A batch that completed without any of the signs below
    leaves none: each of its tasks initialised its id (fencing whatever that id had open), its
    participants are committed, and no other id was used. So it runs when there may be
    something to find: the first commit of this sink in this process (a restart: ids of a
    crashed run, possibly more of them than there are partitions now), after a failed commit or
    an abort, after a roll-forward, a retried task or an aborted stray, and otherwise every
    `every_batches` batches or `every_s` seconds, whichever comes first, as a safety net for
    what the driver cannot see (e.g. a zombie attempt of an abandoned stage).
    """

    def __init__(self, every_batches: int = 10, every_s: float = 60.0):
        self.every_batches = every_batches
        self.every_s = every_s
        self.pid = os.getpid()
        self._lock = threading.Lock()
        self._due: str | None = "the first commit of this sink in this process"
        self._since = 0
        self._last = time.monotonic()

    def make_due(self, reason: str) -> None:
        with self._lock:
            self._due = self._due or reason

    def take_due(self) -> bool:
        """Whether to run the clean-up now; if so, the schedule restarts from here."""
        with self._lock:
            self._since += 1
            due = (
                self._due is not None
                or self._since >= self.every_batches
                or time.monotonic() - self._last >= self.every_s
            )
            if due:
                log.debug("clean-up due: %s", self._due or "periodic")
                self._due, self._since, self._last = None, 0, time.monotonic()
            return due


def check_query_id(commit_log: CommitLog, query_ids: set[str]) -> None:
    """The writing query must be the one the log belongs to.

    Raises:
        QueryIdMismatchError: the checkpoint was replaced (batch ids restart at 0), so batches
            would be skipped or mixed up silently.
    """
    latest = commit_log.latest_decision()
    if latest is None or not latest.query_id:
        return
    foreign = sorted(q for q in query_ids if q != latest.query_id)
    if foreign:
        raise query_id_mismatch(latest.sink_id, commit_log.uri, latest.query_id, foreign[0])


def query_id_mismatch(
    sink_id: str, log_uri: str, log_query_id: str, query_id: str
) -> QueryIdMismatchError:
    return QueryIdMismatchError(
        f"the commit log {log_uri} of sink {sink_id} belongs to streaming query "
        f"{log_query_id}, but query {query_id} is writing: the checkpoint was deleted or "
        f"replaced. Restore the checkpoint, or start over with a new sinkId and commitLog; "
        f"batches are never skipped silently."
    )


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
    batch_id: int, too_old: list[tuple[Participant, int]], options: SinkOptions
) -> str:
    worst = min(left for _, left in too_old)
    return (
        f"batch {batch_id} took too long: {len(too_old)} prepared transaction(s) have "
        f"{max(worst, 0)} ms left before the brokers abort them, less than the "
        f"{options.margin_ms} ms the commit needs (commitLogTimeoutMs + commitTimeoutMs + "
        f"clockSkewMs). Nothing of the batch is published. Spark re-runs the batch with the "
        f"same offsets, so bound batches with maxOffsetsPerTrigger, and raise "
        f"transaction.max.timeout.ms on the brokers and transactionTimeoutMs on the sink "
        f"(now {options.transaction_timeout_ms} ms)."
    )


def _now_ms() -> int:
    return int(time.time() * 1000)
