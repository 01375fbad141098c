"""Repair rounds (issue 26, `Config.repair`): a replay of a decided batch writes again the rows
of the partitions the brokers aborted.

- A completion records, besides settling its decision or repair, which of its participants the
  brokers aborted (`lost`): the roll-forward writes it only once every participant is committed
  or aborted, never while one is being committed.
- A run that starts a decided batch (Spark's replay) plans a repair when every level of the
  batch is settled and some partition's latest participant is recorded lost: the tasks of
  exactly those partitions write at the next level; every other task skips.
- commit() checks the repair's transactions are open, then puts `repair(batch, level)`
  put-if-absent; a refused put aborts its own transactions and rolls the winner's forward.
- A batch still holding a recorded loss when its run would record it in Spark's checkpoint
  fails instead, so that the next run replays it.
"""

from __future__ import annotations

from model.txn_model import commit_log as cl
from model.txn_model.commit_log import Entry, Kind, Participant
from model.txn_model.config import Config
from model.txn_model.coordinator import TxnState, held_in
from model.txn_model.state import Driver, Message, World

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


def not_open(world: World, driver: Driver) -> str | None:
    """The prepare check of the repair's transactions: a triple no longer open, or None."""
    for message in repairing(driver):
        assert message.triple is not None
        if not held_in(world.coordinator, message.triple, (TxnState.ONGOING,)):
            return str(message.triple)
    return None


def repair_entry(driver: Driver) -> Entry:
    """The repair record commit() puts."""
    parts = tuple(Participant(m.partition, m.triple) for m in repairing(driver) if m.triple)
    level = driver.repair[0]
    return Entry(Kind.REPAIR, driver.number, batch=driver.batch, participants=parts, level=level)


def not_done(world: World, config: Config, batch: int) -> str:
    """Why Spark may not record `batch` yet ('' when it may): a level of it is not settled
    (another run's repair may be under way), or a partition's latest participant is recorded
    lost. Only "every row committed" lets the batch through, never "no loss recorded"."""
    levels = [0, *cl.repairs(world.log, batch)]
    open_levels = [lv for lv in levels if cl.completion(world.log, batch, lv) is None]
    if open_levels and config.repair_flaw != "loss-recorded":
        return f"level {open_levels[0]} of batch {batch} is not settled"
    found = cl.unrepaired(world.log, batch)
    return f"batch {batch} has rows recorded lost (p{found[2]})" if found else ""
