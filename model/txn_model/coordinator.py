"""The brokers' transaction coordinator, one entry per transactional id, as pure functions.

It keeps what the sink's protocol depends on (the transaction rules of protocol version 1, which
librdkafka's producers use):

- `init_producer` (InitProducerId) gives the id a producer id on first use and bumps the epoch.
  An `Ongoing` transaction is fenced: the epoch is bumped, the transaction goes to
  `PrepareAbort`, and the caller is told to retry (CONCURRENT_TRANSACTIONS) until the abort
  markers are written.
- `end_txn` (EndTxn) checks the whole triple: the id must be known, the producer id must match,
  the epoch must be the current one. An `Ongoing` transaction moves to `PrepareCommit` or
  `PrepareAbort`; repeating the same outcome on a completed transaction succeeds; the other
  outcome is INVALID_TXN_STATE.
- `write_markers` is the coordinator's own second step: `PrepareCommit` becomes
  `CompleteCommit` and the rows become visible to read_committed consumers; `PrepareAbort`
  becomes `CompleteAbort` and the rows are dropped.
- `time_out` aborts an `Ongoing` transaction after its timeout, bumping the epoch first.

Producer ids never rotate (epoch overflow is left out) and ids never expire.
"""

from __future__ import annotations

from enum import Enum
from typing import NamedTuple


class TxnState(str, Enum):
    """States of one transactional id in the coordinator."""

    EMPTY = "Empty"
    ONGOING = "Ongoing"
    PREPARE_COMMIT = "PrepareCommit"
    PREPARE_ABORT = "PrepareAbort"
    COMPLETE_COMMIT = "CompleteCommit"
    COMPLETE_ABORT = "CompleteAbort"


class Outcome(str, Enum):
    """What a request to the coordinator answers (Kafka's error codes, by name)."""

    OK = "NONE"
    CONCURRENT = "CONCURRENT_TRANSACTIONS"  # retriable: markers are still being written
    FENCED = "PRODUCER_FENCED"
    UNKNOWN_PRODUCER = "INVALID_PRODUCER_ID_MAPPING"
    INVALID_STATE = "INVALID_TXN_STATE"


Row = tuple[int, int, int]
"""A row of the output: (batch, partition, index), the index-th row of the batch's Spark
partition in the query's first computation. Without `Config.regroup` every partition holds one
row (index 0), which stands for all its rows; with it, two, so that a replay can move some of a
partition's rows to another task (repair.py `rows_of`)."""


class Triple(NamedTuple):
    """Names one transaction exactly: what EndTxn checks."""

    txn_id: str
    producer_id: int
    epoch: int

    def __str__(self) -> str:
        return f"({self.txn_id}, pid {self.producer_id}, epoch {self.epoch})"


class Txn(NamedTuple):
    """The coordinator's entry for one transactional id."""

    producer_id: int
    epoch: int
    state: TxnState
    rows: tuple[Row, ...]  # of the open (or preparing) transaction

    def holds(self, triple: Triple) -> bool:
        """Whether this entry's current producer is exactly `triple`."""
        return (self.producer_id, self.epoch) == (triple.producer_id, triple.epoch)


Coordinator = tuple[tuple[str, Txn], ...]
"""Every transactional id the brokers know, sorted by id (immutable, so states hash)."""

PREPARING = (TxnState.PREPARE_COMMIT, TxnState.PREPARE_ABORT)


def describe(coordinator: Coordinator, txn_id: str) -> Txn | None:
    """DescribeTransactions: the entry of `txn_id`, or None if the brokers do not know it."""
    for key, txn in coordinator:
        if key == txn_id:
            return txn
    return None


def held_in(coordinator: Coordinator, triple: Triple, states: tuple[TxnState, ...]) -> bool:
    """Whether `triple` is its id's current producer and the id is in one of `states`."""
    txn = describe(coordinator, triple.txn_id)
    return txn is not None and txn.holds(triple) and txn.state in states


def _put(coordinator: Coordinator, txn_id: str, txn: Txn) -> Coordinator:
    rest = tuple(item for item in coordinator if item[0] != txn_id)
    return tuple(sorted((*rest, (txn_id, txn))))


def init_producer(
    coordinator: Coordinator, txn_id: str
) -> tuple[Coordinator, Outcome, Triple | None]:
    """InitProducerId for `txn_id`. On OK the triple is the caller's new producer; on
    CONCURRENT (no triple) the caller must retry after the markers are written."""
    txn = describe(coordinator, txn_id)
    if txn is None:
        txn = Txn(len(coordinator) + 1, -1, TxnState.EMPTY, ())
    if txn.state in PREPARING:
        return coordinator, Outcome.CONCURRENT, None
    if txn.state is TxnState.ONGOING:
        fenced = txn._replace(epoch=txn.epoch + 1, state=TxnState.PREPARE_ABORT)
        return _put(coordinator, txn_id, fenced), Outcome.CONCURRENT, None
    fresh = Txn(txn.producer_id, txn.epoch + 1, TxnState.EMPTY, ())
    triple = Triple(txn_id, fresh.producer_id, fresh.epoch)
    return _put(coordinator, txn_id, fresh), Outcome.OK, triple


def produce(
    coordinator: Coordinator, triple: Triple, rows: tuple[Row, ...]
) -> tuple[Coordinator, Outcome]:
    """Produce `rows` in the transaction of `triple` (beginning it if none is open)."""
    txn = describe(coordinator, triple.txn_id)
    if txn is None or txn.producer_id != triple.producer_id:
        return coordinator, Outcome.UNKNOWN_PRODUCER
    if txn.epoch != triple.epoch:
        return coordinator, Outcome.FENCED
    if txn.state in PREPARING:
        return coordinator, Outcome.CONCURRENT
    held = txn.rows if txn.state is TxnState.ONGOING else ()
    ongoing = txn._replace(state=TxnState.ONGOING, rows=held + rows)
    return _put(coordinator, triple.txn_id, ongoing), Outcome.OK


def end_txn(coordinator: Coordinator, triple: Triple, commit: bool) -> tuple[Coordinator, Outcome]:
    """EndTxn(commit or abort) with the whole triple, as the sink's driver sends it."""
    txn = describe(coordinator, triple.txn_id)
    if txn is None or txn.producer_id != triple.producer_id:
        return coordinator, Outcome.UNKNOWN_PRODUCER
    if txn.epoch != triple.epoch:
        return coordinator, Outcome.FENCED
    wanted_prepare = TxnState.PREPARE_COMMIT if commit else TxnState.PREPARE_ABORT
    wanted_complete = TxnState.COMPLETE_COMMIT if commit else TxnState.COMPLETE_ABORT
    if txn.state is TxnState.ONGOING:
        return _put(coordinator, triple.txn_id, txn._replace(state=wanted_prepare)), Outcome.OK
    if txn.state is wanted_prepare:
        return coordinator, Outcome.CONCURRENT
    if txn.state is wanted_complete:
        return coordinator, Outcome.OK
    return coordinator, Outcome.INVALID_STATE


def write_markers(coordinator: Coordinator, txn_id: str) -> tuple[Coordinator, tuple[Row, ...]]:
    """Finish a preparing transaction; returns the rows that became visible (none on abort)."""
    txn = describe(coordinator, txn_id)
    assert txn is not None and txn.state in PREPARING
    if txn.state is TxnState.PREPARE_COMMIT:
        done = txn._replace(state=TxnState.COMPLETE_COMMIT, rows=())
        return _put(coordinator, txn_id, done), txn.rows
    return _put(coordinator, txn_id, txn._replace(state=TxnState.COMPLETE_ABORT, rows=())), ()


def time_out(coordinator: Coordinator, txn_id: str) -> tuple[Coordinator, Triple]:
    """The coordinator aborts an Ongoing transaction whose timeout passed; returns the triple
    of the transaction it aborted."""
    txn = describe(coordinator, txn_id)
    assert txn is not None and txn.state is TxnState.ONGOING
    aborted = Triple(txn_id, txn.producer_id, txn.epoch)
    bumped = txn._replace(epoch=txn.epoch + 1, state=TxnState.PREPARE_ABORT)
    return _put(coordinator, txn_id, bumped), aborted


def preparing_ids(coordinator: Coordinator) -> list[str]:
    """Ids whose markers the coordinator still has to write."""
    return [txn_id for txn_id, txn in coordinator if txn.state in PREPARING]


def ongoing_ids(coordinator: Coordinator) -> list[str]:
    """Ids with an open transaction (those the coordinator's timeout can abort)."""
    return [txn_id for txn_id, txn in coordinator if txn.state is TxnState.ONGOING]
