"""Proof of delivery for one task's records (issue 43, item 1), searched breadth-first.

One task produces `Bounds.records` records (record i to partition i mod `partitions`) into one
open transaction, flushes, decides whether it is prepared, and the driver commits. librdkafka
may fail a record silently for the transaction (F1-F3: a report with an error, if the record
has one; no epoch bump, the state stays InTransaction), while later records of its partition
are delivered. Rules: `delivery` (a commit holds every record produced), `probe` (once
prepared, the driver holds for each partition written an offset, and each offset it holds is a
record of this transaction) and `settles` (after `removals` records are compacted away, some
offset the driver holds still shows one). The first state that breaks one comes with a shortest
trace.

    python -m model.txn_model.delivery
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, replace
from enum import Enum


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
    count: str | None  # per partition: None, "acked" (hypothetical) or "txmsgs" (statistics)
    offsets: str  # "reports", "describe" (DescribeProducers), "describe+count", "none"
    summary: str


DESIGNS = {
    d.name: d
    for d in (
        Design("D0", "all", None, "reports", "a report per record (today)"),
        Design("D1", "first-last", None, "reports", "reports on each partition's first+last"),
        Design("D1-last", "last", None, "reports", "a report on each partition's last only"),
        Design("D2", "first-last", "acked", "reports", "D1 + a count of acked records (none)"),
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
    used: tuple[int, int, int, int, int] = (0, 0, 0, 0, 0)  # the Bounds' faults, in order


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


def _due(s: State, d: Design, b: Bounds) -> list[int]:
    done = (At.WRITTEN, At.FAILED)
    return [
        r
        for r, at in enumerate(s.at)
        if at in done and not s.reported[r] and _reports_on(d, b, r, at is At.WRITTEN)
    ]


def _set(values: tuple, changes: dict[int, object]) -> tuple:  # type: ignore[type-arg]
    return tuple(changes.get(i, v) for i, v in enumerate(values))


def _use(s: State, fault: int) -> tuple[int, int, int, int, int]:
    u = list(s.used)
    u[fault] += 1
    return (u[0], u[1], u[2], u[3], u[4])


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
    if s.phase is Phase.COMMITTED and s.used[4]:
        held = [s.log[p][o] for p, offs in enumerate(s.handed) for o in offs if o < len(s.log[p])]
        if not any(who.startswith("r") for who in held):
            return "settles: every record at the offsets the driver holds is gone"
    return None


def successors(s: State, d: Design, b: Bounds) -> Iterator[tuple[str, State]]:
    """Every step enabled in `s`, labelled."""
    queued = {p: [r for r in range(b.records) if s.at[r] is At.QUEUED and r % b.partitions == p]
              for p in range(b.partitions)}  # fmt: skip
    if s.phase is Phase.PRODUCING:
        if At.NEW in s.at:  # the task produces its records in order
            r = s.at.index(At.NEW)
            where, how = (At.QUEUED, "") if s.metadata else (At.UNASSIGNED, " (no metadata yet)")
            yield f"produce {_name(r)} to p{r % b.partitions}{how}", replace(s, at=_set(s.at, {r: where}))
        for r in _due(s, d, b):
            how = f"success at p{r % b.partitions}@{_offset(s, b, r)}" if s.at[r] is At.WRITTEN else "error"
            yield f"poll: report of {_name(r)}, {how}", replace(s, reported=_set(s.reported, {r: True}))
        if all(at in (At.WRITTEN, At.FAILED) for at in s.at):
            served = "".join(f" {_name(r)}" for r in _due(s, d, b))
            done = replace(s, reported=_set(s.reported, dict.fromkeys(_due(s, d, b), True)))
            yield f"flush() returns 0{', serving the reports of' + served if served else ''}", replace(done, phase=Phase.FLUSHED)
        if not s.metadata:
            moved = {r: At.QUEUED for r, at in enumerate(s.at) if at is At.UNASSIGNED}
            yield "the topic's metadata arrives", replace(s, metadata=True, at=_set(s.at, moved))
            if moved and s.used[0] < b.failures:
                r = min(moved)
                yield f"F1: {_name(r)} times out on the unassigned queue", replace(s, at=_set(s.at, {r: At.FAILED}), used=_use(s, 0))
        for p in range(b.partitions):
            if s.leaderless[p]:
                yield f"p{p}'s leader is back", replace(s, leaderless=_set(s.leaderless, {p: False}))
            elif s.metadata and s.used[1] < b.leader_losses:
                yield f"p{p} loses its leader", replace(s, leaderless=_set(s.leaderless, {p: True}), used=_use(s, 1))
            if s.used[3] < b.foreign:
                yield f"another producer writes p{p}@{len(s.log[p])}", replace(s, log=_set(s.log, {p: (*s.log[p], "other")}), used=_use(s, 3))
            if not queued[p]:
                continue
            if s.leaderless[p] and s.used[0] < b.failures:
                r = queued[p][0]
                yield f"F2: {_name(r)} times out, p{p} has no leader", replace(s, at=_set(s.at, {r: At.FAILED}), used=_use(s, 0))
            if s.used[0] < b.failures:
                names = ", ".join(map(_name, queued[p]))
                yield f"F3: p{p} leaves the metadata and comes back; {names} fail", replace(s, at=_set(s.at, dict.fromkeys(queued[p], At.FAILED)), used=_use(s, 0))
            if not s.leaderless[p]:
                log = (*s.log[p], *map(_name, queued[p]))
                sent = replace(s, at=_set(s.at, dict.fromkeys(queued[p], At.WRITTEN)), log=_set(s.log, {p: log}))
                where = f"p{p}@{len(s.log[p])}" + (f"-{len(log) - 1}" if len(queued[p]) > 1 else "")
                what = f"send {', '.join(map(_name, queued[p]))}: written at {where}"
                yield what, replace(sent, sends=_set(s.sends, {p: s.sends[p] + len(queued[p])}))
                if s.used[2] < b.retries:
                    twice = _set(s.sends, {p: s.sends[p] + 2 * len(queued[p])})
                    yield f"{what}, answer lost, sent again (deduplicated)", replace(sent, sends=twice, used=_use(s, 2))
    elif s.phase is Phase.FLUSHED:
        why = _decide(s, d, b)
        if why is not None:
            yield f"prepare: refused ({why}), abort", replace(s, phase=Phase.REFUSED)
        else:
            handed = tuple(_handed(s, d, b, p) for p in range(b.partitions))
            shown = ", ".join(f"p{p} {list(o)}" for p, o in enumerate(handed))
            yield f"prepare: prepared, offsets {shown}", replace(s, phase=Phase.PREPARED, handed=handed)
    elif s.phase is Phase.PREPARED:
        yield "the driver commits (EndTxn)", replace(s, phase=Phase.COMMITTED)
    elif s.phase is Phase.COMMITTED and s.used[4] < b.removals:
        for p, log in enumerate(s.log):
            for o, who in enumerate(log):
                if who.startswith("r"):
                    gone = _set(s.log, {p: _set(log, {o: "gone"})})
                    yield f"compaction removes p{p}@{o} ({who})", replace(s, log=gone, used=_use(s, 4))


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


def shortest_counterexample(design: Design | str, bounds: Bounds | None = None) -> tuple[str, ...] | None:
    """A shortest trace to a broken rule, or None: `design` is safe within `bounds`."""
    result = search(design, bounds)
    return result.trace if result.violation is not None else None


def main() -> None:
    """Print each design's result, with its shortest counterexample, for a few bounds."""
    runs = [(Bounds(), list(DESIGNS)), (Bounds(records=5, partitions=2), list(DESIGNS)),
            (Bounds(removals=1), ["D0", "D3"]), (Bounds(records=4, partitions=2, removals=1), ["D0", "D3"])]  # fmt: skip
    for bounds, names in runs:
        print(f"\n{bounds}")
        for name in names:
            r = search(name, bounds)
            verdict = "OK" if r.violation is None else f"BROKEN {r.violation}"
            print(f"  {name:<10} {r.design.summary:<45} {r.states:>6} states  {verdict}")
            for i, step in enumerate(r.trace, 1):
                print(f"  {'':<10} {i:>2}. {step}")


if __name__ == "__main__":
    main()
