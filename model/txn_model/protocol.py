"""Every step any process can take from a state: drivers, task attempts and the environment
(the coordinator's markers and timeouts, new runs, late attempts).

Processes interleave freely, so a process that takes no step for a while is frozen, and one that
takes steps again later was resumed: freezes need no step of their own. A crash is a step that
ends a driver and its tasks. Each driver step is one atomic action against the brokers or the
commit log (reads that the product makes back to back are merged where their order cannot
matter; README.md lists them).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from model.txn_model import commit_log as cl
from model.txn_model import offsets, repair
from model.txn_model.commit_log import Entry, Kind, Participant
from model.txn_model.config import Config, Variant
from model.txn_model.coordinator import (
    Outcome,
    Triple,
    TxnState,
    describe,
    end_txn,
    init_producer,
    ongoing_ids,
    preparing_ids,
    produce,
    time_out,
    write_markers,
)
from model.txn_model.state import (
    AttemptKind,
    Driver,
    Message,
    Phase,
    Status,
    Task,
    TaskStep,
    World,
    new_driver,
)

Step = tuple[str, World]
"""A labelled transition: what happened, and the state after it."""

PhaseSteps = Callable[[World, Config, Driver], Iterator[Step]]
"""The steps of a driver in one phase."""


def successors(world: World, config: Config, phases: dict[Phase, PhaseSteps]) -> Iterator[Step]:
    """Every step enabled in `world`, the drivers' steps taken from `phases`."""
    yield from _environment_steps(world, config)
    for driver in world.drivers:
        if driver.alive:
            yield from _driver_steps(world, config, driver, phases)
    for index, task in enumerate(world.tasks):
        yield from _task_steps(world, config, index, task)


# --- small helpers ----------------------------------------------------------------------------


def with_driver(world: World, driver: Driver) -> World:
    """`world` with `driver` in its place."""
    drivers = list(world.drivers)
    drivers[driver.run] = driver
    return world._replace(drivers=tuple(drivers))


def _with_tasks(world: World, tasks: list[Task]) -> World:
    """Replace the tasks, dropping finished attempts nobody will read."""
    keep = [t for t in tasks if t.step is not TaskStep.DONE or _collected(world, t)]
    return world._replace(tasks=tuple(sorted(keep, key=_task_order)))


def _task_order(task: Task) -> tuple[object, ...]:
    """A total order on tasks (a triple may be None), so equal sets of tasks are equal tuples."""
    return (*task[:6], task.triple or ("", 0, 0), *task[7:])


def _collected(world: World, task: Task) -> bool:
    return task.kind is AttemptKind.PRIMARY and world.drivers[task.run].alive


def append_entry(world: World, entry: Entry) -> World:
    """`world` with `entry` written to the commit log."""
    return world._replace(log=(*world.log, entry))


def put_entry(world: World, entry: Entry) -> tuple[World, Entry]:
    """`world` with `entry` put-if-absent, and the record that holds its key."""
    log, holder = cl.put_if_absent(world.log, entry)
    return world._replace(log=log), holder


def say(driver: Driver, text: str) -> str:
    """A trace line for a step of `driver`."""
    return f"{driver.name()} b{driver.batch}: {text}"


def at_phase(world: World, driver: Driver, phase: Phase) -> World:
    """`world` with `driver` moved on to `phase`."""
    return with_driver(world, driver._replace(phase=phase))


def stop_run(world: World, config: Config, driver: Driver, status: Status, reason: str) -> World:
    """The run ends. In `owned`, a run that finished or was superseded releases its slot: it
    stops only between stages, so none of its tasks runs. A failed run does not (Spark may
    still be cancelling tasks of a failed stage), and a crashed one cannot."""
    world = with_driver(world, driver._replace(status=status, reason=reason))
    releases = status in (Status.FINISHED, Status.SUPERSEDED)
    if config.variant is Variant.OWNED and driver.slot >= 0 and releases:
        world = append_entry(world, Entry(Kind.RELEASE, driver.run))
    return _with_tasks(world, list(world.tasks))


def _superseded(world: World, config: Config, driver: Driver) -> Step | None:
    """In `owned`, every driver step that reads the log stops if a newer run owns the sink."""
    if config.variant is not Variant.OWNED:
        return None
    newer = cl.superseded_by(world.log, driver.run)
    if newer is None:
        return None
    reason = f"superseded by run {newer}"
    text = f"finds run {newer} owns the sink: stops with an error naming run {newer}"
    if driver.messages:  # commit() raised: Spark calls abort() with the tasks' messages
        world = abort_undecided(world, config, driver)
        text += ", abort()"
    return say(driver, text), stop_run(world, config, driver, Status.SUPERSEDED, reason)


def abort_undecided(world: World, config: Config, driver: Driver) -> World:
    """abort() for its own prepared transactions that no decision lists, by exact triple."""
    decided = cl.decided_triples(world.log, config.variant)
    coordinator = world.coordinator
    for message in driver.messages:
        if message.triple is not None and message.triple not in decided:
            coordinator, _ = end_txn(coordinator, message.triple, commit=False)
    return world._replace(coordinator=coordinator)


def _fail_batch(world: World, config: Config, driver: Driver, why: str) -> Step:
    """commit() raised: Spark calls abort(), then the query stops (a restart is a new run)."""
    world = abort_undecided(world, config, driver)
    return say(driver, f"{why}: batch fails, abort()"), stop_run(
        world, config, driver, Status.FAILED, why
    )


# --- the environment --------------------------------------------------------------------------


def _environment_steps(world: World, config: Config) -> Iterator[Step]:
    for txn_id in preparing_ids(world.coordinator):
        coordinator, rows = write_markers(world.coordinator, txn_id)
        txn = describe(world.coordinator, txn_id)
        assert txn is not None
        triple = Triple(txn_id, txn.producer_id, txn.epoch)
        shown = [row for row in rows if row[1] != offsets.ELSEWHERE]  # offsets are not rows
        visible = tuple(sorted((*world.visible, *((row, triple) for row in shown))))
        what = "commit" if rows else "abort"
        marked = offsets.applied(world._replace(coordinator=coordinator, visible=visible), rows)
        yield f"coordinator writes {what} markers of {triple}", marked
    if world.used.timeouts < config.timeouts:
        for txn_id in ongoing_ids(world.coordinator):
            coordinator, aborted = time_out(world.coordinator, txn_id)
            yield (
                f"coordinator times out {aborted}",
                world._replace(
                    coordinator=coordinator,
                    used=world.used._replace(timeouts=world.used.timeouts + 1),
                    timed_out=world.timed_out | {aborted},
                ),
            )
    yield from _new_run(world, config)
    yield from _late_attempts(world, config)
    yield from _late_writes(world)


def send_in_doubt(world: World, entry: Entry) -> World:
    """`world` with a write of `entry` sent but not answered: it lands later, or never."""
    used = world.used._replace(late_writes=world.used.late_writes + 1)
    return world._replace(in_flight=(*world.in_flight, entry), used=used)


def _late_writes(world: World) -> Iterator[Step]:
    """A write whose writer gave up arrives now (put-if-absent, as any write), or is lost."""
    for index, entry in enumerate(world.in_flight):
        rest = world.in_flight[:index] + world.in_flight[index + 1 :]
        log, holder = cl.put_if_absent(world.log, entry)
        landed = "lands" if holder == entry else f"is refused: {holder} holds the key"
        yield f"the late write of {entry} {landed}", world._replace(log=log, in_flight=rest)
        yield f"the late write of {entry} is lost", world._replace(in_flight=rest)


def _new_run(world: World, config: Config) -> Iterator[Step]:
    if world.used.runs >= config.drivers or len(world.spark_commits) >= config.batches:
        return
    if not config.concurrent and any(d.alive for d in world.drivers):
        return
    driver = new_driver(world, config)
    alive = [str(d.run) for d in world.drivers if d.alive]
    runs = f"{driver.label} " if len(alive) == 1 else f"{driver.label}s "
    beside = f" beside live {runs}{', '.join(alive)}" if alive else ""
    world = world._replace(
        drivers=(*world.drivers, driver), used=world.used._replace(runs=world.used.runs + 1)
    )
    yield f"{driver.name()} starts on the checkpoint at batch {driver.batch}{beside}", world


def _launched(driver: Driver, batch: int) -> bool:
    if batch < driver.first_batch or batch > driver.batch:
        return False
    early = (Phase.OWN, Phase.START_ROLL, Phase.START_CHECK, Phase.LAUNCH)
    return batch < driver.batch or driver.phase not in early


def _late_attempts(world: World, config: Config) -> Iterator[Step]:
    if world.used.late_attempts >= config.late_attempts:
        return
    used = world.used._replace(late_attempts=world.used.late_attempts + 1)
    for batch in sorted(cl.decisions(world.log, config.variant)):
        for driver in world.drivers:
            if driver.status is Status.CRASHED or not _launched(driver, batch):
                continue
            for partition in range(config.partitions):
                late = driver.attempt(batch, partition, AttemptKind.LATE)
                yield (
                    f"{late.name()} starts (batch {batch} is decided)",
                    _with_tasks(world._replace(used=used), [*world.tasks, late]),
                )


# --- drivers ------------------------------------------------------------------------------------


def _driver_steps(
    world: World, config: Config, driver: Driver, phases: dict[Phase, PhaseSteps]
) -> Iterator[Step]:
    if world.used.crashes < config.crashes:
        crashed = with_driver(world, driver._replace(status=Status.CRASHED, reason="crashed"))
        crashed = crashed._replace(
            tasks=tuple(t for t in world.tasks if t.run != driver.run),
            used=world.used._replace(crashes=world.used.crashes + 1),
        )
        yield say(driver, f"driver crashes before: {driver.phase.value}"), crashed
    yield from phases[driver.phase](world, config, driver)


def _own(world: World, config: Config, driver: Driver) -> Iterator[Step]:
    slot = cl.choose_slot(world.log, config.slots)
    world = append_entry(world, Entry(Kind.OWNER, driver.run, slot=slot))
    driver = driver._replace(slot=slot, phase=Phase.START_ROLL)
    yield say(driver, f"appends owner(run {driver.run}, slot {slot})"), with_driver(world, driver)


def roll_forward(world: World, config: Config, driver: Driver, then: Phase) -> Iterator[Step]:
    """One step of completing the oldest incomplete decision, or move on if there is none."""
    stop = _superseded(world, config, driver)
    if stop is not None:
        yield stop
        return
    pending = cl.incomplete(world.log, config.variant)
    if not pending:
        yield say(driver, f"{driver.phase.value}: nothing to do"), at_phase(world, driver, then)
        return
    decision = pending[0]
    ending = offsets.next_end(world, config, decision)
    if isinstance(ending, str):  # offsets.WAIT
        return  # the progress participant waits for a data participant's markers
    if ending is not None:
        triple, commit = ending
        coordinator, outcome = end_txn(world.coordinator, triple, commit=commit)
        how = "commit" if commit else "abort"
        text = f"EndTxn({how}) {triple} of batch {decision.batch}: {outcome.value}"
        yield say(driver, text), world._replace(coordinator=coordinator)
        return
    done = Entry(Kind.COMPLETION, driver.run, batch=decision.batch)
    if not config.repair:
        text = f"batch {decision.batch} settled: appends {done}"
        yield say(driver, text), append_entry(world, done)
        return
    settled = repair.settle(world, config, decision)
    if settled is None:
        return  # a participant is being committed: the probe answers once markers are out
    world, holder = put_entry(world, settled._replace(run=driver.run))
    yield say(driver, f"batch {decision.batch} settled: {holder} holds the key"), world


def _start_roll(world: World, config: Config, driver: Driver) -> Iterator[Step]:
    return roll_forward(world, config, driver, Phase.LAUNCH)


def _commit_roll(world: World, config: Config, driver: Driver) -> Iterator[Step]:
    return roll_forward(world, config, driver, Phase.DECIDED_CHECK)


def _phase2(world: World, config: Config, driver: Driver) -> Iterator[Step]:
    first = Phase.SWEEP_READ if config.cleanup_reads_log_first else Phase.SWEEP_DESCRIBE
    return roll_forward(world, config, driver, first)


def _launch(world: World, config: Config, driver: Driver) -> Iterator[Step]:
    def attempt(partition: int, kind: AttemptKind) -> Task:
        return driver.attempt(driver.batch, partition, kind)

    every = [attempt(p, AttemptKind.PRIMARY) for p in range(config.partitions)]
    level, lost = repair.plan(world, driver.batch) if config.repair else (0, ())
    primaries = [t._replace(repair=level) if t.partition in lost else t for t in every]
    launched = at_phase(world, driver._replace(repair=(level, lost)), Phase.WAIT)
    text = "launches the tasks" + (f", repair level {level} of p{lost}" if lost else "")
    yield say(driver, text), _with_tasks(launched, [*world.tasks, *primaries])
    regrouped = repair.regrouped(launched, config, lost)
    for group in range(1, len(repair.GROUPS)) if regrouped is not None else ():
        assert regrouped is not None  # every task of a replay so regrouped writes
        tasks = [*world.tasks, *(t._replace(repair=level, group=group) for t in every)]
        shown = f"{text}; the replay has {repair.GROUPS[group]}"
        yield say(driver, shown), _with_tasks(regrouped, tasks)
    if world.used.zombies < config.zombies:
        used = launched.used._replace(zombies=launched.used.zombies + 1)
        for p in range(config.partitions):
            # Spark's order: attempt 0 is lost to the driver but runs on; attempt 1 is used.
            used_one = [t._replace(attempt=1) if t.partition == p else t for t in primaries]
            tasks = [*world.tasks, *used_one, attempt(p, AttemptKind.ZOMBIE)]
            text = f"launches the tasks, and a zombie attempt of partition {p}"
            yield say(driver, text), _with_tasks(launched._replace(used=used), tasks)


def _wait(world: World, config: Config, driver: Driver) -> Iterator[Step]:
    mine = [
        t
        for t in world.tasks
        if t.run == driver.run and t.batch == driver.batch and t.kind is AttemptKind.PRIMARY
    ]
    if any(t.step is not TaskStep.DONE for t in mine):
        return
    messages = tuple(
        Message(t.partition, t.result, t.triple, t.order, t.group)
        for t in sorted(mine, key=lambda t: t.partition)
    )
    rest = [t for t in world.tasks if t not in mine]
    driver = driver._replace(messages=messages, phase=Phase.COMMIT_ROLL)
    summary = ", ".join(f"p{m.partition} {m.status}" for m in messages)
    yield (
        say(driver, f"collects the messages ({summary})"),
        _with_tasks(with_driver(world, driver), rest),
    )


def _decided_check(world: World, config: Config, driver: Driver) -> Iterator[Step]:
    stop = _superseded(world, config, driver)
    if stop is not None:
        yield stop
        return
    if driver.batch in cl.decisions(world.log, config.variant):
        world = abort_undecided(world, config, driver)
        text = "batch is decided already: aborts its own undecided transactions, rolls forward"
        yield say(driver, text), at_phase(world, driver, Phase.PHASE2)
        return
    if any(m.status != "prepared" for m in driver.messages):
        yield _fail_batch(world, config, driver, "a task did not prepare")
        return
    yield say(driver, "messages complete"), at_phase(world, driver, Phase.PREPARE_CHECK)


def _prepare_check(world: World, config: Config, driver: Driver) -> Iterator[Step]:
    for message in driver.messages:
        assert message.triple is not None
        txn = describe(world.coordinator, message.triple.txn_id)
        if txn is None or not txn.holds(message.triple) or txn.state is not TxnState.ONGOING:
            yield _fail_batch(world, config, driver, f"prepare check: {message.triple} not open")
            return
    yield say(driver, "prepare check passes"), at_phase(world, driver, Phase.DECIDE)


def _decide(world: World, config: Config, driver: Driver) -> Iterator[Step]:
    stop = _superseded(world, config, driver)
    if stop is not None:
        yield stop
        return
    parts = tuple(
        Participant(m.partition, m.triple, m.order, m.group) for m in driver.messages if m.triple
    )
    existing = cl.decisions(world.log, config.variant).get(driver.batch)
    if existing is None:
        decision = Entry(Kind.DECISION, driver.run, batch=driver.batch, participants=parts)
        text = f"appends {decision}: the commit point"
        yield say(driver, text), at_phase(append_entry(world, decision), driver, Phase.PHASE2)
    elif existing.participants == parts:
        yield say(driver, "finds its own decision"), at_phase(world, driver, Phase.PHASE2)
    else:
        yield _fail_batch(world, config, driver, f"decision conflict with run {existing.run}")


def _open_triples(world: World) -> tuple[Triple, ...]:
    """DescribeTransactions of every id of the sink: the open transactions' triples."""
    triples = []
    for txn_id in ongoing_ids(world.coordinator):
        if txn_id == offsets.FENCE_ID:
            continue  # on the group's cluster, not among the sink's ids
        txn = describe(world.coordinator, txn_id)
        assert txn is not None
        triples.append(Triple(txn_id, txn.producer_id, txn.epoch))
    return tuple(triples)


def _sweep_describe(world: World, config: Config, driver: Driver) -> Iterator[Step]:
    seen = _open_triples(world)
    if config.cleanup_reads_log_first:
        yield cleanup_planned(world, driver, tuple(t for t in seen if t not in driver.held))
        return
    names = ", ".join(str(t) for t in seen) or "nothing open"
    driver = driver._replace(seen=seen, phase=Phase.SWEEP_READ)
    yield say(driver, f"clean-up describes {names}"), with_driver(world, driver)


def _sweep_read(world: World, config: Config, driver: Driver) -> Iterator[Step]:
    stop = _superseded(world, config, driver)
    if stop is not None:
        yield stop
        return
    held = cl.held(world.log, config.variant)
    if config.cleanup_reads_log_first:
        driver = driver._replace(held=tuple(sorted(held)), phase=Phase.SWEEP_DESCRIBE)
        yield say(driver, "clean-up reads the log"), with_driver(world, driver)
        return
    yield cleanup_planned(world, driver, tuple(t for t in driver.seen if t not in held))


def cleanup_planned(world: World, driver: Driver, targets: tuple[Triple, ...]) -> Step:
    """The clean-up knows what to abort: every open transaction no incomplete decision holds."""
    following = Phase.SWEEP_ABORT if targets else after_cleanup(driver)
    driver = driver._replace(seen=(), held=(), targets=targets, phase=following)
    names = ", ".join(str(t) for t in targets) or "nothing"
    return say(driver, f"clean-up will abort {names}"), with_driver(world, driver)


def after_cleanup(driver: Driver) -> Phase:
    """Where a driver goes once its clean-up is done: Spark records the batch, or (keyed) the
    abort() that ran the clean-up returns."""
    return Phase.SPARK_COMMIT if driver.ending is None else Phase.ABORT_DONE


def _sweep_abort(world: World, config: Config, driver: Driver) -> Iterator[Step]:
    target, rest = driver.targets[0], driver.targets[1:]
    coordinator, outcome = end_txn(world.coordinator, target, commit=False)
    following = Phase.SWEEP_ABORT if rest else after_cleanup(driver)
    driver = driver._replace(targets=rest, phase=following)
    text = f"clean-up EndTxn(abort) {target}: {outcome.value}"
    yield say(driver, text), with_driver(world._replace(coordinator=coordinator), driver)


def _spark_commit(world: World, config: Config, driver: Driver) -> Iterator[Step]:
    why = repair.not_done(world, config, driver) if config.repair else ""
    if why:
        yield (
            say(driver, f"{why}: the batch fails"),
            stop_run(world, config, driver, Status.FAILED, why),
        )
        return
    world = world._replace(spark_commits=world.spark_commits | {driver.batch})
    if driver.batch + 1 >= config.batches:
        yield (
            say(driver, "Spark records the batch; the query is done"),
            stop_run(world, config, driver, Status.FINISHED, "finished"),
        )
        return
    driver = driver._replace(
        batch=driver.batch + 1, phase=Phase.START_ROLL, messages=(), targets=(), repair=(0, ())
    )
    yield f"{driver.name()}: Spark records batch {driver.batch - 1}", with_driver(world, driver)


PHASES: dict[Phase, PhaseSteps] = {
    Phase.OWN: _own,
    Phase.START_ROLL: _start_roll,
    Phase.LAUNCH: _launch,
    Phase.WAIT: _wait,
    Phase.COMMIT_ROLL: _commit_roll,
    Phase.DECIDED_CHECK: _decided_check,
    Phase.PREPARE_CHECK: _prepare_check,
    Phase.DECIDE: _decide,
    Phase.PHASE2: _phase2,
    Phase.SWEEP_DESCRIBE: _sweep_describe,
    Phase.SWEEP_READ: _sweep_read,
    Phase.SWEEP_ABORT: _sweep_abort,
    Phase.SPARK_COMMIT: _spark_commit,
}


# --- task attempts ------------------------------------------------------------------------------


def _task_steps(world: World, config: Config, index: int, task: Task) -> Iterator[Step]:
    if task.step is TaskStep.CHECK:
        yield _task_check(world, config, index, task)
    elif task.step is TaskStep.INIT:
        yield from _task_init(world, config, index, task)
    elif task.step is TaskStep.PRODUCE:
        yield from _task_produce(world, config, index, task)


def _replace_task(world: World, index: int, task: Task) -> World:
    tasks = list(world.tasks)
    tasks[index] = task
    return _with_tasks(world, tasks)


def _task_check(world: World, config: Config, index: int, task: Task) -> Step:
    """Step 0 of a task: stop if its run was superseded (owned); skip a decided batch."""
    newer = cl.superseded_by(world.log, task.run) if config.variant is Variant.OWNED else None
    if newer is not None:
        done = task._replace(step=TaskStep.DONE, result="failed")
        return f"{task.name()}: run {newer} owns the sink: fails", _replace_task(world, index, done)
    if task.repair and task.repair in cl.repairs(world.log, task.batch):
        done = task._replace(step=TaskStep.DONE, result="skipped")
        return f"{task.name()}: repair level taken: skipped", _replace_task(world, index, done)
    if not task.repair and task.batch in cl.decisions(world.log, config.variant):
        done = task._replace(step=TaskStep.DONE, result="skipped")
        return f"{task.name()}: batch decided: skipped", _replace_task(world, index, done)
    free = "repair level free" if task.repair else "batch not decided"
    return f"{task.name()}: {free}", _replace_task(world, index, task._replace(step=TaskStep.INIT))


def _task_init(world: World, config: Config, index: int, task: Task) -> Iterator[Step]:
    txn_id = cl.txn_id(
        config.variant, task.slot, task.partition, config.txn_ids, task.batch, task.attempt
    )
    coordinator, outcome, triple = init_producer(world.coordinator, txn_id)
    if outcome is Outcome.CONCURRENT:
        if coordinator != world.coordinator:
            text = f"{task.name()}: init_transactions({txn_id}) fences its open transaction"
            yield text, world._replace(coordinator=coordinator)
        return
    world = world._replace(coordinator=coordinator)
    yield (
        f"{task.name()}: init_transactions -> {triple}",
        _replace_task(world, index, task._replace(step=TaskStep.PRODUCE, triple=triple)),
    )
    if _may_retry(world, config, task):
        yield (
            f"{task.name()}: init -> {triple}, then the attempt dies; Spark retries it",
            (_retried(world, index, task)),
        )


def _task_produce(world: World, config: Config, index: int, task: Task) -> Iterator[Step]:
    assert task.triple is not None
    rows = repair.rows_of(config, task.batch, task.partition, task.group)
    if not rows:  # a replay put every row in another task: no transaction (the product's empty)
        done = task._replace(step=TaskStep.DONE, result="empty", triple=None)
        yield f"{task.name()}: has no rows: prepares nothing", _replace_task(world, index, done)
        return
    coordinator, outcome = produce(world.coordinator, task.triple, rows)
    if outcome is not Outcome.OK:
        done = task._replace(step=TaskStep.DONE, result="failed")
        yield f"{task.name()}: produce fails: {outcome.value}", _replace_task(world, index, done)
        return
    world = world._replace(coordinator=coordinator)
    done = task._replace(step=TaskStep.DONE, result="prepared")
    what = f"produces {repair.show(rows)}, flushes" if config.regroup else "produces, flushes"
    yield (
        f"{task.name()}: {what}: prepared {task.triple}",
        _replace_task(world, index, done),
    )
    reordered = repair.reordered(world, config, task)
    if reordered is not None:
        text = f"{task.name()}: produces its rows in another order, flushes: prepared"
        yield f"{text} {task.triple}", _replace_task(reordered, index, done._replace(order=1))
    if _may_retry(world, config, task):
        text = f"{task.name()}: produces {task.triple}, then the attempt dies; Spark retries it"
        yield text, _retried(world, index, task)


def _may_retry(world: World, config: Config, task: Task) -> bool:
    return task.kind is AttemptKind.PRIMARY and world.used.retries < config.retries


def _retried(world: World, index: int, task: Task) -> World:
    """The attempt died; the next attempt of the same task starts from its first step."""
    world = world._replace(used=world.used._replace(retries=world.used.retries + 1))
    retry = task._replace(step=TaskStep.CHECK, triple=None, attempt=task.attempt + 1)
    return _replace_task(world, index, retry)
