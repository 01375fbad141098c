"""Consumer-group progress committed with the output (issue 27, `Config.offsets`).

A batch's input end offsets are committed to a consumer group. In the model the group holds one
number, the batch whose end offsets it holds (-1: none), and the highest it ever held.

`participant` (the design the product builds): before the prepare check, commit() opens the
run's *progress transaction* on its slot's own id (`s-{slot}-g`: InitProducerId, then
AddOffsetsToTxn and TxnOffsetCommit of the batch's end offsets, one step here) and adds it to
the decision as partition -1. The roll-forward ends it last: EndTxn(commit) only once every row
of the batch is visible, EndTxn(abort) by its exact triple once a row of the batch is lost (the
coordinator's timeout aborted a data participant), so that the completion records it lost with
the data and the replay's repair commits the offsets again with the repaired rows. The group
takes the offsets when the coordinator writes the commit markers.

`fenced` (what the product builds when the group lives on another cluster than the output, where
no transaction can hold both): after the completion, once every row of the batch is visible, the
driver commits the offsets in a transaction of its own on the group's cluster, on one id for
the whole sink (`x-g`: InitProducerId fences any other driver's), reading the group (stable)
inside it and committing the newer of what it holds and the batch's end offsets. Not atomic
with the rows (a crash between them leaves the group behind until the next batch), but never
ahead of them and never back.

Rejected designs (the other values of `config.OFFSETS`), each with its counterexample in
README.md:
- `plain`: no progress transaction; after the roll-forward, a plain OffsetCommit of the batch's
  end offsets when every row of it is visible;
- `first`: the progress participant ended like any other, in the decision's order (first),
  committed whatever happened to the data;
- `blind`: `fenced` without the read, committing the batch's own offsets: the fence alone.
"""

from __future__ import annotations

from model.txn_model import commit_log as cl
from model.txn_model.commit_log import Entry
from model.txn_model.config import Config
from model.txn_model.coordinator import (
    Outcome,
    Row,
    Triple,
    TxnState,
    describe,
    end_txn,
    held_in,
    init_producer,
    preparing_ids,
    produce,
)
from model.txn_model.repair import COMMITTING, batch_rows
from model.txn_model.state import Driver, Message, Phase, Status, World

PROGRESS = -1
"""The partition number of the progress participant in messages, decisions and completions."""

ELSEWHERE = -2
"""The partition number of the offsets a `fenced` transaction commits (they are not rows)."""

FENCE_ID = "x-g"
"""`fenced`: the sink's one transactional id on the group's cluster (not among its pool's)."""

WAIT = "wait"
"""`next_end`'s answer when the progress participant must wait for markers."""


def progress_id(slot: int) -> str:
    """The transactional id of a run's progress transaction: one per slot, like the tasks'."""
    return f"s-{slot}-g"


def open_progress(world: World, driver: Driver, slot: int) -> tuple[str, World, Driver] | None:
    """The driver opens its progress transaction and adds the batch's end offsets; None while
    InitProducerId answers CONCURRENT_TRANSACTIONS with nothing changed (it retries)."""
    txn_id = progress_id(slot)
    coordinator, outcome, triple = init_producer(world.coordinator, txn_id)
    if outcome is Outcome.CONCURRENT:
        if coordinator == world.coordinator:
            return None
        return (
            f"init_transactions({txn_id}) fences its open transaction",
            world._replace(coordinator=coordinator),
            driver,
        )
    assert triple is not None
    coordinator, _ = produce(coordinator, triple, ((driver.batch, PROGRESS, 0),))
    messages = (*driver.messages, Message(PROGRESS, "prepared", triple))
    text = f"opens its progress transaction {triple} with the end offsets of batch {driver.batch}"
    return text, world._replace(coordinator=coordinator), driver._replace(messages=messages)


def forget_progress(world: World, driver: Driver) -> tuple[World, Driver]:
    """commit() raises: Spark's abort() runs in another process and gets only the tasks'
    messages, so the progress transaction's triple stays behind. commit() aborts it first (by
    exact triple) unless a record it put lists it: a decision or repair, landed or in doubt
    (record.py `record_with_progress`)."""
    mine = [m.triple for m in driver.messages if m.partition == PROGRESS and m.triple]
    if not mine:
        return world, driver
    listed = {p.triple for e in (*world.log, *world.in_flight) for p in e.participants}
    if mine[0] not in listed:
        coordinator, _ = end_txn(world.coordinator, mine[0], commit=False)
        world = world._replace(coordinator=coordinator)
    tasks = tuple(m for m in driver.messages if m.partition != PROGRESS)
    return world, driver._replace(messages=tasks)


def left_by_abort(world: World) -> str | None:
    """A run whose abort() closed its batch's round with its own abort record and returned, with
    no newer run since (whose clean-up would own the rest): its progress transaction of that
    batch must not be left open (review N8: the group's stable offsets would read as pending
    until the coordinator's timeout)."""
    for driver in world.drivers:
        if driver.abort_held < 0 or driver.status in (Status.RUNNING, Status.CRASHED):
            continue
        if cl.superseded_by(world.log, driver.number) is not None:
            continue
        txn_id = progress_id(driver.slot)
        txn = describe(world.coordinator, txn_id)
        batch_open = txn is not None and txn.state is TxnState.ONGOING
        if batch_open and txn is not None and (driver.abort_held, PROGRESS, 0) in txn.rows:
            return (
                f"{driver.name()}'s abort() closed batch {driver.abort_held}'s round and "
                f"returned, but its progress transaction {txn_id} is still open"
            )
    return None


def needs_progress(driver: Driver, repairing: bool) -> bool:
    """Whether commit() opens a progress transaction before its check: for a decision, always;
    for a repair, when the batch's offsets are among what it repairs."""
    if any(m.partition == PROGRESS for m in driver.messages):
        return False
    return not repairing or PROGRESS in driver.repair[1]


def batch_visible(world: World, config: Config, batch: int) -> bool:
    """Every row of `batch` is visible (the fate probe's answer for each of them)."""
    visible = {row for row, _ in world.visible}
    return all(row in visible for row in batch_rows(config, batch))


def next_end(world: World, config: Config, entry: Entry) -> tuple[Triple, bool] | str | None:
    """The next EndTxn the roll-forward of `entry` sends, as (triple, commit); WAIT while the
    progress participant must wait for a data participant's markers; None when none is left."""
    data = [p for p in entry.participants if p.partition != PROGRESS]
    progress = [p for p in entry.participants if p.partition == PROGRESS]
    ordered = [*progress, *data] if config.offsets == "first" else [*data, *progress]
    for participant in ordered:
        if not held_in(world.coordinator, participant.triple, (TxnState.ONGOING,)):
            continue
        if participant.partition != PROGRESS or config.offsets == "first":
            return participant.triple, True
        if batch_visible(world, config, entry.batch):
            return participant.triple, True
        if any(held_in(world.coordinator, p.triple, COMMITTING) for p in data):
            return WAIT
        return participant.triple, False  # a row of the batch is lost: the offsets go with it
    return None


def applied(world: World, rows: tuple[Row, ...]) -> World:
    """The coordinator wrote commit markers for `rows`: the group takes any offsets among them."""
    batches = [batch for batch, partition, _ in rows if partition in (PROGRESS, ELSEWHERE)]
    return take(world, batches[0]) if batches else world


def take(world: World, batch: int) -> World:
    """The group holds the end offsets of `batch` now (the last commit wins, as in Kafka)."""
    return world._replace(group=(batch, max(batch, world.group[1])))


def violation(world: World, config: Config) -> str | None:
    """The group's rules, in every state: it never moves back, and never holds the offsets of a
    batch some row of which (or of an earlier batch) is not visible."""
    stray = left_by_abort(world)
    if stray is not None:
        return stray
    current, highest = world.group
    if current < highest:
        return f"group offsets moved back: batch {highest}'s, then batch {current}'s"
    visible = {row for row, _ in world.visible}
    for batch in range(current + 1):
        missing = [r[1] for r in batch_rows(config, batch) if r not in visible]
        if missing:
            return (
                f"group offsets ahead of the output: the group holds batch {current}'s end "
                f"offsets, but rows of batch {batch} partition {missing[0]} are not visible"
            )
    return None


def final_violation(world: World, config: Config) -> str | None:
    """Once some run finished the query: the group holds the last batch's end offsets."""
    if world.group[0] != config.batches - 1:
        return (
            f"query finished but the group holds batch {world.group[0]}'s end offsets, "
            f"not batch {config.batches - 1}'s"
        )
    return None


def plain_commit(world: World, config: Config, batch: int) -> tuple[str, World]:
    """Flaw `plain`: an OffsetCommit outside any transaction, when every row is visible."""
    if not batch_visible(world, config, batch):
        return "no plain OffsetCommit: a row of the batch is not visible", world
    return f"plain OffsetCommit of batch {batch}'s end offsets", take(world, batch)


def fence_init(world: World, driver: Driver) -> tuple[str, World, Driver, Phase] | None:
    """`fenced`, once every row of the batch is visible: InitProducerId of `FENCE_ID`, and the
    driver's next phase; None while it answers CONCURRENT_TRANSACTIONS (it retries)."""
    coordinator, outcome, triple = init_producer(world.coordinator, FENCE_ID)
    if outcome is Outcome.CONCURRENT:
        if coordinator == world.coordinator:
            return None
        text = f"init_transactions({FENCE_ID}) fences its open transaction"
        return text, world._replace(coordinator=coordinator), driver, Phase.FENCE_INIT
    assert triple is not None
    text = f"init_transactions({FENCE_ID}): {triple}"
    driver = driver._replace(fence=(triple, -1))
    return text, world._replace(coordinator=coordinator), driver, Phase.FENCE_READ


def markers_pending(world: World) -> bool:
    """Some transaction of the sink is PrepareCommit (what `Settler.wait_visible` waits out)."""
    return any(txn_id != FENCE_ID for txn_id in preparing_ids(world.coordinator))


def fence_read(world: World, config: Config, driver: Driver) -> tuple[str, Driver] | None:
    """`fenced`: OffsetFetch with require_stable (None while a commit of the group is pending);
    the target is the newer of the group's offsets and the batch's (`blind`: the batch's)."""
    if FENCE_ID in preparing_ids(world.coordinator):
        return None
    assert driver.fence is not None
    target = driver.batch if config.offsets == "blind" else max(world.group[0], driver.batch)
    text = f"reads the group at batch {world.group[0]}'s offsets: commits batch {target}'s"
    return text, driver._replace(fence=(driver.fence[0], target))


def fence_send(world: World, driver: Driver) -> tuple[str, World, bool]:
    """`fenced`: AddOffsetsToTxn and TxnOffsetCommit of the target; False when fenced."""
    assert driver.fence is not None
    triple, target = driver.fence
    coordinator, outcome = produce(world.coordinator, triple, ((target, ELSEWHERE, 0),))
    text = f"TxnOffsetCommit of batch {target}'s offsets in {triple}: {outcome.value}"
    return text, world._replace(coordinator=coordinator), outcome is Outcome.OK


def fence_end(world: World, driver: Driver) -> tuple[str, World, bool]:
    """`fenced`: EndTxn(commit) of its transaction; False when fenced or timed out."""
    assert driver.fence is not None
    triple, _ = driver.fence
    coordinator, outcome = end_txn(world.coordinator, triple, commit=True)
    text = f"EndTxn(commit) {triple}: {outcome.value}"
    return text, world._replace(coordinator=coordinator), outcome is Outcome.OK
