"""What one exploration covers: the protocol variant and the bounds on every fault."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum


class Variant(str, Enum):
    """Which protocol the drivers and tasks follow."""

    CURRENT = "current"
    """What the product does today: ids `{sinkId}-{partition}` shared by every run, one
    put-if-absent decision record per batch, a clean-up that aborts every open transaction of
    the sink that no incomplete decision holds."""

    OWNED = "owned"
    """Run-scoped ids `{sinkId}-{slot}-{partition}` from a bounded pool of slots, and the commit
    log as a put-if-absent sequence with owner entries (see README.md, "The owned rules")."""

    KEYED = "keyed"
    """What the product builds (kafka_txn_sink/protocol/runs.py): the owned ids and slots, but
    log records put-if-absent per key (owner per run number, decision per batch, first wins),
    so nothing orders an owner record against a decision; an older run's decision written after
    a newer owner record still counts (see README.md, "The keyed variant")."""


TXN_IDS = ("pool", "attempt", "unique")
OFFSETS = ("", "participant", "fenced", "plain", "first", "blind")
"""How a batch's input end offsets reach a consumer group (issue 27, offsets.py): not at all,
the progress participant the product builds, the fenced commit after the completion it builds
for a group on another cluster, or a rejected design (README.md, "Consumer-group
progress")."""
REPAIR_FLAWS = ("", "loss-recorded", "in-doubt", "ordered-digest", "per-task-only", "union-partial")
"""Repair designs rejected (issues 26, 39), each with its counterexample (README.md, "Repair
rounds"): `loss-recorded`, Spark may record a batch once no loss is recorded (not: once every
row is committed); `in-doubt`, a participant the brokers have not finished counts as lost;
`ordered-digest`, the digest a repair matches by includes the order of the records (the
product's first digest, CRC streams over the records in order), not only which they are.
With `Config.regroup`: `per-task-only`, a repair pairs lost participants with replayed tasks
one by one and never takes the remaining ones together (the matching before issue 39's union
rule); `union-partial`, the union rule takes the remaining replayed tasks when their records
together *include* the remaining lost participants' (a superset), not only when they are the
same."""


@dataclass(frozen=True)
class Config:
    """Bounds of one exploration. Every fault count is a budget over the whole run."""

    variant: Variant = Variant.CURRENT
    batches: int = 2
    partitions: int = 2
    drivers: int = 2
    """Runs of the query that may start in all (the first, restarts, and a second driver
    started while an earlier one still lives)."""
    concurrent: bool = True
    """Whether a new run may start while an earlier run is still alive (frozen or not);
    otherwise only after every earlier run crashed or stopped."""
    crashes: int = 0
    """Driver crashes; a crash also ends that run's tasks."""
    timeouts: int = 0
    """Coordinator timeouts, each aborting one Ongoing transaction at any moment."""
    late_attempts: int = 0
    """Task attempts that start after their batch was decided (zombies of abandoned stage
    attempts that start late)."""
    retries: int = 0
    """Task attempts that fail (after init, or after producing) and are retried by Spark."""
    zombies: int = 0
    """Task attempts that run at any moment beside the attempt whose result is used."""
    slots: int = 2
    """Size of the pool of run slots (variants owned and keyed)."""
    cleanup_reads_log_first: bool = False
    """The clean-up reads the log before it describes the ids: the wrong order, kept to show
    why owned rule 8 describes first."""
    keyed_fixes: bool = False
    """Variant keyed with the changes proposed to the product (README.md, "The keyed
    variant"): commit() of a superseded run aborts its own undecided transactions before it
    raises, and abort()'s streamWriter() refuses a driver whose run was released (as it refuses
    one whose run was superseded); a decision conflict with an older run's decision rolls that
    decision forward instead of failing the batch."""
    late_writes: int = 0
    """Commit-log writes whose outcome their writer does not learn (a timeout, a 5xx): the
    request may still land at any later moment, or never. The writer treats it as failed."""
    outcome_register: bool = False
    """Variant keyed with one outcome per decision key: `abort()` races `commit()` for the key
    with an abort record (put-if-absent) and aborts nothing while the batch's outcome is in
    doubt; a replay decides at the next round (docs/protocol.md, "One outcome per key")."""
    txn_ids: str = "pool"
    """Which transactional id a task attempt uses (variants owned and keyed): `pool`, the
    product's `s-{slot}-{p}`; `attempt`, `s-{slot}-{p}-{a}` with the task's attempt number (a
    zombie is attempt 0, the attempt Spark uses beside it attempt 1, a retry one more); `unique`,
    `s-{slot}-{p}-{batch}-{a}`, an id no other attempt of any batch shares (unbounded in the
    product). The clean-up sweeps every open id of the sink in all three."""
    repair: bool = False
    """Variant keyed with repair rounds (issue 26): a completion records the partitions whose
    transaction the brokers aborted; a replay of the batch writes exactly those again and
    commit() puts a repair record (put-if-absent per batch and level) naming the new
    participants; a batch left with a loss fails. Needs `outcome_register`."""
    repair_flaw: str = ""
    """With `repair`: one of `REPAIR_FLAWS`, a rejected design in place of the sound one."""
    reorder: int = 0
    """Task attempts (those whose message the driver uses, replays included) that produce their
    partition's rows in another order than the query's first computation (issue 39: a shuffle
    before the sink). With `repair`, a replayed task repairs a lost participant only if their
    digests are equal: the product's digest (a multiset) ignores the order, the flaw
    `ordered-digest` does not."""
    regroup: int = 0
    """Replays (repair launches) that assign the batch's rows to tasks otherwise than the
    query's first computation (issue 39: Spark's round-robin `repartition(n)`, whose start
    depends on the map task's number, which a replay may renumber). Each partition of the first
    computation then holds two rows, and every task of a repair replay writes (as the product's
    do), not only those of the lost partitions. A repair pairs lost participants with replayed
    tasks by digest, then takes the remaining replayed tasks together for the remaining lost
    participants when their digests together are equal (repair.py `matched`)."""
    offsets: str = ""
    """With `repair`: one of `OFFSETS` (offsets.py)."""
    abort_leaves_progress: bool = False
    """With `offsets` `participant`: the product before review N8 fixed it. abort() knows only
    the tasks' messages (Spark hands it nothing else, in another process than commit()'s), so
    after a decision write in doubt it closes the round with its abort record, aborts the
    tasks' transactions and returns, leaving the progress transaction open until the
    coordinator's timeout. The sound design runs the clean-up there, which aborts this run's
    open transactions that no incomplete decision holds (the progress one among them)."""
    commit_without_start: bool = False
    """The commit worker's `streamWriter()` does no start of its own (issue 43 item 3): no roll
    forward, no check that its run is current; `commit()` takes the planner's run from the
    tasks' messages and goes straight to its own checks (the newer-run check before the
    decision among them). abort()'s writer still starts as before."""
    progress: bool = False
    """Also require, in a final state, that some run finished the query unless a driver crashed
    or the coordinator timed out a transaction: overlapping drivers alone must not stop it."""
    max_states: int = 2_000_000

    def describe(self) -> str:
        """One line naming every bound, for reports."""
        parts = [
            f"variant={self.variant.value}",
            f"batches={self.batches}",
            f"partitions={self.partitions}",
            f"drivers={self.drivers}",
            f"concurrent={'yes' if self.concurrent else 'no'}",
            f"crashes={self.crashes}",
            f"timeouts={self.timeouts}",
            f"late_attempts={self.late_attempts}",
            f"retries={self.retries}",
            f"zombies={self.zombies}",
        ]
        if self.variant is not Variant.CURRENT:
            parts.append(f"slots={self.slots}")
        if self.cleanup_reads_log_first:
            parts.append("cleanup_reads_log_first")
        if self.keyed_fixes:
            parts.append("keyed_fixes")
        if self.late_writes:
            parts.append(f"late_writes={self.late_writes}")
        if self.outcome_register:
            parts.append("outcome_register")
        if self.txn_ids != "pool":
            parts.append(f"txn_ids={self.txn_ids}")
        if self.repair:
            parts.append(f"repair={self.repair_flaw}" if self.repair_flaw else "repair")
        if self.reorder:
            parts.append(f"reorder={self.reorder}")
        if self.regroup:
            parts.append(f"regroup={self.regroup}")
        if self.offsets:
            parts.append(f"offsets={self.offsets}")
        if self.abort_leaves_progress:
            parts.append("abort_leaves_progress")
        if self.commit_without_start:
            parts.append("commit_without_start")
        if self.progress:
            parts.append("progress")
        return " ".join(parts)
