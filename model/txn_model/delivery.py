"""Proof of delivery for one task's records (issue 43, item 1), searched breadth-first.

One task produces `Bounds.records` records (record i to partition i mod `partitions`) into one
open transaction, flushes, decides whether it is prepared, and the driver commits. librdkafka
may fail a record without failing the transaction (F1-F3: only its report, if it has one, shows
it), while later records of its partition are written. Rules: `delivery` (a commit holds every
record produced), `probe` (once prepared, the driver holds an offset for each partition written,
each one a record of this transaction) and `settles` (after `removals` records are compacted
away, an offset the driver holds still shows one). A broken rule comes with a shortest trace.
Designs are in `DESIGNS`; docs/plans/delivery_proof.md has the results.

    python -m model.txn_model.delivery
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, replace
from enum import Enum
from typing import Any, TypeVar

T = TypeVar("T")


class At(Enum):
    """Where a record is."""

    NEW = "not produced"
    UNASSIGNED = "unassigned queue"
    QUEUED = "partition queue"
    WRITTEN = "written"
    FAILED = "failed"


class Phase(Enum):
    """The task's and the driver's progress."""

    PRODUCING = 0
    FLUSHED = 1
    PREPARED = 2
    REFUSED = 3
    COMMITTED = 4


@dataclass(frozen=True)
class Design:
    """A proof of delivery: which reports exist, an optional count, where offsets come from."""

    name: str
    reports: str  # "all", "first-last", "last" (success and error) or "errors" (errors only)
    count: str | None  # per partition: None, "acked" (next_ack_seq) or "txmsgs" (statistics)
    offsets: str  # "reports", "describe" (DescribeProducers), "describe+count", "none"
    summary: str


DESIGNS = {
    d.name: d
    for d in (
        Design("D0", "all", None, "reports", "a report per record (today)"),
        Design("D1", "first-last", None, "reports", "reports on each partition's first+last"),
        Design("D1-last", "last", None, "reports", "a report on each partition's last only"),
        Design("D2", "first-last", "acked", "reports", "D1 + acked counts (next_ack_seq)"),
        Design("D2-txmsgs", "first-last", "txmsgs", "reports", "D1 + statistics' txmsgs"),
        Design("D3", "errors", None, "describe", "failure-only reports + DescribeProducers"),
        Design("D3-bare", "errors", None, "none", "failure-only reports, no offsets"),
        Design("D3-guess", "errors", None, "describe+count", "D3, last = start + count - 1"),
    )
}


@dataclass(frozen=True)
class Bounds:
    """The task's records and partitions, and how many of each fault may happen."""

    records: int = 3
    partitions: int = 1
    failures: int = 1  # F1, F2 or F3 events
    leader_losses: int = 1
    retries: int = 1  # a produce answer lost and the batch sent again (deduplicated)
    foreign: int = 1  # another producer's records between this task's
    removals: int = 0  # records of the committed transaction compacted away
    # F2/F3 may fail a record after its partition's first write. False: only before it, as
    # librdkafka's sequence numbers allow (a later gap is refused: OUT_OF_ORDER_SEQUENCE_NUMBER).
    holes: bool = True


@dataclass(frozen=True)
class State:
    """One state of the task, its producer, the partitions' logs and the driver."""

    at: tuple[At, ...]
    reported: tuple[bool, ...]  # the record's report reached the task
    log: tuple[tuple[str, ...], ...]  # per partition: "r1".., "other" or "gone", by offset
    sends: tuple[int, ...]  # per partition: records transmitted, retries included
    leaderless: tuple[bool, ...]
    metadata: bool = False
    phase: Phase = Phase.PRODUCING
    handed: tuple[tuple[int, ...], ...] = ()  # per partition: offsets given to the driver
    used: Bounds = Bounds(0, 0, 0, 0, 0, 0, 0, False)  # the faults that happened so far


@dataclass
class Result:
    """What one search found: the states visited and, if a rule broke, why and how."""

    design: Design
    bounds: Bounds
    states: int = 0
    violation: str | None = None
    trace: tuple[str, ...] = ()


def _name(r: int) -> str:
    return f"r{r + 1}"


def _mine(b: Bounds, p: int) -> list[int]:
    return [r for r in range(b.records) if r % b.partitions == p]


def _reports_on(d: Design, b: Bounds, r: int, ok: bool) -> bool:
    """Whether record r's report (a success if `ok`) reaches the task under `d`."""
    if d.reports in ("all", "errors"):
        return d.reports == "all" or not ok
    mine = _mine(b, r % b.partitions)
    return r in ({mine[-1]} if d.reports == "last" else {mine[0], mine[-1]})


def _offset(s: State, b: Bounds, r: int) -> int:
    return s.log[r % b.partitions].index(_name(r))


def _set(values: tuple[T, ...], changes: Mapping[int, T]) -> tuple[T, ...]:
    return tuple(changes.get(i, v) for i, v in enumerate(values))


def _left(s: State, b: Bounds, fault: str) -> bool:
    return bool(getattr(s.used, fault) < getattr(b, fault))


def _use(s: State, fault: str, **changes: Any) -> State:
    """`s` with `changes`, one more `fault` counted."""
    return replace(s, used=replace(s.used, **{fault: getattr(s.used, fault) + 1}), **changes)


def _fail(s: State, records: list[int]) -> State:
    return _use(s, "failures", at=_set(s.at, dict.fromkeys(records, At.FAILED)))


def _decide(s: State, d: Design, b: Bounds) -> str | None:
    """Why the task refuses to prepare, or None: it is prepared."""
    if any(s.reported[r] and at is At.FAILED for r, at in enumerate(s.at)):
        return "an error report"
    ok = [s.reported[r] and at is At.WRITTEN for r, at in enumerate(s.at)]
    for p in range(b.partitions):
        mine = _mine(b, p)
        if d.reports in ("all", "first-last") and mine and not ok[mine[0]]:
            return f"no success report of {_name(mine[0])}"
        if d.reports != "errors" and mine and not ok[mine[-1]]:
            return f"no success report of {_name(mine[-1])}"
        acked = sum(s.at[r] is At.WRITTEN for r in mine)
        if d.count and (acked if d.count == "acked" else s.sends[p]) != len(mine):
            return f"p{p}'s {d.count} count is not {len(mine)}"
    return None


def _handed(s: State, d: Design, b: Bounds, p: int) -> tuple[int, ...]:
    """The offsets of partition p that the task gives the driver for the fate probe."""
    if d.offsets == "reports":
        ok = [_offset(s, b, r) for r in _mine(b, p) if s.reported[r] and s.at[r] is At.WRITTEN]
        return tuple(sorted({min(ok), max(ok)})) if ok else ()
    own = [o for o, who in enumerate(s.log[p]) if who.startswith("r")]
    if d.offsets == "none" or not own:  # DescribeProducers: no open transaction there
        return ()
    start = min(own)  # DescribeProducers' CurrentTxnStartOffset of this producer
    return (start, start + len(_mine(b, p)) - 1) if d.offsets == "describe+count" else (start,)


def violation(s: State, b: Bounds) -> str | None:
    """The rule `s` breaks, or None."""
    if s.phase is Phase.COMMITTED and At.FAILED in s.at:
        missing = ", ".join(_name(r) for r, at in enumerate(s.at) if at is At.FAILED)
        return f"delivery: the driver committed without {missing}"
    if s.phase in (Phase.PREPARED, Phase.COMMITTED):
        for p, offsets in enumerate(s.handed):
            wrote = any(who.startswith("r") or who == "gone" for who in s.log[p])
            if wrote and not offsets:
                return f"probe: no offset of p{p}, which the transaction wrote"
            if any(s.log[p][o] == "other" for o in offsets if o < len(s.log[p])):
                return f"probe: an offset of p{p} the driver holds is another producer's"
    if s.phase is Phase.COMMITTED and s.used.removals:
        held = [s.log[p][o] for p, offs in enumerate(s.handed) for o in offs if o < len(s.log[p])]
        if not any(who.startswith("r") for who in held):
            return "settles: every record at the offsets the driver holds is gone"
    return None


def successors(s: State, d: Design, b: Bounds) -> Iterator[tuple[str, State]]:
    """Every step enabled in `s`, labelled."""
    if s.phase is Phase.PRODUCING:
        yield from _task_steps(s, d, b)
        yield from _producer_steps(s, b)
    elif s.phase is Phase.FLUSHED:
        why = _decide(s, d, b)
        if why is not None:
            yield f"prepare: refused ({why}), abort", replace(s, phase=Phase.REFUSED)
            return
        handed = tuple(_handed(s, d, b, p) for p in range(b.partitions))
        shown = ", ".join(f"p{p} {list(o)}" for p, o in enumerate(handed))
        yield f"prepare: prepared, offsets {shown}", replace(s, phase=Phase.PREPARED, handed=handed)
    elif s.phase is Phase.PREPARED:
        yield "the driver commits (EndTxn)", replace(s, phase=Phase.COMMITTED)
    elif s.phase is Phase.COMMITTED and _left(s, b, "removals"):
        for p, log in enumerate(s.log):
            for o, who in enumerate(log):
                if who.startswith("r"):
                    gone = _use(s, "removals", log=_set(s.log, {p: _set(log, {o: "gone"})}))
                    yield f"compaction removes p{p}@{o} ({who})", gone


def _task_steps(s: State, d: Design, b: Bounds) -> Iterator[tuple[str, State]]:
    """The task produces its records in order, serves reports, flushes."""
    if At.NEW in s.at:
        r = s.at.index(At.NEW)
        where, how = (At.QUEUED, "") if s.metadata else (At.UNASSIGNED, " (no metadata yet)")
        yield (
            f"produce {_name(r)} to p{r % b.partitions}{how}",
            replace(s, at=_set(s.at, {r: where})),
        )
    done = (At.WRITTEN, At.FAILED)
    due = [r for r, at in enumerate(s.at) if at in done and not s.reported[r]]
    due = [r for r in due if _reports_on(d, b, r, s.at[r] is At.WRITTEN)]
    for r in due:
        ok = s.at[r] is At.WRITTEN
        how = f"success at p{r % b.partitions}@{_offset(s, b, r)}" if ok else "error"
        yield f"poll: report of {_name(r)}, {how}", replace(s, reported=_set(s.reported, {r: True}))
    if all(at in done for at in s.at):
        served = f", serving the reports of {' '.join(map(_name, due))}" if due else ""
        reported = _set(s.reported, dict.fromkeys(due, True))
        yield f"flush() returns 0{served}", replace(s, reported=reported, phase=Phase.FLUSHED)


def _producer_steps(s: State, b: Bounds) -> Iterator[tuple[str, State]]:
    """librdkafka's and the cluster's steps: metadata, leaders, sends, F1-F3, other writers."""
    if not s.metadata:
        waiting = [r for r, at in enumerate(s.at) if at is At.UNASSIGNED]
        moved = _set(s.at, dict.fromkeys(waiting, At.QUEUED))
        yield "the topic's metadata arrives", replace(s, metadata=True, at=moved)
        if waiting and _left(s, b, "failures"):
            yield (
                f"F1: {_name(waiting[0])} times out on the unassigned queue",
                _fail(s, waiting[:1]),
            )
    for p in range(b.partitions):
        if s.leaderless[p]:
            yield f"p{p}'s leader is back", replace(s, leaderless=_set(s.leaderless, {p: False}))
        elif s.metadata and _left(s, b, "leader_losses"):
            lost = _use(s, "leader_losses", leaderless=_set(s.leaderless, {p: True}))
            yield f"p{p} loses its leader", lost
        if _left(s, b, "foreign"):
            other = _use(s, "foreign", log=_set(s.log, {p: (*s.log[p], "other")}))
            yield f"another producer writes p{p}@{len(s.log[p])}", other
        queued = [r for r, at in enumerate(s.at) if at is At.QUEUED and r % b.partitions == p]
        first_write = not any(s.at[r] is At.WRITTEN for r in _mine(b, p))
        if queued and _left(s, b, "failures") and (b.holes or first_write):
            if s.leaderless[p]:
                yield f"F2: {_name(queued[0])} times out, p{p} has no leader", _fail(s, queued[:1])
            names = ", ".join(map(_name, queued))
            verb = "fails" if len(queued) == 1 else "fail"
            yield f"F3: p{p} leaves the metadata and comes back; {names} {verb}", _fail(s, queued)
        if queued and not s.leaderless[p]:
            log = (*s.log[p], *map(_name, queued))
            at = f"p{p}@{len(s.log[p])}" + (f"-{len(log) - 1}" if len(queued) > 1 else "")
            sent = replace(s, at=_set(s.at, dict.fromkeys(queued, At.WRITTEN)))
            sent = replace(sent, log=_set(s.log, {p: log}))
            label = f"send {', '.join(map(_name, queued))}: written at {at}"
            yield label, replace(sent, sends=_set(s.sends, {p: s.sends[p] + len(queued)}))
            if _left(s, b, "retries"):
                again = _use(
                    sent, "retries", sends=_set(s.sends, {p: s.sends[p] + 2 * len(queued)})
                )
                yield f"{label}, answer lost, sent again (deduplicated)", again


def search(design: Design | str, bounds: Bounds | None = None) -> Result:
    """Visit every state of `design` within `bounds`, breadth-first, stopping at the first
    that breaks a rule (its trace is then a shortest one)."""
    d = DESIGNS[design] if isinstance(design, str) else design
    b = bounds or Bounds()
    n, parts = b.records, b.partitions
    start = State((At.NEW,) * n, (False,) * n, ((),) * parts, (0,) * parts, (False,) * parts)
    parents: dict[State, tuple[State | None, str]] = {start: (None, "")}
    queue, result = deque([start]), Result(d, b)
    while queue:
        s = queue.popleft()
        result.states += 1
        result.violation = violation(s, b)
        if result.violation is not None:
            steps: list[str] = []
            at: State | None = s
            while at is not None and parents[at][0] is not None:
                at, label = parents[at]
                steps.append(label)
            result.trace = tuple(reversed(steps))
            return result
        for label, after in successors(s, d, b):
            if after not in parents:
                parents[after] = (s, label)
                queue.append(after)
    return result


def shortest_counterexample(
    design: Design | str, bounds: Bounds | None = None
) -> tuple[str, ...] | None:
    """A shortest trace to a broken rule, or None: `design` is safe within `bounds`."""
    result = search(design, bounds)
    return result.trace if result.violation is not None else None


def main() -> None:
    """Print each design's result, with its shortest counterexample, for a few bounds."""
    both, d1 = ["D0", "D3"], ["D1", "D1-last", "D2-txmsgs"]
    runs = [(Bounds(), list(DESIGNS)), (Bounds(holes=False), d1), (Bounds(removals=1), both)]
    for bounds, names in [*runs, (Bounds(records=4, partitions=2, removals=1), both)]:
        print(f"\n{bounds}")
        for name in names:
            r = search(name, bounds)
            verdict = "OK" if r.violation is None else f"BROKEN {r.violation}"
            print(f"  {name:<10} {r.design.summary:<45} {r.states:>6} states  {verdict}")
            for i, step in enumerate(r.trace, 1):
                print(f"  {'':<10} {i:>2}. {step}")


if __name__ == "__main__":
    main()
