"""Runs of a sink's query: which driver owns the sink now, and which id slot each run uses.

A job retry can start a new driver while the old one is frozen or cut off, not dead. Both then
run the same query on the same sink. What keeps a decided batch safe between them:
- each run records itself in the commit log (`Owner`, put-if-absent per run number, numbers in
  the order recorded) before it rolls anything forward or starts a task, and takes its own slot
  of transactional ids (txn_ids.py), so neither run's tasks fence the other's transactions;
- decisions stay put-if-absent per batch, and carry their run: whoever records batch N first
  wins. A run that finds a batch decided by a newer run, or a newer owner record, is superseded:
  it stops with `SupersededError` and decides nothing;
- a run aborts another run's open transactions only once that run can no longer decide them
  (`may_abort`), which is when a decision of a newer run is in the log: the older run's commit
  of that batch must fail, so it never launches another stage.

A run is a driver process: Spark calls the sink's driver steps in short-lived Python workers, so
the run is found again from what the driver's JVM gives every such worker (`driver_identity`).
docs/protocol.md has the argument and the model that checked it.
"""

from __future__ import annotations

import logging
import os
import re
import socket
import uuid
from collections.abc import Mapping
from dataclasses import dataclass

from kafka_txn_sink.commit_log import CommitLog
from kafka_txn_sink.errors import CommitLogError, ConfigError, SupersededError
from kafka_txn_sink.protocol.messages import Decision, now_ms
from kafka_txn_sink.protocol.run_records import Owner, Release
from kafka_txn_sink.protocol.txn_ids import SLOTS

log = logging.getLogger(__name__)

# Attempts at recording a run number that another driver may record at the same moment.
CLAIM_ATTEMPTS = 8


@dataclass(frozen=True)
class RunRef:
    """What a task and the driver's later steps need of their run: its number and slot."""

    run: int
    slot: int


# Spark's driver sets this for every Python worker it starts for a driver step (its
# PythonPlannerRunner: the planner's `streamWriter()`/`writer()`, the commit worker): the
# driver's block manager directories, each named `blockmgr-<random UUID>` when the driver's
# SparkContext starts. So the value is the same in every such worker of one driver, whatever
# process forked it, and new in every driver (seen in PySpark 4.0, 4.2 and 4.3, daemon or not).
SPARK_DIRS_ENV = "SPARK_LOCAL_DIRS"
_BLOCK_MANAGER_DIR = re.compile(r"blockmgr-[0-9a-fA-F]{8}(?:-[0-9a-fA-F]{4}){3}-[0-9a-fA-F]{12}")
# Set by Spark's PythonWorkerFactory for every Python worker it starts (workers read them to
# connect back), and by nothing else. Not SPARK_BUFFER_SIZE or SPARK_AUTH_SOCKET_TIMEOUT:
# PySpark's SparkContext sets those in the driver's own Python process too.
_SPARK_WORKER_ENV = ("PYTHON_WORKER_FACTORY_PORT", "PYTHON_WORKER_FACTORY_SECRET")
# Outside Spark (tests, tools calling the driver steps in one process): this process, with a
# token so that a later process given the same pid is another driver.
_PROCESS_TOKEN = uuid.uuid4().hex[:12]


def driver_identity(environ: Mapping[str, str] | None = None) -> str:
    """This driver, as `host:blockmgr-<uuid>`: the block manager directory of the Spark driver
    whose Python worker this is (`SPARK_DIRS_ENV`), the same in each of its workers; outside
    a Spark worker, this process.

    Needs no process table (/proc), so it holds on macOS, in sandboxed workers and in workers
    forked by Spark's daemon, whose parents differ from step to step.

    Raises:
        ConfigError: this is a Spark Python worker, but without its driver's block manager
            directory: the steps of one driver could not be told from another driver's.
    """
    env = os.environ if environ is None else environ
    host = socket.gethostname()
    dirs = env.get(SPARK_DIRS_ENV, "")
    found = _BLOCK_MANAGER_DIR.search(dirs)
    if found is not None:
        return f"{host}:{found.group(0)}"
    if any(name in env for name in _SPARK_WORKER_ENV):
        raise ConfigError(
            f"kafka_txn cannot tell which Spark driver runs this step: the Python worker's "
            f"{SPARK_DIRS_ENV} is {dirs!r}, not the driver's block manager directory "
            f"(blockmgr-<uuid>) that Spark 4.0-4.3 give every driver-side Python worker. The "
            f"sink needs it to tell its own runs from another driver's (protocol/runs.py): "
            f"use a Spark whose driver passes it (Apache Spark 4.0 to 4.3 do), or report your "
            f"Spark distribution to the project"
        )
    return f"{host}:{os.getpid()}-{_PROCESS_TOKEN}"


def take_over(sink_id: str, commit_log: CommitLog, fresh_ms: int) -> Owner:
    """This driver's run: its own owner record if it is still the latest and not released,
    else a new one.

    A driver whose run was superseded (released or not: a superseded run releases its slot
    and then Spark still calls `streamWriter()` for its abort) is refused until the newer run
    has released, or been quiet (no owner record, no decision) for `fresh_ms`: until then it
    may be alive. After that the driver
    starts a new run, which supersedes the quiet one: a query restarted in the same driver.

    Raises:
        SupersededError: this driver's run was superseded by a run that may still be alive.
        CommitLogError: no run number could be recorded in CLAIM_ATTEMPTS tries.
    """
    me = driver_identity()
    for _ in range(CLAIM_ATTEMPTS):
        latest, released = commit_log.latest_owner(), commit_log.released_runs()
        if latest is not None and latest.run not in released and latest.driver == me:
            return latest  # every batch but a run's first: one listing and one read
        owners = commit_log.owners()
        mine = [o for o in owners if o.driver == me]
        if mine and latest is not None and _active(latest, released, commit_log, fresh_ms):
            raise superseded(sink_id, mine[-1], latest)
        wanted = Owner(
            sink_id=sink_id,
            run=latest.run + 1 if latest is not None else 0,
            slot=choose_slot(owners, released),
            driver=me,
            started_at_ms=now_ms(),
        )
        if commit_log.put_owner(wanted).driver == me:
            log.info("sink %s: this driver is %s", sink_id, wanted.describe())
            return wanted
    raise CommitLogError(
        f"could not record a run of sink {sink_id} in {commit_log.uri}: other drivers recorded "
        f"{CLAIM_ATTEMPTS} runs meanwhile"
    )


def _active(owner: Owner, released: set[int], commit_log: CommitLog, fresh_ms: int) -> bool:
    """Whether run `owner` may still be alive: not released, and seen to act (its owner
    record, or its latest decision) within `fresh_ms`."""
    if owner.run in released:
        return False
    seen = owner.started_at_ms
    latest = commit_log.latest_decision()
    if latest is not None and latest.run == owner.run:
        seen = max(seen, latest.decided_at_ms)
    return now_ms() - seen < fresh_ms


def choose_slot(owners: list[Owner], released: set[int]) -> int:
    """The lowest slot never used or released by its last holder; else the slot held longest,
    never the current owner's."""
    holders = {owner.slot: owner for owner in owners}
    free = [s for s in range(SLOTS) if s not in holders or holders[s].run in released]
    if free:
        return free[0]
    current = owners[-1].slot
    return min((o for s, o in holders.items() if s != current), key=lambda o: o.run).slot


def check_current(sink_id: str, commit_log: CommitLog, run: RunRef) -> None:
    """Stop a superseded run before it acts.

    Raises:
        SupersededError: the log has a newer owner record than `run`.
    """
    latest_run = commit_log.latest_run()
    if latest_run is None or latest_run <= run.run:
        return
    owners = commit_log.owners()
    latest = owners[-1] if owners else None
    mine = next((o for o in owners if o.run == run.run), None)
    raise superseded(sink_id, mine, latest)


def check_decided_by(decision: Decision, run: RunRef, commit_log: CommitLog) -> None:
    """A batch decided by a newer run means this run was superseded.

    Raises:
        SupersededError: `decision` is a newer run's.
    """
    if decision.run is None or decision.run <= run.run:
        return
    owners = {o.run: o for o in commit_log.owners()}
    raise superseded(decision.sink_id, owners.get(run.run), owners.get(decision.run), decision)


def superseded(
    sink_id: str, mine: Owner | None, newer: Owner | None, decision: Decision | None = None
) -> SupersededError:
    """The error of a run that found a newer one: it names both, and what happens next."""
    this = mine.describe() if mine is not None else "this driver's run"
    other = newer.describe() if newer is not None else "a newer run"
    what = f" (it decided batch {decision.batch_id})" if decision is not None else ""
    return SupersededError(
        f"sink {sink_id}: {this} was superseded by {other}{what}, which now owns the sink. "
        f"This driver decides nothing more and stops; the batches it prepared are aborted or "
        f"left to the newer run, so nothing is lost or written twice. If the newer run is a job "
        f"retry, stop this one; if you want this one to run, stop the newer one first."
    )


def release(sink_id: str, commit_log: CommitLog, run: RunRef) -> None:
    """Free this run's slot for the next run (best effort: a run that never releases has its
    slot taken back by `choose_slot` when the pool is full)."""
    try:
        commit_log.put_release(Release(sink_id=sink_id, run=run.run, released_at_ms=now_ms()))
    except CommitLogError as exc:
        log.warning("could not record the release of run %d of sink %s: %s", run.run, sink_id, exc)


def may_abort(
    slot: int | None, run: RunRef | None, owners: list[Owner], latest: Decision | None
) -> bool:
    """Whether a driver of `run` may abort an open, undecided transaction of id slot `slot`.

    Its own slot's, yes (it runs the clean-up only when none of its tasks runs). Another run's
    only when a newer run decided a batch since: that run then cannot pass its commit of that
    batch, so it decides nothing more. Ids from before slots existed count as the oldest run's.
    Without a run (the CLI, which checks the query is stopped itself), yes.
    """
    if run is None or slot == run.slot:
        return True
    holder = slot_holder(slot, owners)
    return _decided_since(holder.run if holder is not None else -1, latest)


def slot_holder(slot: int | None, owners: list[Owner]) -> Owner | None:
    """The run that last took id slot `slot` (owners by run number ascending); None for an id
    without a slot or a slot no recorded run took: such ids count as the oldest run's."""
    holders = {owner.slot: owner for owner in owners}
    return holders.get(slot) if slot is not None else None


def _decided_since(run: int, latest: Decision | None) -> bool:
    """Whether a newer run than `run` decided a batch: `run` can then decide nothing more."""
    return latest is not None and latest.run is not None and run < latest.run


def standing(
    slot: int | None, owners: list[Owner], released: set[int], latest: Decision | None
) -> tuple[bool, str]:
    """Whether a run may still decide an open, undecided transaction of id slot `slot`, and
    why: for a reader outside every run (the CLI), from the owner records alone.

    No run can once the slot's holder released it, or once a newer run decided a batch (the
    holder's commit of any batch then fails: `may_abort`'s rule). Otherwise its run may still
    decide it; and so may an unknown one when no recorded run holds the slot and no run has
    decided anything (a log from before runs, or a reader that cannot tell).
    """
    holder = slot_holder(slot, owners)
    if holder is not None and holder.run in released:
        return False, f"{holder.describe()} released its slot"
    number = holder.run if holder is not None else -1
    if latest is not None and latest.run is not None and _decided_since(number, latest):
        since = f"run {latest.run} decided batch {latest.batch_id} since"
        if holder is None:
            return False, f"{_unheld(slot)}, counted as the oldest run's, superseded: {since}"
        return False, f"{holder.describe()} was superseded: {since}"
    if holder is None:
        return True, f"{_unheld(slot)}, and no run has decided a batch that would supersede it"
    newest = owners[-1]
    if newest.run == holder.run:
        return True, f"{holder.describe()} is the latest owner and not released"
    return True, (
        f"{holder.describe()} is not released and no newer run has decided a batch since "
        f"(the latest owner is run {newest.run})"
    )


def _unheld(slot: int | None) -> str:
    if slot is None:
        return "its id has no slot (the republish id, or an id from before slots)"
    return f"no recorded run holds its slot {slot}"
