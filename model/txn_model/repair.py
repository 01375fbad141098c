"""Repair rounds (issue 26, `Config.repair`): a replay of a decided batch writes again the rows
of the partitions the brokers aborted.

- A completion records, besides settling its decision or repair, which of its participants the
  brokers aborted (`lost`): the roll-forward writes it only once every participant is committed
  or aborted, never while one is being committed.
- A run that starts a decided batch (Spark's replay) plans a repair when every level of the
  batch is settled and some participant of its highest level is recorded lost: the tasks of
  exactly those partitions write at the next level; every other task skips (with
  `Config.regroup`, every task of a replay that assigns the rows to tasks otherwise writes).
- commit() pairs each lost participant with a replayed task of the same digest (issue 39: the
  product matches by the records, as Spark may renumber partitions). With `Config.regroup`
  (rows that move between tasks on a replay), the lost participants left without a pair then
  take every replayed task left without one, together, when their digests together are equal
  (the product's digest is additive). A task without a pair is aborted, a lost participant
  without one is *refused*, lost for good. It checks the taken transactions are open, then puts
  `repair(batch, level)` put-if-absent, naming the new participants and the refused; a refused
  put aborts its own transactions and rolls the winner's forward.
- A batch still holding a recorded loss when its run would record it in Spark's checkpoint
  fails instead, so that the next run replays it. The run whose repair refused rows fails
  once too (commit() raises); the next run finds nothing waiting and goes on without them.
"""

from __future__ import annotations

from collections import Counter
from typing import NamedTuple

from model.txn_model import commit_log as cl
from model.txn_model.commit_log import Entry, Kind, Participant
from model.txn_model.config import Config
from model.txn_model.coordinator import Row, TxnState, end_txn, held_in
from model.txn_model.state import AttemptKind, Driver, Message, Task, World

COMMITTING = (TxnState.ONGOING, TxnState.PREPARE_COMMIT)

GROUPS = (
    "the first computation's rows",
    "renumbered: task p has partition p + 1's rows",
    "rows dealt round-robin from another start: they move between tasks",
    "every row in task 0, none in the others",
)
"""How a replay assigns the batch's rows to its tasks (`Config.regroup`): 0 as the query's
first computation; 1 the same groups under other task numbers (Spark numbering a replay's
partitions otherwise); 2 the batch's rows dealt one by one to the tasks in turn, as Spark's
round-robin `repartition(n)` does from a start that depends on the map task's number, so that
each task has rows of every first partition; 3 every row in one task (a task without rows
prepares no transaction: the product's `empty`)."""


def rows_per_partition(config: Config) -> int:
    """Rows of each partition in the first computation: one (standing for all of them), or two
    with `Config.regroup`, so that a replay can split a partition's rows."""
    return 2 if config.regroup else 1


def batch_rows(config: Config, batch: int) -> tuple[Row, ...]:
    """Every row of `batch`, partition by partition, in the first computation's order."""
    per = rows_per_partition(config)
    return tuple((batch, p, i) for p in range(config.partitions) for i in range(per))


def rows_of(config: Config, batch: int, partition: int, group: int) -> tuple[Row, ...]:
    """The rows the task of `partition` writes under `GROUPS[group]` (for the progress
    participant, partition -1 of `Config.offsets`, the offsets' one row)."""
    if partition < 0:
        return ((batch, partition, 0),)
    if group == 0:
        return tuple((batch, partition, i) for i in range(rows_per_partition(config)))
    if group == 1:
        return rows_of(config, batch, (partition + 1) % config.partitions, 0)
    every = batch_rows(config, batch)
    if group == 2:
        return every[partition :: config.partitions]
    return every if partition == 0 else ()


def plan(world: World, batch: int) -> tuple[int, tuple[int, ...]]:
    """(level, partitions) a run starting `batch` repairs; (0, ()) when nothing is to repair."""
    found = cl.unrepaired(world.log, batch)
    return (found[0], found[2]) if found else (0, ())


def show(rows: tuple[Row, ...]) -> str:
    """Rows for a trace: `p0.1` is row 1 of the first computation's partition 0."""
    return "rows " + ", ".join(f"p{p}.{i}" for _, p, i in rows)


def repairing(config: Config, driver: Driver) -> tuple[Message, ...]:
    """The messages of the tasks that wrote the driver's planned repair. Every task of a replay
    that assigned the rows otherwise (`Config.regroup`) writes, as every task of the product's
    replays does; a replay with the first computation's rows keeps the model's economy: only
    the tasks of the lost partitions write (the others' records could match no lost
    participant, and the product aborts them)."""
    every = bool(driver.repair[1]) and any(m.group for m in driver.messages)
    return tuple(
        m
        for m in driver.messages
        if m.partition in driver.repair[1] or (every and m.partition >= 0)
    )


def wants_repair(config: Config, driver: Driver) -> bool:
    """Every task of the planned repair prepared its transaction, or had no rows (the progress
    transaction of `Config.offsets`, partition -1, is the driver's own and opens after this)."""
    mine = [m for m in repairing(config, driver) if m.partition >= 0]
    return bool(driver.repair[1]) and all(m.status in ("prepared", "empty") for m in mine)


def regrouped(world: World, config: Config, lost: tuple[int, ...]) -> World | None:
    """`world` with one more replay assigning the batch's rows to tasks otherwise
    (`Config.regroup`), if a launch that plans a repair of `lost` may: while the budget
    lasts. The launch then tries each of `GROUPS` but the first."""
    if not lost or world.used.regroups >= config.regroup:
        return None
    return world._replace(used=world.used._replace(regroups=world.used.regroups + 1))


def settle(world: World, config: Config, entry: Entry) -> Entry | None:
    """The completion of `entry` once every participant is committed or aborted (the fate
    probe's answer); None while one is still being committed (flaw `in-doubt`: lost then)."""
    lost = []
    visible = {triple for _, triple in world.visible}
    waits = (TxnState.ONGOING,) if config.repair_flaw == "in-doubt" else COMMITTING
    for participant in entry.participants:
        if participant.triple in visible:
            continue
        if held_in(world.coordinator, participant.triple, waits):
            return None
        lost.append(participant.partition)
    return Entry(Kind.COMPLETION, -1, batch=entry.batch, level=entry.level, lost=tuple(lost))


def reordered(world: World, config: Config, task: Task) -> World | None:
    """`world` with one more attempt producing its rows in another order (`Config.reorder`),
    if `task` may: an attempt whose message the driver uses, while the budget lasts."""
    if task.kind is not AttemptKind.PRIMARY or world.used.reorders >= config.reorder:
        return None
    return world._replace(used=world.used._replace(reorders=world.used.reorders + 1))


Digest = tuple[object, ...]


def digest(config: Config, rows: tuple[Row, ...], order: int) -> Digest:
    """What a task's message says of the records it produced: which records, as a multiset
    whose order does not count (the product's), or with their order (flaw `ordered-digest`)."""
    ordered = config.repair_flaw == "ordered-digest"
    return (tuple(sorted(rows)), order) if ordered else (tuple(sorted(rows)),)


class Match(NamedTuple):
    """What a repair takes of its replay (repair.py `match` in the product)."""

    tasks: tuple[Message, ...]  # the replayed transactions it commits (and the progress one)
    refused: tuple[int, ...]  # the lost partitions no replayed records matched
    together: tuple[Message, ...] = ()  # of `tasks`, those taken together by the union rule
    lost_together: tuple[int, ...] = ()  # the lost partitions they stand for


def _union_takes(config: Config, lost: Counter[Row], free: Counter[Row]) -> bool:
    """Whether the replayed tasks left take the lost participants left, together: their
    records together are the same (the product's additive digest); flaw `per-task-only`: never;
    `union-partial`: when they include the lost ones'. A digest with the order in it
    (`ordered-digest`) does not add up, so it never takes them together."""
    if not config.regroup or not lost or not free:
        return False
    if config.repair_flaw in ("per-task-only", "ordered-digest"):
        return False
    if config.repair_flaw == "union-partial":
        return all(free[row] >= count for row, count in lost.items())
    return lost == free


def matched(world: World, config: Config, driver: Driver) -> Match:
    """Pair each lost participant with a replayed task of the same digest (the progress
    transaction, which the driver opened itself, goes along); then, with `Config.regroup`, take
    every replayed task left for every lost participant left when their digests together are
    equal; the lost partitions left are refused."""
    level, lost = driver.repair
    latest = cl.latest_participants(world.log, driver.batch, level)
    mine = repairing(config, driver)
    free = [m for m in mine if m.partition >= 0 and m.status == "prepared"]
    pairs = [m for m in mine if m.partition < 0]
    refused = []
    for partition in (p for p in lost if p >= 0):
        was = latest[partition]
        wanted = digest(config, _rows(config, driver.batch, was), was.order)
        found = [
            m for m in free if digest(config, _rows(config, driver.batch, m), m.order) == wanted
        ]
        if found:
            free.remove(found[0])
            pairs.append(found[0])
        else:
            refused.append(partition)
    rest = Counter(r for p in refused for r in _rows(config, driver.batch, latest[p]))
    left = Counter(r for m in free for r in _rows(config, driver.batch, m))
    if _union_takes(config, rest, left):
        taken = tuple(m for m in mine if m in (*pairs, *free))
        return Match(taken, (), tuple(free), tuple(refused))
    return Match(tuple(m for m in mine if m in pairs), tuple(refused))


def _rows(config: Config, batch: int, holder: Message | Participant) -> tuple[Row, ...]:
    """The rows a replayed task's message or a lost participant stands for."""
    return rows_of(config, batch, holder.partition, holder.group)


def unmatched(world: World, config: Config, driver: Driver) -> tuple[Message, ...]:
    """The replayed tasks' messages no lost participant took: commit() aborts them."""
    taken = matched(world, config, driver).tasks
    return tuple(m for m in repairing(config, driver) if m not in taken and m.triple is not None)


def abort(world: World, messages: tuple[Message, ...]) -> World:
    """EndTxn(abort) by exact triple of the transactions of `messages`."""
    coordinator = world.coordinator
    for message in messages:
        assert message.triple is not None
        coordinator, _ = end_txn(coordinator, message.triple, commit=False)
    return world._replace(coordinator=coordinator)


def not_open(world: World, config: Config, driver: Driver) -> str | None:
    """The prepare check of the repair's transactions: a triple no longer open, or None."""
    for message in matched(world, config, driver).tasks:
        assert message.triple is not None
        if not held_in(world.coordinator, message.triple, (TxnState.ONGOING,)):
            return str(message.triple)
    return None


def repair_entry(world: World, config: Config, driver: Driver) -> Entry:
    """The repair record commit() puts: the transactions taken, and the refused partitions
    (with `Config.regroup`, also the rows of every transaction the replay prepared, for the
    oracle alone)."""
    found = matched(world, config, driver)
    parts = tuple(
        Participant(m.partition, m.triple, m.order, m.group) for m in found.tasks if m.triple
    )
    level = driver.repair[0]
    entry = Entry(Kind.REPAIR, driver.number, batch=driver.batch, participants=parts, level=level)
    entry = entry._replace(refused=found.refused)
    if not config.regroup:
        return entry
    prepared = [m for m in repairing(config, driver) if m.partition >= 0 and m.triple]
    return entry._replace(replayed=tuple(_rows(config, driver.batch, m) for m in prepared))


def _lost_rows(world: World, config: Config, entry: Entry) -> list[tuple[Row, ...]]:
    """The rows of each lost participant (but the progress one) the repair `entry` stood for:
    those its level's completion below records lost (every lost one waits at the level just
    below a repair: a repair takes or refuses every one of them)."""
    latest = cl.latest_participants(world.log, entry.batch, entry.level)
    done = cl.completion(world.log, entry.batch, entry.level - 1)
    assert done is not None
    return [_rows(config, entry.batch, latest[p]) for p in done.lost if p >= 0]


def took_together(world: World, config: Config, entry: Entry) -> bool:
    """Whether the repair `entry` took some replayed transaction for several lost participants
    together (its rows are not one lost participant's): for the CLI's counts."""
    lost = {tuple(sorted(rows)) for rows in _lost_rows(world, config, entry)}
    return any(
        tuple(sorted(_rows(config, entry.batch, p))) not in lost
        for p in entry.participants
        if p.partition >= 0
    )


def excused(world: World, config: Config) -> set[Row]:
    """Rows a repair refused that no set of its replay's transactions held exactly, nor with
    other lost rows only: committing any of them would have written a row twice (a partial
    loss whose rows moved between tasks). The product refuses them and reports them lost for
    good; the oracle accepts that, and no other refusal (`Config.regroup` only)."""
    rows: set[Row] = set()
    for batch in range(config.batches):
        levels = cl.repairs(world.log, batch)
        for level, entry in levels.items():
            if not entry.refused:
                continue
            latest = cl.latest_participants(world.log, batch, level)
            lost = {r for rows in _lost_rows(world, config, entry) for r in rows}
            could = {r for held in entry.replayed if set(held) <= lost for r in held}
            refused = {r for p in entry.refused for r in _rows(config, batch, latest[p])}
            rows |= refused - could
    return rows


def not_done(world: World, config: Config, driver: Driver) -> str:
    """Why Spark may not record the driver's batch yet ('' when it may): a level of it is not
    settled (another run's repair may be under way), or a partition's latest participant is
    recorded lost. Only "every row committed" lets the batch through, never "no loss
    recorded". A run whose own repair refused rows raises once (they stay lost)."""
    batch = driver.batch
    levels = [0, *cl.repairs(world.log, batch)]
    open_levels = [lv for lv in levels if cl.completion(world.log, batch, lv) is None]
    if open_levels and config.repair_flaw != "loss-recorded":
        return f"level {open_levels[0]} of batch {batch} is not settled"
    found = cl.unrepaired(world.log, batch)
    if found:
        return f"batch {batch} has rows recorded lost (p{found[2]})"
    mine = cl.repairs(world.log, batch).get(driver.repair[0]) if driver.repair[0] else None
    if mine is not None and mine.run == driver.number and mine.refused:
        refused = ", ".join(f"p{p}" for p in mine.refused)
        return f"its repair refused {refused}: rows lost for good, commit() raises once"
    return ""
