"""The sink's commit log: records created put-if-absent and never changed.

Variant `current` uses it as the product does today: one decision record and one completion
record per batch, each written only if absent. Variant `owned` uses it as a put-if-absent
*sequence*: entry k is written only if no entry k exists, so appending is a compare-and-set on
the log's length, and every reader sees the same order. There, a run appends an owner entry
before anything else, and a decision counts only if the latest owner entry before it is its
writer's (so a decision appended after a newer run became owner is void). Variant `keyed`
keeps the tuple only as the set of records: each is put-if-absent under its own key (owner per
run number, decision and completion per batch, release per run), and its readers use no order
between records of different keys but the run numbers the records carry.
"""

from __future__ import annotations

from enum import Enum
from typing import NamedTuple

from model.txn_model.config import Variant
from model.txn_model.coordinator import Row, Triple


class Kind(str, Enum):
    """Kinds of log entries."""

    OWNER = "owner"  # owned: run R owns the sink from here on, with slot S
    DECISION = "decision"  # batch N commits exactly these participants: the commit point
    COMPLETION = "completion"  # every participant of batch N is settled
    RELEASE = "release"  # owned: run R stopped and its tasks are done; its slot is free
    ABORT = "abort"  # outcome register: round r of batch N decides nothing; N goes on at r + 1
    REPAIR = "repair"  # repair level r of batch N: new participants for partitions recorded lost


class Participant(NamedTuple):
    """One prepared transaction a decision commits."""

    partition: int
    triple: Triple
    order: int = 0  # the order its task produced the partition's rows in (`Config.reorder`)
    group: int = 0  # which rows its task had (`Config.regroup`): 0, the first computation's


class Entry(NamedTuple):
    """One record of the log (fields a kind does not use keep their defaults)."""

    kind: Kind
    run: int
    batch: int = -1
    slot: int = -1
    participants: tuple[Participant, ...] = ()
    round: int = 0  # decision and abort: the round of the batch's outcome key
    level: int = 0  # repair: its level (1, 2, ...); completion: the level it settles (0: decision)
    lost: tuple[int, ...] = ()  # completion (repairs): partitions whose transaction was aborted
    refused: tuple[int, ...] = ()  # repair: lost partitions no replayed task's digest matched
    replayed: tuple[tuple[Row, ...], ...] = ()
    """Repair, with `Config.regroup` only: the rows of each transaction the replay prepared.
    Not in the product's record: the oracle's evidence of which refusals were unavoidable."""

    def key(self) -> tuple[Kind, int, int, int]:
        """What put-if-absent keys on: decisions and aborts share (batch, round); repairs and
        completions key on (batch, level)."""
        if self.kind in (Kind.DECISION, Kind.ABORT):
            return (Kind.DECISION, self.batch, self.round, -1)
        if self.kind in (Kind.COMPLETION, Kind.REPAIR):
            return (self.kind, self.batch, self.level, -1)
        return (self.kind, -1, 0, self.run)

    def __str__(self) -> str:
        if self.kind is Kind.OWNER:
            return f"owner(run {self.run}, slot {self.slot})"
        if self.kind is Kind.RELEASE:
            return f"release(run {self.run})"
        level = f" level {self.level}" if self.level else ""
        if self.kind is Kind.COMPLETION:
            lost = f", lost p{', p'.join(map(str, self.lost))}" if self.lost else ""
            return f"completion(batch {self.batch}{level}{lost})"
        if self.kind is Kind.REPAIR:
            parts = ", ".join(str(p.triple) for p in self.participants) or "nothing"
            refused = f", refused p{', p'.join(map(str, self.refused))}" if self.refused else ""
            return f"repair(batch {self.batch}{level}, run {self.run}: {parts}{refused})"
        at = f" round {self.round}" if self.round else ""
        if self.kind is Kind.ABORT:
            return f"abort(batch {self.batch}{at}, run {self.run})"
        parts = ", ".join(str(p.triple) for p in self.participants)
        return f"decision(batch {self.batch}{at}, run {self.run}: {parts})"


Log = tuple[Entry, ...]


def txn_id(
    variant: Variant,
    slot: int,
    partition: int,
    scheme: str = "pool",
    batch: int = 0,
    attempt: int = 0,
) -> str:
    """The transactional id a task of `partition` uses (sink id `s`), by `Config.txn_ids`."""
    if variant is Variant.CURRENT:
        return f"s-{partition}"
    if scheme == "attempt":
        return f"s-{slot}-{partition}-{attempt}"
    if scheme == "unique":
        return f"s-{slot}-{partition}-{batch}-{attempt}"
    return f"s-{slot}-{partition}"


def slot_of(txn_id: str) -> int:
    """The slot an owned-variant id belongs to."""
    return int(txn_id.split("-")[1])


def latest_owner(log: Log, before: int | None = None) -> Entry | None:
    """The latest owner entry (among the first `before` entries, if given)."""
    for entry in reversed(log[:before]):
        if entry.kind is Kind.OWNER:
            return entry
    return None


def superseded_by(log: Log, run: int) -> int | None:
    """The run that took the sink over from `run`, if one did (owned, keyed)."""
    owner = latest_owner(log)
    return owner.run if owner is not None and owner.run != run else None


def outcome_rounds(log: Log, batch: int) -> dict[int, Entry]:
    """Keyed: round -> the decision or abort that holds that round of `batch`'s key."""
    rounds: dict[int, Entry] = {}
    for entry in log:
        if entry.kind in (Kind.DECISION, Kind.ABORT) and entry.batch == batch:
            rounds.setdefault(entry.round, entry)
    return rounds


def next_round(log: Log, batch: int) -> int:
    """Keyed: the lowest round of `batch` no record holds; a writer puts at exactly this one."""
    rounds = outcome_rounds(log, batch)
    found = 0
    while found in rounds:
        found += 1
    return found


def put_if_absent(log: Log, entry: Entry) -> tuple[Log, Entry]:
    """`entry` appended unless its key holds a record; returns the log and what holds the key."""
    for existing in log:
        if existing.key() == entry.key():
            return log, existing
    return (*log, entry), entry


def decisions(log: Log, variant: Variant) -> dict[int, Entry]:
    """The decision that counts for each decided batch.

    In `owned`, the first decision of a batch whose writer was the owner when it was appended;
    in `current` and `keyed` the first decision of the batch (the only one the log accepts);
    in `keyed` a batch's rounds are read in order, and an abort record moves on to the next.
    """
    found: dict[int, Entry] = {}
    if variant is Variant.KEYED:
        for batch in sorted({e.batch for e in log if e.kind is Kind.DECISION}):
            rounds, at = outcome_rounds(log, batch), 0
            while at in rounds and rounds[at].kind is Kind.ABORT:
                at += 1
            if at in rounds:
                found[batch] = rounds[at]
        return found
    for index, entry in enumerate(log):
        if entry.kind is not Kind.DECISION or entry.batch in found:
            continue
        if variant is Variant.OWNED:
            owner = latest_owner(log, index)
            if owner is None or owner.run != entry.run:
                continue
        found[entry.batch] = entry
    return found


def latest_decision(log: Log, variant: Variant) -> Entry | None:
    """The decision of the highest decided batch (the product's `latest_decision()`)."""
    decided = decisions(log, variant)
    return decided[max(decided)] if decided else None


def next_run(log: Log) -> int:
    """Keyed: the run number a new owner record takes, one past the highest recorded. Owner
    records are put-if-absent per number and each writer takes one past what it read, so the
    numbers are dense and in the order recorded."""
    latest = latest_owner(log)
    return latest.run + 1 if latest is not None else 0


def may_abort(log: Log, slot: int, mine: int) -> bool:
    """Keyed: whether a run holding slot `mine` may abort an open, undecided transaction of
    `slot`: its own slot's, yes; another's only when the latest decision's run is newer than
    that slot's last holder (runs.py `may_abort`). A repair counts as a decision of its batch,
    later than the decision and the lower levels."""
    if slot == mine:
        return True
    settled = settled_entries(log, Variant.KEYED)
    latest = settled[-1] if settled else None
    if latest is None:
        return False
    holder = slot_holder(log, slot)
    return (holder if holder is not None else -1) < latest.run


def completion(log: Log, batch: int, level: int = 0) -> Entry | None:
    """The completion of `batch`'s decision (level 0) or of its repair `level`."""
    for entry in log:
        if entry.kind is Kind.COMPLETION and (entry.batch, entry.level) == (batch, level):
            return entry
    return None


def repairs(log: Log, batch: int) -> dict[int, Entry]:
    """Level -> the repair of `batch` at that level (the first put; the key refuses others)."""
    return {e.level: e for e in log if e.kind is Kind.REPAIR and e.batch == batch}


def settled_entries(log: Log, variant: Variant) -> list[Entry]:
    """Every decision that counts, each followed by its batch's repairs by level."""
    found = []
    for batch, decision in sorted(decisions(log, variant).items()):
        found.append(decision)
        found += [r for _, r in sorted(repairs(log, batch).items())]
    return found


def incomplete(log: Log, variant: Variant) -> list[Entry]:
    """Decisions and repairs without their completion, in batch and level order: what
    roll-forward must finish."""
    return [e for e in settled_entries(log, variant) if completion(log, e.batch, e.level) is None]


def held(log: Log, variant: Variant) -> set[Triple]:
    """Triples no clean-up or abort may touch: those of incomplete decisions and repairs."""
    return {p.triple for d in incomplete(log, variant) for p in d.participants}


def decided_triples(log: Log, variant: Variant) -> set[Triple]:
    """Triples of every decision that counts and of every repair, complete or not."""
    return {p.triple for d in settled_entries(log, variant) for p in d.participants}


def unrepaired(log: Log, batch: int) -> tuple[int, int, tuple[int, ...]] | None:
    """`(next level, highest level, partitions)`: the partitions of `batch`'s highest level
    whose participant its completion records lost, and the level a repair of them takes; None
    when there are none, or while a level of the batch has no completion yet. Every repair takes
    or refuses each lost participant waiting when it was planned (all of them at the level
    below it: the levels below were settled then), so nothing below the highest level waits;
    a participant a repair refused is lost for good. (Keyed by partition, as the model was
    before issue 39, a repair whose task of another number holds the lost rows,
    `Config.regroup`, would leave the lost partition waiting.)"""
    levels = {0: decisions(log, Variant.KEYED).get(batch), **repairs(log, batch)}
    if levels[0] is None:
        return None
    if any(completion(log, batch, level) is None for level in levels):
        return None
    top = max(levels)
    done = completion(log, batch, top)
    assert done is not None
    return (top + 1, top, done.lost) if done.lost else None


def latest_participants(log: Log, batch: int, below: int) -> dict[int, Participant]:
    """Partition -> its participant at the highest level of `batch` below `below` naming it:
    what a repair at level `below` writes again."""
    levels = {0: decisions(log, Variant.KEYED).get(batch), **repairs(log, batch)}
    found: dict[int, Participant] = {}
    for level, entry in sorted(levels.items()):
        if entry is not None and level < below:
            found.update((p.partition, p) for p in entry.participants)
    return found


def choose_slot(log: Log, slots: int) -> int:
    """The slot a new run takes (owned): the lowest slot never used or whose last holder
    released it; else the slot whose last holder became owner longest ago (never the current
    owner's, since there are at least two slots)."""
    released = {entry.run for entry in log if entry.kind is Kind.RELEASE}
    holder_at: dict[int, tuple[int, int]] = {}  # slot -> (index of its last owner entry, run)
    for index, entry in enumerate(log):
        if entry.kind is Kind.OWNER:
            holder_at[entry.slot] = (index, entry.run)
    free = [s for s in range(slots) if s not in holder_at or holder_at[s][1] in released]
    if free:
        return min(free)
    return min(holder_at, key=lambda s: holder_at[s][0])


def slot_holder(log: Log, slot: int) -> int | None:
    """The run that last took `slot`, if any."""
    for entry in reversed(log):
        if entry.kind is Kind.OWNER and entry.slot == slot:
            return entry.run
    return None


def owner_index(log: Log, run: int) -> int | None:
    """Where `run`'s owner entry is in the log."""
    for index, entry in enumerate(log):
        if entry.kind is Kind.OWNER and entry.run == run:
            return index
    return None
