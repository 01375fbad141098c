"""The `keyed` variant's driver steps: the protocol as the product builds it
(kafka_txn_sink/protocol/runs.py, start.py, decide.py, recover.py).

Differences from `owned` (README.md, "The keyed variant"):
- log records are put-if-absent per key; a run's owner record takes the next run number, and a
  decision carries its run and counts if it is the first of its batch, whoever wrote it;
- every streamWriter() (the planner's, the commit worker's, abort()'s) rolls forward with no
  check, then checks that no newer owner record exists; raising there aborts nothing;
- commit() checks for a newer owner once, first; a batch decided by a newer run, or a newer
  owner, makes it release its run and raise, and Spark's abort() then creates a writer whose
  streamWriter() records a new run for this driver (its own run is released);
- the decision is written with no check of the owners; a conflict with an older run's decision
  fails the batch;
- the clean-up describes, reads the log, aborts nothing if a newer owner exists, and aborts an
  open transaction no incomplete decision holds only if `may_abort` allows it;
- tasks do not check for a newer run; runs release their slot only when superseded in commit().

With `Config.keyed_fixes`, the changes README.md proposes: a superseded commit() aborts its own
undecided transactions and stops for good, and a conflict with an older run's decision rolls
that decision forward.
"""

from __future__ import annotations

from collections.abc import Iterator

from model.txn_model import commit_log as cl
from model.txn_model import offsets, repair
from model.txn_model.commit_log import Entry, Kind, Participant
from model.txn_model.config import Config, Variant
from model.txn_model.coordinator import TxnState, describe
from model.txn_model.protocol import (
    PHASES,
    PhaseSteps,
    Step,
    abort_undecided,
    after_cleanup,
    append_entry,
    at_phase,
    cleanup_planned,
    put_entry,
    roll_forward,
    say,
    send_in_doubt,
    stop_run,
    with_driver,
)
from model.txn_model.state import Driver, Phase, Status, World

KEYED = Variant.KEYED


def _run(driver: Driver) -> tuple[int, int]:
    """The (run number, slot) the driver acts as now: abort()'s new run once it recorded one."""
    return driver.abort_run if driver.abort_run is not None else (driver.number, driver.slot)


def _newer(world: World, driver: Driver) -> int | None:
    """`check_current`: the newer run that owns the sink, if one does."""
    return cl.superseded_by(world.log, _run(driver)[0])


def _record_owner(world: World, config: Config) -> tuple[World, int, int]:
    """`take_over` for a driver without a live run: owner(next number, slot)."""
    number, slot = cl.next_run(world.log), cl.choose_slot(world.log, config.slots)
    return append_entry(world, Entry(Kind.OWNER, number, slot=slot)), number, slot


def _own(world: World, config: Config, driver: Driver) -> Iterator[Step]:
    world, number, slot = _record_owner(world, config)
    driver = driver._replace(number=number, slot=slot, phase=Phase.START_ROLL)
    yield say(driver, f"records owner(run {number}, slot {slot})"), with_driver(world, driver)


def _check(world: World, config: Config, driver: Driver, then: Phase) -> Iterator[Step]:
    """A streamWriter()'s check after its roll forward: raising aborts nothing."""
    newer = _newer(world, driver)
    if newer is None:
        yield say(driver, f"{driver.phase.value}: still the owner"), at_phase(world, driver, then)
        return
    reason = f"superseded by run {newer}"
    text = f"{driver.phase.value}: run {newer} is newer: streamWriter() raises"
    yield say(driver, text), stop_run(world, config, driver, Status.SUPERSEDED, reason)


def _start_roll(world: World, config: Config, driver: Driver) -> Iterator[Step]:
    return roll_forward(world, config, driver, Phase.START_CHECK)


def _start_check(world: World, config: Config, driver: Driver) -> Iterator[Step]:
    return _check(world, config, driver, Phase.LAUNCH)


def _commit_roll(world: World, config: Config, driver: Driver) -> Iterator[Step]:
    if config.commit_without_start:
        text = "the commit worker's streamWriter(): the planner's run, from the messages"
        yield say(driver, text), at_phase(world, driver, Phase.DECIDED_CHECK)
        return
    yield from roll_forward(world, config, driver, Phase.COMMIT_CHECK)


def _commit_check(world: World, config: Config, driver: Driver) -> Iterator[Step]:
    # abort()'s writer would raise the same, so Spark's abort() aborts nothing either.
    return _check(world, config, driver, Phase.DECIDED_CHECK)


def _raise(world: World, driver: Driver, why: str, ending: Status) -> Step:
    """commit() raised (or the stage failed): Spark calls abort(), which starts with its own
    streamWriter(). A superseded run released its run first, so that writer records a new one."""
    following = Phase.ABORT_TAKE_OVER if driver.released else Phase.ABORT_ROLL
    world, driver = offsets.forget_progress(world, driver)
    driver = driver._replace(ending=ending, reason=why, phase=following)
    return say(driver, f"{why}: commit() raises, Spark calls abort()"), with_driver(world, driver)


def _superseded(world: World, config: Config, driver: Driver, newer: int, what: str) -> Step:
    """`SupersededError` in commit(): release this run, then raise. With the fixes, abort its
    own undecided transactions first: abort()'s writer will refuse this driver."""
    world = append_entry(world, Entry(Kind.RELEASE, driver.number))
    if config.keyed_fixes:
        world = abort_undecided(world, config, driver)
        text = f"{what}: aborts its own undecided transactions, releases run {driver.number}"
        reason = f"superseded by run {newer}"
        return say(driver, text), stop_run(world, config, driver, Status.SUPERSEDED, reason)
    driver = driver._replace(released=True)
    return _raise(world, driver, f"{what}: releases run {driver.number}", Status.SUPERSEDED)


def _decided_check(world: World, config: Config, driver: Driver) -> Iterator[Step]:
    newer = _newer(world, driver)
    if newer is not None:
        yield _superseded(world, config, driver, newer, f"commit(): run {newer} is newer")
        return
    if any(m.status not in ("prepared", "skipped", "empty") for m in driver.messages):
        yield _raise(world, driver, "a task failed", Status.FAILED)
        return
    decision = cl.decisions(world.log, KEYED).get(driver.batch)
    if decision is None:
        following = _opening(config, driver, Phase.PREPARE_CHECK)
        yield say(driver, "commit(): messages complete"), at_phase(world, driver, following)
    elif decision.run > driver.number:
        what = f"batch decided by run {decision.run}"
        yield _superseded(world, config, driver, decision.run, what)
    elif config.repair and repair.wants_repair(config, driver):
        text = f"batch decided by run {decision.run}; its repair's tasks prepared"
        following = _opening(config, driver, Phase.REPAIR_CHECK)
        yield say(driver, text), at_phase(world, driver, following)
    else:
        world = abort_undecided(world, config, driver)
        text = f"batch decided by run {decision.run}: aborts its own strays, rolls forward"
        yield say(driver, text), at_phase(world, driver, Phase.PHASE2)


def _opening(config: Config, driver: Driver, check: Phase) -> Phase:
    """The phase before `check`: open the progress transaction first when it takes part."""
    takes_part = config.offsets in ("participant", "first")
    repairing = check is Phase.REPAIR_CHECK
    return Phase.OFFSETS_OPEN if takes_part and offsets.needs_progress(driver, repairing) else check


def _offsets_open(world: World, config: Config, driver: Driver) -> Iterator[Step]:
    opened = offsets.open_progress(world, driver, _run(driver)[1])
    if opened is None:
        return  # InitProducerId answers CONCURRENT_TRANSACTIONS until the markers are out
    text, world, driver = opened
    if any(m.partition == offsets.PROGRESS for m in driver.messages):
        check = Phase.REPAIR_CHECK if driver.repair[1] else Phase.PREPARE_CHECK
        driver = driver._replace(phase=check)
    yield say(driver, text), with_driver(world, driver)


def _offsets_plain(world: World, config: Config, driver: Driver) -> Iterator[Step]:
    text, world = offsets.plain_commit(world, config, driver.batch)
    yield say(driver, text), at_phase(world, driver, Phase.SWEEP_DESCRIBE)


def _prepare_check(world: World, config: Config, driver: Driver) -> Iterator[Step]:
    for message in driver.messages:
        assert message.triple is not None
        txn = describe(world.coordinator, message.triple.txn_id)
        if txn is None or not txn.holds(message.triple) or txn.state is not TxnState.ONGOING:
            yield _raise(world, driver, f"prepare check: {message.triple} not open", Status.FAILED)
            return
    yield say(driver, "prepare check passes"), at_phase(world, driver, Phase.DECIDE)


def _decide(world: World, config: Config, driver: Driver) -> Iterator[Step]:
    """Put-if-absent per batch, with no look at the owner records."""
    parts = tuple(
        Participant(m.partition, m.triple, m.order, m.group) for m in driver.messages if m.triple
    )
    existing = cl.decisions(world.log, KEYED).get(driver.batch)
    if existing is None:
        round_ = cl.next_round(world.log, driver.batch)
        decision = Entry(
            Kind.DECISION, driver.number, batch=driver.batch, participants=parts, round=round_
        )
        text = f"puts {decision}: the commit point"
        yield say(driver, text), at_phase(append_entry(world, decision), driver, Phase.PHASE2)
        if world.used.late_writes < config.late_writes:
            sent = send_in_doubt(world, decision)
            text = f"puts {decision}: the request times out, outcome unknown"
            yield _raise(sent, driver, text, Status.FAILED)
    elif existing.participants == parts:
        yield say(driver, "finds its own decision"), at_phase(world, driver, Phase.PHASE2)
    elif existing.run > driver.number:
        what = f"batch decided by run {existing.run}"
        yield _superseded(world, config, driver, existing.run, what)
    elif config.keyed_fixes:
        world = abort_undecided(world, config, driver)
        text = f"finds run {existing.run}'s decision: aborts its own strays, rolls it forward"
        yield say(driver, text), at_phase(world, driver, Phase.PHASE2)
    else:
        yield _raise(world, driver, f"decision conflict with run {existing.run}", Status.FAILED)


def _repair_check(world: World, config: Config, driver: Driver) -> Iterator[Step]:
    """Pair the lost participants with replayed tasks by digest (with `Config.regroup`, then
    the ones left with the tasks left, together), abort the tasks left without a pair, then
    check that the taken transactions are open."""
    found = repair.matched(world, config, driver)
    text = ""
    if found.together:
        taken = ", ".join(str(m.triple) for m in found.together)
        lost = ", ".join(f"p{p}" for p in found.lost_together)
        how = "include" if config.repair_flaw == "union-partial" else "are"
        text = f"takes {taken} together for lost {lost} (their records together {how} the lost"
        text += " ones'); "
    strays = repair.unmatched(world, config, driver)
    aborted = ", ".join(str(m.triple) for m in strays)
    world = repair.abort(world, strays)
    text += f"aborts {aborted} (no lost participant has its digest); " if strays else ""
    closed = repair.not_open(world, config, driver)
    if closed is not None:
        text += f"repair's prepare check: {closed} not open"
        yield _raise(world, driver, text, Status.FAILED)
        return
    text += "repair's prepare check passes"
    yield say(driver, text), at_phase(world, driver, Phase.REPAIR_PUT)


def _repair_put(world: World, config: Config, driver: Driver) -> Iterator[Step]:
    """Put-if-absent per batch and level, like the decision; a refused put aborts its own."""
    entry = repair.repair_entry(world, config, driver)
    world, holder = put_entry(world, entry)
    if holder == entry:
        yield say(driver, f"puts {entry}"), at_phase(world, driver, Phase.PHASE2)
        return
    world = abort_undecided(world, config, driver)
    text = f"finds {holder}: aborts its own repair, rolls forward"
    yield say(driver, text), at_phase(world, driver, Phase.PHASE2)


_AFTER_PHASE2 = {
    "plain": Phase.OFFSETS_PLAIN,
    "fenced": Phase.FENCE_INIT,
    "blind": Phase.FENCE_INIT,
}


def _phase2(world: World, config: Config, driver: Driver) -> Iterator[Step]:
    then = _AFTER_PHASE2.get(config.offsets, Phase.SWEEP_DESCRIBE)
    return roll_forward(world, config, driver, then)


def _fence_init(world: World, config: Config, driver: Driver) -> Iterator[Step]:
    """As commit() after the completion: it waits for the sink's commit markers; a row of the
    batch still not visible then was lost, and commit() has raised (TransactionLostError)."""
    if not offsets.batch_visible(world, config, driver.batch):
        if not offsets.markers_pending(world):
            yield _raise(world, driver, "a row of the batch is lost", Status.FAILED)
        return
    started = offsets.fence_init(world, driver)
    if started is not None:  # else InitProducerId answers CONCURRENT_TRANSACTIONS: it retries
        text, world, driver, following = started
        yield say(driver, text), at_phase(world, driver, following)


def _fence_read(world: World, config: Config, driver: Driver) -> Iterator[Step]:
    read = offsets.fence_read(world, config, driver)
    if read is not None:
        text, driver = read
        yield say(driver, text), at_phase(world, driver, Phase.FENCE_SEND)


def _fence_send(world: World, config: Config, driver: Driver) -> Iterator[Step]:
    text, world, ok = offsets.fence_send(world, driver)
    if ok:
        yield say(driver, text), at_phase(world, driver, Phase.FENCE_END)
    else:
        yield _raise(world, driver, text, Status.FAILED)


def _fence_end(world: World, config: Config, driver: Driver) -> Iterator[Step]:
    text, world, ok = offsets.fence_end(world, driver)
    if ok:
        driver = driver._replace(fence=None)
        yield say(driver, text), at_phase(world, driver, Phase.SWEEP_DESCRIBE)
    else:
        yield _raise(world, driver, text, Status.FAILED)


def _sweep_read(world: World, config: Config, driver: Driver) -> Iterator[Step]:
    """The clean-up, after describing: read the log; abort nothing if a newer owner exists,
    else what no incomplete decision holds and `may_abort` allows."""
    newer = _newer(world, driver)
    if newer is not None:
        text = f"clean-up finds run {newer} newer: aborts nothing"
        following = after_cleanup(driver)
        yield say(driver, text), with_driver(world, driver._replace(seen=(), phase=following))
        return
    held = cl.held(world.log, KEYED)
    mine = _run(driver)[1]
    targets = tuple(
        t
        for t in driver.seen
        if t not in held and cl.may_abort(world.log, cl.slot_of(t.txn_id), mine)
    )
    yield cleanup_planned(world, driver, targets)


def _abort_take_over(world: World, config: Config, driver: Driver) -> Iterator[Step]:
    """abort()'s streamWriter() finds this driver's run released: `take_over` records a new
    run for it (no freshness check applies to a released run)."""
    world, number, slot = _record_owner(world, config)
    driver = driver._replace(abort_run=(number, slot), phase=Phase.ABORT_ROLL)
    text = f"abort()'s streamWriter(): records owner(run {number}, slot {slot})"
    yield say(driver, text), with_driver(world, driver)


def _abort_roll(world: World, config: Config, driver: Driver) -> Iterator[Step]:
    return roll_forward(world, config, driver, Phase.ABORT_CHECK)


def _abort_check(world: World, config: Config, driver: Driver) -> Iterator[Step]:
    newer = _newer(world, driver)
    if newer is None:
        yield (
            say(driver, "abort()'s streamWriter(): owner"),
            at_phase(world, driver, Phase.ABORT_TXNS),
        )
        return
    text = f"abort()'s streamWriter(): run {newer} is newer: raises, nothing aborted"
    assert driver.ending is not None
    yield say(driver, text), stop_run(world, config, driver, driver.ending, driver.reason)


def _abort_txns(world: World, config: Config, driver: Driver) -> Iterator[Step]:
    """abort(): EndTxn(abort) by exact triple of its prepared transactions no decision holds;
    the clean-up too if a task returned no message. With the outcome register, it first puts
    an abort record at the batch's open round; while that write's outcome is unknown it aborts
    nothing."""
    if config.outcome_register and driver.batch not in cl.decisions(world.log, KEYED):
        record = Entry(Kind.ABORT, _run(driver)[0], batch=driver.batch)
        record = record._replace(round=cl.next_round(world.log, driver.batch))
        if world.used.late_writes < config.late_writes:
            text = f"abort(): puts {record}: the request times out; aborts nothing, stops"
            sent = send_in_doubt(world, record)
            assert driver.ending is not None
            yield say(driver, text), stop_run(sent, config, driver, driver.ending, driver.reason)
        world = append_entry(world, record)
        driver = driver._replace(abort_held=driver.batch)
    world = abort_undecided(world, config, driver)
    put = f"puts {record}, " if driver.abort_held == driver.batch else ""
    if any(m.status == "failed" for m in driver.messages):
        text = f"abort(): {put}aborts its own undecided transactions; a task failed: clean-up"
        yield say(driver, text), at_phase(world, driver, Phase.SWEEP_DESCRIBE)
        return
    progress = config.offsets in ("participant", "first") and not config.abort_leaves_progress
    decided = cl.decisions(world.log, KEYED).get(driver.batch)
    theirs = decided is not None and decided.run != _run(driver)[0]
    if (put or theirs) and progress:
        text = f"abort(): {put}aborts its own undecided transactions; then the clean-up"
        yield say(driver, text), at_phase(world, driver, Phase.SWEEP_DESCRIBE)
        return
    text = f"abort(): {put}aborts its own undecided transactions; the query stops"
    assert driver.ending is not None
    yield say(driver, text), stop_run(world, config, driver, driver.ending, driver.reason)


def _abort_done(world: World, config: Config, driver: Driver) -> Iterator[Step]:
    assert driver.ending is not None
    text = "abort() returns; the query stops"
    yield say(driver, text), stop_run(world, config, driver, driver.ending, driver.reason)


KEYED_PHASES: dict[Phase, PhaseSteps] = {
    **PHASES,
    Phase.OWN: _own,
    Phase.START_ROLL: _start_roll,
    Phase.START_CHECK: _start_check,
    Phase.COMMIT_ROLL: _commit_roll,
    Phase.COMMIT_CHECK: _commit_check,
    Phase.DECIDED_CHECK: _decided_check,
    Phase.PREPARE_CHECK: _prepare_check,
    Phase.DECIDE: _decide,
    Phase.PHASE2: _phase2,
    Phase.SWEEP_READ: _sweep_read,
    Phase.ABORT_TAKE_OVER: _abort_take_over,
    Phase.ABORT_ROLL: _abort_roll,
    Phase.ABORT_CHECK: _abort_check,
    Phase.ABORT_TXNS: _abort_txns,
    Phase.ABORT_DONE: _abort_done,
    Phase.REPAIR_CHECK: _repair_check,
    Phase.REPAIR_PUT: _repair_put,
    Phase.OFFSETS_OPEN: _offsets_open,
    Phase.OFFSETS_PLAIN: _offsets_plain,
    Phase.FENCE_INIT: _fence_init,
    Phase.FENCE_READ: _fence_read,
    Phase.FENCE_SEND: _fence_send,
    Phase.FENCE_END: _fence_end,
}
"""The driver's steps in `keyed`: the shared ones (tasks launched and collected, the clean-up's
describe and aborts, Spark recording the batch) and the product's own."""
