"""The commit log's contract (`CommitLog`), and the part of it both formats implement alike.

Every record is created put-if-absent and never overwritten: a decision is the commit point of
its batch, so a second, different decision for the same batch must be refused, while the same
decision written again (a retry of our own attempt) must succeed. `CommitLogBase` answers those
questions once, from one primitive each format provides (`_put`: create, or read back what is
there); `JsonCommitLog` and `DeltaCommitLog` differ only in how they store, list and find.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Protocol, TypeVar

from kafka_txn_sink.errors import CommitLogConflictError, CommitLogError
from kafka_txn_sink.protocol.messages import (
    Completion,
    Decision,
    Owner,
    Release,
    Republish,
    SinkMeta,
)

T = TypeVar("T")
# What the log holds; `_put` returns the same kind of record it is given.
Record = SinkMeta | Decision | Completion | Republish | Owner | Release
R = TypeVar("R", SinkMeta, Decision, Completion, Republish, Owner, Release)


class CommitLog(Protocol):
    """What the driver, the tasks and the tools need from a commit log, whatever its format.

    Errors: every method raises `CommitLogError` when the log cannot be read or written, or
    holds a record it cannot parse; a record it cannot parse is left as it is.
    """

    @property
    def uri(self) -> str:
        """Where the log lives (`file:///…` or `s3://bucket/prefix`), as messages name it."""
        ...

    def sink_meta(self) -> SinkMeta | None:
        """The claim `create` wrote, or None for a log no sink has claimed yet."""
        ...

    def create(self, meta: SinkMeta) -> SinkMeta:
        """Claim the log for `meta.sink_id`; returns the claim in the log afterwards (the first
        one, when this sink claimed it before).

        Raises:
            CommitLogError: the log belongs to another sink; nothing changed.
        """
        ...

    def put_decision(self, decision: Decision) -> None:
        """Put-if-absent; an identical existing decision (`Decision.same_decision`) is success
        and is kept as it is, a different one a conflict.

        Raises:
            CommitLogConflictError: a different decision exists for the batch; nothing changed.
            CommitLogError: the existing record is unreadable, or the batch id is negative;
                nothing changed.
        """
        ...

    def decision(self, batch_id: int) -> Decision | None:
        """The decision of `batch_id`, or None if the batch was never decided."""
        ...

    def has_decision(self, batch_id: int) -> bool:
        """Whether `batch_id` is decided, without reading the record."""
        ...

    def put_completion(self, completion: Completion) -> Completion:
        """Put-if-absent; returns the marker that is in the log afterwards (an earlier one
        wins)."""
        ...

    def completion(self, batch_id: int) -> Completion | None:
        """The completion marker of `batch_id`, or None while the batch is not complete."""
        ...

    def put_republish(self, republish: Republish) -> Republish:
        """Put-if-absent per (batch, round); returns the record that is in the log afterwards
        (an earlier one wins). A republish round decides nothing."""
        ...

    def republish(self, batch_id: int, round_: int) -> Republish | None:
        """Round `round_` of `batch_id`'s republishing, or None if it was not recorded."""
        ...

    def decided_batches(self, after: int | None = None) -> list[int]:
        """Every decided batch id above `after` (all of them when None or negative),
        ascending."""
        ...

    def latest_decision(self) -> Decision | None:
        """The decision of the highest decided batch, or None for a log without decisions."""
        ...

    def incomplete_batches(self) -> list[int]:
        """Decided batches without a completion marker, ascending.

        Batches complete in order, so a log may look only above the highest batch it knows to
        be complete (the JSON log's hint, the Delta log's highest completion).
        """
        ...

    def write_hint(self, batch_id: int) -> None:
        """Best effort, never raises: every batch up to `batch_id` is complete."""
        ...

    def max_partition_count(self) -> int:
        """Largest number of transactional ids used by recent batches (0 for an empty log):
        the bound of an id-by-id clean-up."""
        ...

    def put_owner(self, owner: Owner) -> Owner:
        """Put-if-absent per run number; returns the owner record there afterwards (another
        driver's, if it recorded that run number first)."""
        ...

    def owners(self) -> list[Owner]:
        """Every owner record, by run number ascending."""
        ...

    def latest_run(self) -> int | None:
        """The highest run number recorded, or None: cheaper than `owners()`."""
        ...

    def latest_owner(self) -> Owner | None:
        """The owner record of the highest run number, or None: cheaper than `owners()`."""
        ...

    def put_release(self, release: Release) -> Release:
        """Put-if-absent per run number; returns the record there afterwards."""
        ...

    def released_runs(self) -> set[int]:
        """The run numbers that recorded a release."""
        ...


class CommitLogBase(ABC):
    """The put-if-absent answers and the partition bound, shared by every format.

    A format provides `uri`, `recent`, `_put` and `_recent_decisions`, and the rest of
    `CommitLog`.
    """

    # How many of the latest decisions max_partition_count() reads.
    recent: int

    @property
    @abstractmethod
    def uri(self) -> str:
        """Where the log lives, as messages name it."""

    @abstractmethod
    def _put(self, record: R) -> R | None:
        """Create `record` unless its key (kind, batch, round) holds one; None when we created
        it, else the record already there, parsed. Never overwrites."""

    @abstractmethod
    def _recent_decisions(self) -> list[Decision]:
        """The decisions of the batches less than `recent` below the latest decided one, the
        latest included (none for a log without decisions)."""

    def create(self, meta: SinkMeta) -> SinkMeta:
        """Claim the log for `meta.sink_id`, or return the claim already there if it is ours."""
        existing = self._put(meta)
        found = meta if existing is None else existing
        if found.sink_id != meta.sink_id:
            raise CommitLogError(
                f"commit log {self.uri} belongs to sink {found.sink_id}, not {meta.sink_id}"
            )
        return found

    def put_decision(self, decision: Decision) -> None:
        """Record the decision; an identical one already there is our own earlier attempt.

        Raises:
            CommitLogConflictError: a different decision exists for the batch (kept as it is).
            CommitLogError: the existing record is empty or unreadable (kept as it is).
        """
        found = self._put(decision)
        if found is not None and not found.same_decision(decision):
            raise CommitLogConflictError(
                f"batch {decision.batch_id} already has a different decision in {self.uri}: "
                f"recorded by query {found.query_id} with {len(found.participants)} "
                f"participant(s) of {found.tasks} task(s), {found.rows} row(s); ours is "
                f"query {decision.query_id} with {len(decision.participants)} participant(s) of "
                f"{decision.tasks} task(s), {decision.rows} row(s); nothing was overwritten"
            )

    def put_completion(self, completion: Completion) -> Completion:
        """Mark the batch complete; if it already is, the marker already there wins."""
        found = self._put(completion)
        return completion if found is None else found

    def put_republish(self, republish: Republish) -> Republish:
        """Record a republish round; if the round is recorded already, that record wins."""
        found = self._put(republish)
        return republish if found is None else found

    def put_owner(self, owner: Owner) -> Owner:
        """Record run `owner.run`; if that number is taken, the record already there wins."""
        found = self._put(owner)
        return owner if found is None else found

    def put_release(self, release: Release) -> Release:
        """Record that a run released its slot; a release already there wins."""
        found = self._put(release)
        return release if found is None else found

    def max_partition_count(self) -> int:
        """How many transactional ids recent batches used: the bound for an id-by-id clean-up."""
        return max((partition_count(d) for d in self._recent_decisions()), default=0)


def partition_count(decision: Decision) -> int:
    """How many transactional ids the decision's batch may have used: its tasks, or more if a
    participant's partition is higher."""
    return max([decision.tasks, *(p.partition + 1 for p in decision.participants)])


def check_batch_id(batch_id: int) -> None:
    """Refuse a negative batch id, before it names or finds a record."""
    if batch_id < 0:
        raise CommitLogError(f"batch ids are not negative, got {batch_id}")


def check_round(round_: int) -> None:
    """Refuse a negative republish round, before it names or finds a record."""
    if round_ < 0:
        raise CommitLogError(f"republish rounds are not negative, got {round_}")


def parse_record(where: str, data: bytes, parse: Callable[[bytes], T]) -> T:
    """`parse(data)`; any parse failure becomes a CommitLogError naming `where`.

    Raises:
        CommitLogError: the record is malformed, of another kind or of a newer format version.
    """
    try:
        return parse(data)
    # records' version check lets ValueError/TypeError out for a malformed "version" field.
    except (CommitLogError, ValueError, TypeError) as exc:
        raise CommitLogError(f"{where}: {exc}; it is left as it is") from exc
