"""What a read_committed consumer must see, checked in every state and at the end.

In every state:
- no row is visible twice;
- every visible row comes from a participant of its batch's decision or of one of its repairs
  (nothing of an undecided batch, nor of an attempt neither lists);
- no decided participant (nor repair participant) is lost: its rows are visible, or its
  transaction is still open or being committed under exactly its triple, unless the
  coordinator's timeout aborted it (the protocol's one stated bound).

At the end (no step enabled): no run is stuck; and once some run finished the query, every row
of every batch is visible, but for participants the coordinator's timeout aborted (with
`Config.repair`, none: the replay must have repaired them; with `Config.regroup`, none but
rows a repair refused because no set of its replay's transactions held exactly lost rows,
`repair.excused`), and, when
runs never overlapped and no zombie attempt ran, no transaction is left open. With
`Config.progress`, also: some run finished, unless a driver crashed or a transaction timed out.

Rows are counted one by one (`coordinator.Row`): with `Config.regroup` a partition holds two,
and a transaction may hold rows of several partitions of the first computation.
"""

from __future__ import annotations

from collections import Counter

from model.txn_model import commit_log as cl
from model.txn_model import offsets, repair
from model.txn_model.config import Config
from model.txn_model.coordinator import Row, TxnState, held_in
from model.txn_model.state import Status, World

COMMITTABLE = (TxnState.ONGOING, TxnState.PREPARE_COMMIT)


def violation(world: World, config: Config) -> str | None:
    """The first safety rule `world` breaks, or None."""
    counts = Counter(row for row, _ in world.visible)
    for row, count in sorted(counts.items()):
        if count > 1:
            return f"duplicate: {_rows(config, row)} visible {count} times"
    settled = cl.settled_entries(world.log, config.variant)
    for row, triple in world.visible:
        allowed = {p.triple for e in settled if e.batch == row[0] for p in e.participants}
        if triple not in allowed:
            return f"{_rows(config, row)} visible from undecided {triple}"
    for decision in settled:
        batch = decision.batch
        for participant in decision.participants:
            rows = repair.rows_of(config, batch, participant.partition, participant.group)
            if all(row in counts for row in rows) or participant.triple in world.timed_out:
                continue
            if participant.partition == offsets.PROGRESS:
                continue  # aborted with a lost row on purpose; the group's rules judge it
            if held_in(world.coordinator, participant.triple, COMMITTABLE):
                continue
            return (
                f"decided batch lost: batch {batch} partition {participant.partition} "
                f"{participant.triple} was aborted (not by the coordinator's timeout)"
            )
    return offsets.violation(world, config) if config.offsets else None


def final_violation(world: World, config: Config) -> str | None:
    """What is wrong with a state in which no process can take a step, if anything."""
    for driver in world.drivers:
        if driver.alive:
            return f"{driver.name()} is stuck at batch {driver.batch}: {driver.phase.value}"
    if not any(d.status is Status.FINISHED for d in world.drivers):
        return _no_progress(world, config)
    visible = {row for row, _ in world.visible}
    excused: set[Row] = {
        row
        for d in cl.decisions(world.log, config.variant).values()
        for p in d.participants
        if p.triple in world.timed_out and not config.repair  # a finished run repaired them
        for row in repair.rows_of(config, d.batch, p.partition, p.group)
    }
    if config.regroup:
        excused |= repair.excused(world, config)
    for batch in range(config.batches):
        for row in repair.batch_rows(config, batch):
            if row not in visible and row not in excused:
                missing = _rows(config, row)
                return f"query finished but {missing} {'is' if config.regroup else 'are'} missing"
    if not config.concurrent and config.zombies == 0 and left_open(world):
        return "query finished (runs one after another) but a transaction is left open"
    return offsets.final_violation(world, config) if config.offsets else None


def _rows(config: Config, row: Row) -> str:
    """How a violation names `row`: the rows of a partition (one row stands for them), or with
    `Config.regroup` the row itself."""
    batch, partition, index = row
    if config.regroup:
        return f"row {index} of batch {batch} partition {partition}"
    return f"rows of batch {batch} partition {partition}"


def _no_progress(world: World, config: Config) -> str | None:
    """With `config.progress`: no run finished, though no driver crashed, no transaction
    timed out and every write's outcome was known to its writer."""
    faults = world.used.crashes or world.used.timeouts or world.used.late_writes
    if not config.progress or faults:
        return None
    ends = ", ".join(f"{d.name()} {d.status.value} ({d.reason})" for d in world.drivers)
    return f"no run finished the query, and no driver crashed: {ends}"


def left_open(world: World) -> int:
    """Transactions still open in a final state (the coordinator's timeout would end them)."""
    return sum(1 for _, txn in world.coordinator if txn.state is TxnState.ONGOING)
