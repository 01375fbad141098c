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
    Abort,
    Completion,
    Decision,
    Outcome,
    Republish,
    parse_outcome,
)
from kafka_txn_sink.protocol.run_records import Owner, Release, SinkMeta

T = TypeVar("T")
# What the log holds. `_put` returns what holds the record's key: the same kind of record,
# but for an outcome key, which holds a decision or an abort (`Outcome`).
Record = SinkMeta | Decision | Abort | Completion | Republish | Owner | Release
R = TypeVar("R", SinkMeta, Completion, Republish, Owner, Release)


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

    def put_abort(self, abort: Abort) -> Outcome:
        """Put-if-absent at round `abort.round` of the batch's outcome key; returns what holds
        the key afterwards: `abort` (or an equal one), or the decision that got there first."""
        ...

    def decision(self, batch_id: int) -> Decision | None:
        """The decision of `batch_id`, or None if the batch was never decided."""
        ...

    def settled(self, batch_id: int) -> tuple[Decision | None, int]:
        """The decision of `batch_id` (None if undecided) and the round it holds, or else the
        round the next decision or abort of the batch is to be put at."""
        ...

    def outcome(self, batch_id: int, round_: int) -> Outcome | None:
        """What round `round_` of the batch's outcome key holds, or None."""
        ...

    def has_decision(self, batch_id: int) -> bool:
        """Whether `batch_id` is decided."""
        ...

    def put_completion(self, completion: Completion) -> Completion:
        """Put-if-absent; returns the marker that is in the log afterwards (an earlier one
        wins)."""
        ...

    def completion(self, batch_id: int, level: int = 0) -> Completion | None:
        """The completion marker of `batch_id` (of its repair `level`, if not 0), or None while
        that is not complete."""
        ...

    def put_repair(self, repair: Decision) -> Decision:
        """Put-if-absent per (batch, `repair.level`); returns the repair there afterwards
        (another run's, if it put that level first). A repair is a `Decision` at a level >= 1
        (protocol/repair.py)."""
        ...

    def repair(self, batch_id: int, level: int) -> Decision | None:
        """The repair of `batch_id` at `level` (>= 1), or None."""
        ...

    def repairs(self, batch_id: int) -> list[Decision]:
        """Every repair of `batch_id`, by level ascending (levels fill in order)."""
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

    def decisions(self, after: int | None = None) -> list[Decision]:
        """The decision of every decided batch above `after` (all when None or negative), by
        batch id ascending."""
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
    def _put(self, record: Record) -> Record | None:
        """Create `record` unless its key (kind, batch, round) holds one; None when we created
        it, else the record already there, parsed. Never overwrites."""

    @abstractmethod
    def outcome(self, batch_id: int, round_: int) -> Outcome | None:
        """What round `round_` of the batch's outcome key holds, or None."""

    @abstractmethod
    def _outcome_batches(self, after: int | None) -> list[int]:
        """The batch ids above `after` (all when None or negative) whose outcome key holds a
        record at round 0 (decided or aborted), ascending."""

    def decision(self, batch_id: int) -> Decision | None:
        """The decision of `batch_id`, or None if the batch was never decided."""
        return self.settled(batch_id)[0]

    def decisions(self, after: int | None = None) -> list[Decision]:
        """The decision of every decided batch above `after`, by batch id ascending."""
        found = (self.decision(b) for b in self._outcome_batches(after))
        return [d for d in found if d is not None]

    def decided_batches(self, after: int | None = None) -> list[int]:
        """Every decided batch id above `after`, ascending (each outcome key is read: a batch
        may hold only abort records)."""
        return [d.batch_id for d in self.decisions(after)]

    def _highest_decision(self, batches: list[int]) -> Decision | None:
        """The decision of the highest decided batch among `batches` (ascending)."""
        for batch_id in reversed(batches):
            found = self.decision(batch_id)
            if found is not None:
                return found
        return None

    def has_decision(self, batch_id: int) -> bool:
        """Whether `batch_id` is decided."""
        return self.decision(batch_id) is not None

    def settled(self, batch_id: int) -> tuple[Decision | None, int]:
        """The decision of `batch_id` and its round, or (None, the first round no record
        holds). Rounds fill in order: a writer puts only at the first free round it read, and
        an abort record closes its round for good."""
        check_batch_id(batch_id)
        round_ = 0
        while True:
            found = self.outcome(batch_id, round_)
            if not isinstance(found, Abort):
                return found, round_
            round_ += 1

    def put_abort(self, abort: Abort) -> Outcome:
        """Close round `abort.round` of the batch, unless a decision got there first (returned)."""
        found = self._put(abort)
        if found is None:
            return abort
        return _outcome(found)

    @abstractmethod
    def _recent_decisions(self) -> list[Decision]:
        """The decisions of the batches less than `recent` below the latest decided one, the
        latest included (none for a log without decisions)."""

    def create(self, meta: SinkMeta) -> SinkMeta:
        """Claim the log for `meta.sink_id`, or return the claim already there if it is ours."""
        found = self._put_same_kind(meta)
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
        holder = None if found is None else _outcome(found)
        if isinstance(holder, Abort):
            raise CommitLogConflictError(
                f"round {decision.round} of batch {decision.batch_id} was closed by an abort "
                f"record in {self.uri} (run {holder.run}); nothing was overwritten"
            )
        if holder is not None and not holder.same_decision(decision):
            raise CommitLogConflictError(
                f"batch {decision.batch_id} already has a different decision in {self.uri}: "
                f"recorded by query {holder.query_id} with {len(holder.participants)} "
                f"participant(s) of {holder.tasks} task(s), {holder.rows} row(s); ours is "
                f"query {decision.query_id} with {len(decision.participants)} participant(s) of "
                f"{decision.tasks} task(s), {decision.rows} row(s); nothing was overwritten"
            )

    def put_completion(self, completion: Completion) -> Completion:
        """Mark the batch complete; if it already is, the marker already there wins."""
        return self._put_same_kind(completion)

    def put_repair(self, repair: Decision) -> Decision:
        """Record a repair level; if the level is recorded already, that repair wins."""
        if repair.level < 1:
            raise CommitLogError(f"a repair has a level of 1 or more, got {repair.level}")
        found = self._put(repair)
        if found is None:
            return repair
        if not isinstance(found, Decision) or found.level != repair.level:
            raise CommitLogError(f"{self.uri} holds a {type(found).__name__} at {repair}'s key")
        return found

    @abstractmethod
    def repair(self, batch_id: int, level: int) -> Decision | None:
        """The repair of `batch_id` at `level`, or None."""

    def repairs(self, batch_id: int) -> list[Decision]:
        """Every repair of `batch_id`, by level ascending: read until the first missing level."""
        found: list[Decision] = []
        while (repair := self.repair(batch_id, len(found) + 1)) is not None:
            found.append(repair)
        return found

    def put_republish(self, republish: Republish) -> Republish:
        """Record a republish round; if the round is recorded already, that record wins."""
        return self._put_same_kind(republish)

    def put_owner(self, owner: Owner) -> Owner:
        """Record run `owner.run`; if that number is taken, the record already there wins."""
        return self._put_same_kind(owner)

    def put_release(self, release: Release) -> Release:
        """Record that a run released its slot; a release already there wins."""
        return self._put_same_kind(release)

    def _put_same_kind(self, record: R) -> R:
        found = self._put(record)
        if found is None:
            return record
        if not isinstance(found, type(record)):
            raise CommitLogError(f"{self.uri} holds a {type(found).__name__} at {record}'s key")
        return found

    def max_partition_count(self) -> int:
        """How many transactional ids recent batches used: the bound for an id-by-id clean-up."""
        return max((partition_count(d) for d in self._recent_decisions()), default=0)


def parser_of(record: Record) -> Callable[[bytes], Record]:
    """How to parse what holds `record`'s key: an outcome key holds a decision or an abort."""
    return parse_outcome if isinstance(record, Decision | Abort) else type(record).from_json


def _outcome(found: Record) -> Outcome:
    if not isinstance(found, Decision | Abort):
        raise CommitLogError(f"an outcome key holds a {type(found).__name__}")
    return found


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
