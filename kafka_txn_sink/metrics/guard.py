"""The guard on stuck transactions: what of the sink holds back read_committed consumers now.

One `look()` asks the brokers for the sink's open transactions (protocol/recover.py
`sink_holdings`, as `status` and `recover` do) and for the ends of the output partitions: those
the open transactions wrote to, and those the newest decision wrote to (protocol/stuck.py, as
`status` shows them). Each open transaction
is `decided` (a decision holds it: its batch is completing), `live` (undecided, and a run may
still decide it) or `stray` (undecided, and no run can decide it any more: `recover` aborts it).
"""

from __future__ import annotations

from dataclasses import dataclass

from kafka_txn_sink.commit_log import CommitLog
from kafka_txn_sink.kafka.admin_api import TransactionAdmin, TxnState
from kafka_txn_sink.protocol.messages import Decision, now_ms
from kafka_txn_sink.protocol.recover import Holdings, sink_holdings
from kafka_txn_sink.protocol.stuck import Ends, HeldBack, decision_partitions, held_back

DECIDED, LIVE, STRAY = "decided", "live", "stray"


@dataclass(frozen=True)
class OpenTxn:
    """One open transaction of the sink: its kind, its age and the time its timeout leaves."""

    state: TxnState
    kind: str  # DECIDED, LIVE or STRAY
    age_ms: int
    left_ms: int  # until the coordinator's timeout aborts it (negative: overdue)


@dataclass(frozen=True)
class GuardReading:
    """What one look found."""

    at_ms: int
    transactions: tuple[OpenTxn, ...]
    partitions: tuple[HeldBack, ...]  # output partitions (protocol/stuck.py)

    def count(self, kind: str) -> int:
        """How many open transactions are of `kind`."""
        return sum(1 for t in self.transactions if t.kind == kind)

    @property
    def oldest(self) -> OpenTxn | None:
        """The open transaction that started first, or None."""
        return min(self.transactions, key=lambda t: t.state.start_ms, default=None)


def look(
    sink_id: str,
    commit_log: CommitLog,
    txn_admin: TransactionAdmin,
    cluster: Ends,
    latest: Decision | None,
) -> GuardReading:
    """The sink's open transactions and its output partitions' lag, now (`latest`: the newest
    decision, whose partitions are watched too).

    Raises:
        KafkaTxnSinkError / CommitLogError: the brokers or the log could not be read.
    """
    holdings = sink_holdings(sink_id, commit_log, txn_admin)
    now = now_ms()
    transactions = tuple(
        OpenTxn(
            state=state,
            kind=_kind(state, holdings),
            age_ms=now - state.start_ms,
            left_ms=state.start_ms + state.timeout_ms - now,
        )
        for state in holdings.open
    )
    watched = decision_partitions(latest)
    return GuardReading(now, transactions, tuple(held_back(holdings.open, cluster, watched)))


def _kind(state: TxnState, holdings: Holdings) -> str:
    if state.triple in holdings.held:
        return DECIDED
    return STRAY if state.triple in holdings.abortable else LIVE
