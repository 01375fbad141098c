"""Recording a decision or a repair: the steps both take, in this order.

1. the batch's progress transaction (option consumerGroup) is opened before the check, so the
   check and the record cover it like any participant (progress.py);
2. the check: every participant is open as its triple at its coordinator, with at least the
   commit margin left before the brokers' timeout aborts it (`check_open`; margin.py);
3. the record's put-if-absent write: ours holds the key, another record does, or the write got
   no answer and ours may still land (`DecisionInDoubtError`);
4. the progress transaction is aborted, by its exact triple, once no record can hold it: the
   check failed, or another record holds the key; never while ours may land or has landed.

decide.py records a batch's decision this way, repair.py a repair level; each builds its own
record, puts it with its own write, and words its own errors.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from kafka_txn_sink.errors import CommitLogConflictError
from kafka_txn_sink.kafka.admin_api import ONGOING, TransactionAdmin, TxnState
from kafka_txn_sink.protocol.complete import Settler
from kafka_txn_sink.protocol.messages import Decision, Participant, now_ms

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class OpenCheck:
    """Which participants a record could not commit: `closed`, not open as their triple (with
    the state the coordinator reports); `short`, open with less than the margin left (ms).
    `least_left_ms`: the least time any open participant had left (None: none was open)."""

    closed: tuple[tuple[Participant, TxnState | None], ...]
    short: tuple[tuple[Participant, int], ...]
    least_left_ms: int | None = None


def check_open(
    admin: TransactionAdmin, participants: Sequence[Participant], margin_ms: int
) -> OpenCheck:
    """Step 2: ask each participant's coordinator for its transaction, and compare the time it
    has left (from the coordinator's start time and timeout) with `margin_ms`."""
    states = admin.describe(p.transactional_id for p in participants)
    now = now_ms()
    closed: list[tuple[Participant, TxnState | None]] = []
    short: list[tuple[Participant, int]] = []
    lefts: list[int] = []
    for participant in participants:
        state = states.get(participant.transactional_id)
        if state is None or state.state != ONGOING or state.triple != participant.triple:
            closed.append((participant, state))
            continue
        left_ms = state.start_ms + state.timeout_ms - now
        lefts.append(left_ms)
        if left_ms < margin_ms:
            short.append((participant, left_ms))
    return OpenCheck(tuple(closed), tuple(short), min(lefts, default=None))


def record_with_progress(
    settler: Settler,
    progress: tuple[Participant, ...],
    checked: Callable[[], Decision],
    put: Callable[[Decision], tuple[Decision, bool]],
) -> tuple[Decision, bool]:
    """Steps 2-4 for a record whose progress transaction (if any) is open: `checked` runs the
    check and returns the record, `put` writes it and returns the record that holds the key and
    whether it is ours. Returns what `put` returns.

    Raises:
        whatever `checked` raises (the record is not put) and whatever `put` raises: a conflict
        (`CommitLogConflictError`: another record holds the key) or a write in doubt
        (`DecisionInDoubtError`: ours may land, so its progress transaction stays open).
    """
    try:
        record = checked()
    except BaseException:
        _abort(settler, progress, "the record was not put")
        raise
    try:
        holder, ours = put(record)
    except CommitLogConflictError:
        _abort(settler, progress, "another record holds the key")
        raise
    if not ours:
        _abort(settler, progress, f"run {holder.run}'s record holds the key")
    return holder, ours


def _abort(settler: Settler, progress: tuple[Participant, ...], why: str) -> None:
    for result in settler.abort([p.triple for p in progress]):
        if not result.ok:  # the coordinator's timeout or the clean-up aborts it instead
            log.warning("abort of progress %s (%s) failed: %s", result.triple, why, result.error)
