"""Repair rounds (issue 26, `Config.repair`): a replay of a decided batch writes again the rows
of the partitions the brokers aborted.

- A completion records, besides settling its decision or repair, which of its participants the
  brokers aborted (`lost`): the roll-forward writes it only once every participant is committed
  or aborted, never while one is being committed.
- A run that starts a decided batch (Spark's replay) plans a repair when every level of the
  batch is settled and some partition's latest participant is recorded lost: the tasks of
  exactly those partitions write at the next level; every other task skips.
- commit() pairs each lost participant with a replayed task of the same digest (issue 39: the
  product matches by the records, as Spark may renumber partitions): a task without a pair is
  aborted, a lost participant without one is *refused*, lost for good. It checks the paired
  transactions are open, then puts `repair(batch, level)` put-if-absent, naming the new
  participants and the refused; a refused put aborts its own transactions and rolls the
  winner's forward.
- A batch still holding a recorded loss when its run would record it in Spark's checkpoint
  fails instead, so that the next run replays it. The run whose repair refused rows fails
  once too (commit() raises); the next run finds nothing waiting and goes on without them.
"""

from __future__ import annotations

from model.txn_model import commit_log as cl
from model.txn_model.commit_log import Entry, Kind, Participant
from model.txn_model.config import Config
from model.txn_model.coordinator import TxnState, end_txn, held_in
from model.txn_model.state import AttemptKind, Driver, Message, Task, World

COMMITTING = (TxnState.ONGOING, TxnState.PREPARE_COMMIT)


def plan(world: World, batch: int) -> tuple[int, tuple[int, ...]]:
    """(level, partitions) a run starting `batch` repairs; (0, ()) when nothing is to repair."""
    found = cl.unrepaired(world.log, batch)
    return (found[0], found[2]) if found else (0, ())


def repairing(driver: Driver) -> tuple[Message, ...]:
    """The messages of the tasks that wrote the driver's planned repair."""
    return tuple(m for m in driver.messages if m.partition in driver.repair[1])


def wants_repair(driver: Driver) -> bool:
    """Every task of the planned repair prepared its transaction (the progress transaction of
    `Config.offsets`, partition -1, is the driver's own and opens after this)."""
    mine = [m for m in repairing(driver) if m.partition >= 0]
    return bool(driver.repair[1]) and all(m.status == "prepared" for m in mine)


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


def digest(config: Config, batch: int, partition: int, order: int) -> tuple[int, ...]:
    """What a task's message says of the records it produced: which records (the batch and
    partition's rows: the same on every replay here), as a multiset whose order does not
    count (the product's), or with their order (flaw `ordered-digest`)."""
    ordered = config.repair_flaw == "ordered-digest"
    return (batch, partition, order) if ordered else (batch, partition)


def matched(
    world: World, config: Config, driver: Driver
) -> tuple[tuple[Message, ...], tuple[int, ...]]:
    """The replayed tasks' messages paired with a lost participant of the same digest (and the
    progress transaction, which the driver opened itself), and the lost partitions no task
    matched: refused (repair.py `match` in the product)."""
    level, lost = driver.repair
    latest = cl.latest_participants(world.log, driver.batch, level)
    free = [m for m in repairing(driver) if m.partition >= 0 and m.status == "prepared"]
    pairs = [m for m in repairing(driver) if m.partition < 0]
    refused = []
    for partition in (p for p in lost if p >= 0):
        was = latest[partition]
        wanted = digest(config, driver.batch, partition, was.order)
        found = [m for m in free if digest(config, driver.batch, m.partition, m.order) == wanted]
        if found:
            free.remove(found[0])
            pairs.append(found[0])
        else:
            refused.append(partition)
    return tuple(m for m in repairing(driver) if m in pairs), tuple(refused)


def unmatched(world: World, config: Config, driver: Driver) -> tuple[Message, ...]:
    """The replayed tasks' messages no lost participant took: commit() aborts them."""
    pairs = matched(world, config, driver)[0]
    return tuple(m for m in repairing(driver) if m not in pairs and m.triple is not None)


def abort(world: World, messages: tuple[Message, ...]) -> World:
    """EndTxn(abort) by exact triple of the transactions of `messages`."""
    coordinator = world.coordinator
    for message in messages:
        assert message.triple is not None
        coordinator, _ = end_txn(coordinator, message.triple, commit=False)
    return world._replace(coordinator=coordinator)


def not_open(world: World, config: Config, driver: Driver) -> str | None:
    """The prepare check of the repair's transactions: a triple no longer open, or None."""
    for message in matched(world, config, driver)[0]:
        assert message.triple is not None
        if not held_in(world.coordinator, message.triple, (TxnState.ONGOING,)):
            return str(message.triple)
    return None


def repair_entry(world: World, config: Config, driver: Driver) -> Entry:
    """The repair record commit() puts: the paired transactions, and the refused partitions."""
    pairs, refused = matched(world, config, driver)
    parts = tuple(Participant(m.partition, m.triple, m.order) for m in pairs if m.triple)
    level = driver.repair[0]
    entry = Entry(Kind.REPAIR, driver.number, batch=driver.batch, participants=parts, level=level)
    return entry._replace(refused=refused)


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
