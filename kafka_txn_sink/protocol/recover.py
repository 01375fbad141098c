"""Recovery: roll decided batches forward, and clean up what no decision holds.

Three callers, one answer each:
- `sink_holdings` answers "which transactions does this sink hold on the brokers, and which of
  them does the commit log still need": the driver's clean-up, the start check and
  `kafka-txn-sink status`/`recover` all ask it here.
- `roll_forward` completes every decided batch without a completion marker (at the start of
  every batch, and from the CLI).
- `clean_up` aborts the open transactions of this sink that no incomplete decision holds; it
  runs when `CleanupSchedule` says it is due, never while a task of this sink may still run.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field

from kafka_txn_sink import failpoints
from kafka_txn_sink.commit_log import CommitLog
from kafka_txn_sink.errors import KafkaTxnSinkError, SupersededError
from kafka_txn_sink.kafka.admin_api import NOT_FOUND, ONGOING, TransactionAdmin, TxnState
from kafka_txn_sink.protocol.complete import MAX_REPUBLISH_ROUNDS, Settler
from kafka_txn_sink.protocol.messages import Completion, Decision, Triple, now_ms
from kafka_txn_sink.protocol.repair import batch_levels, latest_word
from kafka_txn_sink.protocol.runs import RunRef, check_current, may_abort, standing
from kafka_txn_sink.protocol.txn_ids import (
    SLOTS,
    owns,
    progress_id,
    republish_id,
    slot_of,
    transactional_id,
)

log = logging.getLogger(__name__)

# Ids probed for "does the cluster know this sink" when ListTransactions is refused.
PROBED_IDS_WITHOUT_LISTING = 256
# How far a reader without a run (the CLI) lets its clock run ahead of the coordinators' before
# it counts a transaction's own timeout as passed: the sink's default clockSkewMs.
DEFAULT_CLOCK_SKEW_MS = 5_000


@dataclass(frozen=True)
class Holdings:
    """This sink's open transactions on the brokers, and which of them the commit log needs."""

    open: tuple[TxnState, ...]
    held: Mapping[Triple, int]  # triple -> the incomplete batch that holds it
    abortable: frozenset[Triple]  # open ones this reader may abort if no decision holds them
    # Without a run (the CLI): why each open transaction is abortable or live.
    why: Mapping[Triple, str] = field(default_factory=dict)

    def stale(self) -> list[TxnState]:
        """Open transactions no incomplete decision holds: what the clean-up aborts."""
        return [
            state
            for state in self.open
            if state.triple not in self.held and state.triple in self.abortable
        ]

    def live(self) -> list[TxnState]:
        """Open transactions no incomplete decision holds that a run may still decide."""
        return [
            state
            for state in self.open
            if state.triple not in self.held and state.triple not in self.abortable
        ]


def sink_holdings(
    sink_id: str,
    commit_log: CommitLog,
    txn_admin: TransactionAdmin,
    run: RunRef | None = None,
    clock_skew_ms: int = DEFAULT_CLOCK_SKEW_MS,
) -> Holdings:
    """Every open transaction of `sink_id`, and the triples incomplete batches still need.

    The open ones are those ListTransactions reports, together with every id the commit log says
    the sink used (`{sinkId}-{slot}-{p}` of every slot below its largest partition count, the
    progress ids `{sinkId}-{slot}-g` and `{sinkId}-republish`): brokers list only the ids the
    caller may describe, so a listing alone can miss leftovers. Held are the participants of
    every decided batch without a completion marker and the recorded republish rounds of those
    batches.

    The ids are described before the log is read: every transaction seen is then one that a
    decision, owner or release record read afterwards either holds or no longer can (runs.py).
    With `run` (the driver), `abortable` leaves out other runs' transactions that their run may
    still decide. Without one (the CLI), `judge` decides, and `why` says why for each.
    """
    ids = set(_log_known_ids(sink_id, commit_log))
    try:
        ids.update(i for i in txn_admin.list_ids([ONGOING]) if owns(sink_id, i))
    except KafkaTxnSinkError:
        log.info("ListTransactions refused; describing the ids the commit log knows of")
    states = txn_admin.describe(ids)
    open_ = tuple(s for _, s in sorted(states.items()) if s.state == ONGOING)
    held = _held_triples(commit_log)
    if run is None:
        why = judge(sink_id, commit_log, open_, now_ms(), clock_skew_ms)
        abortable = frozenset(t for t, (may, _) in why.items() if may)
        return Holdings(open_, held, abortable, {t: reason for t, (_, reason) in why.items()})
    return Holdings(open=open_, held=held, abortable=_abortable(sink_id, commit_log, open_, run))


def judge(
    sink_id: str,
    commit_log: CommitLog,
    open_: tuple[TxnState, ...],
    now: int,
    clock_skew_ms: int,
) -> dict[Triple, tuple[bool, str]]:
    """For a reader outside every run (the CLI): whether each open transaction may be aborted
    if no decision holds it, and why.

    It may once its own timeout (the coordinator's `timeout_ms` since its `start_ms`) has passed
    by more than `clock_skew_ms`, or once no run can decide it any more (`runs.standing`: its
    run released, or a newer run decided a batch). A transaction of a run that may still decide
    it, within its own timeout, is live: never the reader's own timeout or guess.
    """
    owners, released = commit_log.owners(), commit_log.released_runs()
    latest = latest_word(commit_log)
    judged: dict[Triple, tuple[bool, str]] = {}
    for state in open_:
        over_ms = now - (state.start_ms + state.timeout_ms)
        if state.start_ms >= 0 and over_ms > clock_skew_ms:
            judged[state.triple] = (
                True,
                f"its own timeout of {state.timeout_ms} ms passed {over_ms / 1000:.1f} s ago",
            )
            continue
        decidable, why = standing(_slot(sink_id, state.transactional_id), owners, released, latest)
        if decidable and state.start_ms >= 0:
            why += f"; {-over_ms / 1000:.1f} s of its own {state.timeout_ms} ms timeout left"
        judged[state.triple] = (not decidable, why)
    return judged


def _abortable(
    sink_id: str, commit_log: CommitLog, open_: tuple[TxnState, ...], run: RunRef
) -> frozenset[Triple]:
    """The open transactions `run` may abort if no decision holds them (runs.may_abort)."""
    owners, latest = commit_log.owners(), latest_word(commit_log)
    return frozenset(
        state.triple
        for state in open_
        if may_abort(_slot(sink_id, state.transactional_id), run, owners, latest)
    )


def known_ids(sink_id: str, txn_admin: TransactionAdmin) -> list[str]:
    """The ids of `sink_id` the brokers know in any state (probed when listing is refused)."""
    try:
        return sorted(i for i in txn_admin.list_ids() if owns(sink_id, i))
    except KafkaTxnSinkError:
        ids = _slot_ids(sink_id, PROBED_IDS_WITHOUT_LISTING)
        return sorted(i for i, s in txn_admin.describe(ids).items() if s.state != NOT_FOUND)


def incomplete_decisions(commit_log: CommitLog) -> list[Decision]:
    """The decisions of the batches without a completion marker, oldest first."""
    found = (commit_log.decision(b) for b in commit_log.incomplete_batches())
    return [d for d in found if d is not None]


def roll_forward(commit_log: CommitLog, settler: Settler) -> list[Completion]:
    """Complete every decided batch that has no completion marker yet, oldest first (the
    repairs of the latest batch left without theirs are completed when the start plans the
    next repair: repair.py `plan_repair`).

    A loss found here is recorded, not raised: the batch was not recorded in Spark's
    checkpoint (its commit() did not return), so Spark replays it, and the replay repairs it.

    Raises:
        TransactionCompletionError: a participant's fate is still open; retried next time.
    """
    done = []
    for decision in incomplete_decisions(commit_log):
        log.warning(
            "rolling forward decided batch %d of sink %s", decision.batch_id, decision.sink_id
        )
        completion = settler.complete(decision).completion
        if completion.lost:
            log.warning(_LOSS_FOUND, decision.batch_id, decision.sink_id, len(completion.lost))
        done.append(completion)
    return done


_LOSS_FOUND = (
    "batch %d of sink %s: the brokers aborted %d of its decided transactions before they could "
    "be committed; recorded. Spark replays the batch, and the replay writes their rows again"
)


def clean_up(
    sink_id: str,
    commit_log: CommitLog,
    txn_admin: TransactionAdmin,
    settler: Settler,
    run: RunRef,
) -> list[Triple]:
    """Abort every open transaction of this sink that no incomplete decision holds and that
    no other run may still decide (`sink_holdings`); nothing if a newer run owns the sink.

    Best effort: it never raises (but for injected failures). Call it only when no task of this
    run runs, so nothing live of its own is touched. Returns the triples it tried to abort.
    """
    try:
        failpoints.fire("driver.before_cleanup")
        holdings = sink_holdings(sink_id, commit_log, txn_admin, run)
        check_current(sink_id, commit_log, run)
        stale = [state.triple for state in holdings.stale()]
        for result in settler.abort(stale):
            if not result.ok:
                log.warning("clean-up could not abort %s: %s", result.triple, result.error)
        return stale
    except failpoints.FailpointError:
        raise
    except SupersededError as exc:
        log.warning("clean-up of sink %s skipped: %s", sink_id, exc)
        return []
    except Exception:
        log.warning("clean-up of sink %s failed; the next batch retries", sink_id, exc_info=True)
        return []


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
        """Run the clean-up at the next commit, for `reason` (kept for the debug log)."""
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


def _log_known_ids(sink_id: str, commit_log: CommitLog) -> list[str]:
    return [*_slot_ids(sink_id, commit_log.max_partition_count()), republish_id(sink_id)]


def _slot_ids(sink_id: str, partitions: int) -> list[str]:
    tasks = [
        transactional_id(sink_id, p, slot=slot) for slot in range(SLOTS) for p in range(partitions)
    ]
    return [*tasks, *(progress_id(sink_id, slot=slot) for slot in range(SLOTS))]


def _slot(sink_id: str, txn_id: str) -> int | None:
    """The id's slot; None for the republish id and ids from before slots (the oldest run's)."""
    try:
        return slot_of(sink_id, txn_id)
    except ValueError:
        return None


def _held_triples(commit_log: CommitLog) -> dict[Triple, int]:
    held: dict[Triple, int] = {}
    latest = commit_log.latest_decision()
    if latest is not None:
        for repair in batch_levels(commit_log, latest).unsettled():
            held.update((p.triple, repair.batch_id) for p in repair.participants)
    for decision in incomplete_decisions(commit_log):
        for participant in decision.participants:
            held[participant.triple] = decision.batch_id
        for round_ in range(MAX_REPUBLISH_ROUNDS):
            record = commit_log.republish(decision.batch_id, round_)
            if record is None:
                break
            held[record.triple] = decision.batch_id
    return held
