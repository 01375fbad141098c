"""One state of the whole system: brokers, commit log, Spark's checkpoint, drivers and tasks.

Every part is an immutable tuple, so a state hashes and the explorer can remember it.
"""

from __future__ import annotations

from enum import Enum
from typing import NamedTuple

from model.txn_model.commit_log import Entry, Log
from model.txn_model.config import Config, Variant
from model.txn_model.coordinator import Coordinator, Row, Triple


class Phase(str, Enum):
    """Where a driver is in a batch; each is one atomic step (or a loop of them)."""

    OWN = "append its owner entry"
    START_ROLL = "streamWriter(): roll forward"
    LAUNCH = "launch the tasks"
    WAIT = "collect the tasks' messages"
    COMMIT_ROLL = "commit worker's streamWriter(): roll forward"
    DECIDED_CHECK = "commit(): batch decided? messages complete?"
    PREPARE_CHECK = "commit(): prepare check"
    DECIDE = "commit(): write the decision"
    PHASE2 = "commit(): EndTxn(commit) and completion"
    SWEEP_DESCRIBE = "clean-up: DescribeTransactions of the sink's ids"
    SWEEP_READ = "clean-up: read the log"
    SWEEP_ABORT = "clean-up: EndTxn(abort)"
    SPARK_COMMIT = "Spark records the batch in its checkpoint"
    # keyed only: the checks and Spark's abort() as the product makes them
    START_CHECK = "streamWriter(): check current"
    COMMIT_CHECK = "commit worker's streamWriter(): check current"
    ABORT_TAKE_OVER = "abort()'s streamWriter(): record a new run"
    ABORT_ROLL = "abort()'s streamWriter(): roll forward"
    ABORT_CHECK = "abort()'s streamWriter(): check current"
    ABORT_TXNS = "abort(): EndTxn(abort) of its own undecided transactions"
    ABORT_DONE = "abort() returns: the query stops"
    # keyed with repair rounds (issue 26)
    REPAIR_CHECK = "commit(): prepare check of the repair's transactions"
    REPAIR_PUT = "commit(): put the repair record"
    # keyed with consumer-group offsets (issue 27)
    OFFSETS_OPEN = "commit(): open the progress transaction"
    OFFSETS_PLAIN = "commit(): plain OffsetCommit (a rejected design)"
    FENCE_INIT = "commit(): InitProducerId of the sink's group id on the input cluster"
    FENCE_READ = "commit(): OffsetFetch (stable) of the group"
    FENCE_SEND = "commit(): AddOffsetsToTxn and TxnOffsetCommit of the newer offsets"
    FENCE_END = "commit(): EndTxn(commit) of the group's transaction"


class Status(str, Enum):
    """A driver's life."""

    RUNNING = "running"
    CRASHED = "crashed"
    FAILED = "failed"  # a batch failed; Spark stops the query (a restart is a new run)
    SUPERSEDED = "superseded"  # stopped with an error naming the newer run
    FINISHED = "finished"  # every batch done


class Message(NamedTuple):
    """What a task attempt returns to the driver (a TaskCommit)."""

    partition: int
    status: str  # "prepared", "skipped", "failed" or "empty" (no rows: no transaction)
    triple: Triple | None
    order: int = 0  # the order its rows were produced in: 0 the first computation's, 1 another
    group: int = 0  # which rows its task had (`Config.regroup`, repair.py `GROUPS`): 0 the first's


class Driver(NamedTuple):
    """One run of the query: a driver with its volatile memory."""

    run: int
    slot: int  # owned: the run's slot; -1 before its owner entry, and in current
    status: Status
    reason: str
    batch: int
    phase: Phase
    first_batch: int = 0  # the batch it started with
    messages: tuple[Message, ...] = ()
    seen: tuple[Triple, ...] = ()  # open transactions the clean-up described
    held: tuple[Triple, ...] = ()  # what the log held when the clean-up read it
    targets: tuple[Triple, ...] = ()  # what the clean-up will abort
    label: str = "run"  # how traces name it ("driver" in keyed, where runs are numbered apart)
    number: int = -1  # keyed: the run number of its owner record
    released: bool = False  # keyed: it recorded release(number)
    abort_run: tuple[int, int] | None = None  # keyed: (number, slot) abort()'s writer recorded
    ending: Status | None = None  # keyed: in abort(), how the run ends when it returns
    repair: tuple[int, tuple[int, ...]] = (0, ())  # repair: (level, partitions) it planned
    fence: tuple[Triple, int] | None = None  # offsets fenced: its group transaction, the target
    abort_held: int = -1  # keyed: the batch whose open round abort()'s own record closed

    @property
    def alive(self) -> bool:
        """Whether this run can still take steps."""
        return self.status is Status.RUNNING

    def name(self) -> str:
        """How traces name this driver."""
        return f"{self.label} {self.run}"

    def attempt(self, batch: int, partition: int, kind: AttemptKind) -> Task:
        """A new attempt of one of this driver's tasks, at its first step."""
        return Task(self.run, self.slot, batch, partition, kind, TaskStep.CHECK, label=self.label)


class AttemptKind(str, Enum):
    """Why a task attempt exists."""

    PRIMARY = "attempt"  # the attempt whose message the driver receives
    LATE = "late attempt"  # starts after its batch was decided
    ZOMBIE = "zombie attempt"  # runs beside the primary attempt, its result ignored


class TaskStep(str, Enum):
    """Where a task attempt is."""

    CHECK = "check the log"
    INIT = "init_transactions"
    PRODUCE = "produce and flush"
    DONE = "done"


class Task(NamedTuple):
    """One task attempt of a run's batch."""

    run: int
    slot: int
    batch: int
    partition: int
    kind: AttemptKind
    step: TaskStep
    triple: Triple | None = None
    result: str = ""
    label: str = "run"  # its driver's label
    attempt: int = 0  # Spark's attempt number: a zombie 0, the attempt used beside it 1
    repair: int = 0  # repair: the level it writes for (0: the batch's first attempt)
    order: int = 0  # the order it produced its rows in (`Config.reorder`)
    group: int = 0  # how its replay assigned the batch's rows to tasks (`Config.regroup`)

    def name(self) -> str:
        """How traces name this attempt."""
        at = f" repair {self.repair}" if self.repair else ""
        return f"{self.label} {self.run} {self.kind.value} b{self.batch}p{self.partition}{at}"


class Used(NamedTuple):
    """How much of each fault budget is spent."""

    runs: int = 0
    crashes: int = 0
    timeouts: int = 0
    late_attempts: int = 0
    retries: int = 0
    zombies: int = 0
    late_writes: int = 0
    reorders: int = 0
    regroups: int = 0


class World(NamedTuple):
    """The whole system at one moment."""

    coordinator: Coordinator
    visible: tuple[tuple[Row, Triple], ...]  # committed rows, with the transaction of each
    log: Log
    spark_commits: frozenset[int]  # batches Spark recorded as done in the checkpoint
    drivers: tuple[Driver, ...]
    tasks: tuple[Task, ...]
    used: Used
    timed_out: frozenset[Triple]  # transactions the coordinator's timeout aborted
    in_flight: tuple[Entry, ...] = ()  # log writes sent whose writer gave up on them
    group: tuple[int, int] = (-1, -1)  # offsets: the batch the group holds, the highest it held


def first_phase(variant: Variant) -> Phase:
    """Where a new run starts."""
    return Phase.START_ROLL if variant is Variant.CURRENT else Phase.OWN


def new_driver(world: World, config: Config) -> Driver:
    """A run started on the checkpoint: it goes on with the first batch Spark has not recorded."""
    batch = min(b for b in range(config.batches) if b not in world.spark_commits)
    phase = first_phase(config.variant)
    label = "driver" if config.variant is Variant.KEYED else "run"
    index = world.used.runs
    return Driver(index, -1, Status.RUNNING, "", batch, phase, first_batch=batch, label=label)


def initial_world(config: Config) -> World:
    """Nothing happened yet: run 0 is about to start."""
    empty = World((), (), (), frozenset(), (), (), Used(), frozenset())
    first = new_driver(empty, config)
    return empty._replace(drivers=(first,), used=Used(runs=1))
