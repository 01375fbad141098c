"""Breadth-first exploration of every interleaving, so the first violation found has a
shortest trace."""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field

from model.txn_model.commit_log import Kind
from model.txn_model.config import Config, Variant
from model.txn_model.keyed import KEYED_PHASES
from model.txn_model.offsets import PROGRESS
from model.txn_model.oracle import final_violation, left_open, violation
from model.txn_model.protocol import PHASES, successors
from model.txn_model.repair import took_together
from model.txn_model.state import Status, World, initial_world


class StateCapExceeded(RuntimeError):
    """The exploration reached `Config.max_states` before it finished."""


@dataclass
class Result:
    """What one exploration found."""

    config: Config
    states: int
    seconds: float
    violation: str | None = None
    trace: list[str] = field(default_factory=list)
    final_states: int = 0
    final_with_open_txns: int = 0
    stops: dict[str, int] = field(default_factory=dict)  # final states by how runs ended
    finished_after_repair: int = 0  # final states in which a run finished and a repair exists
    offsets_only_repairs: int = 0  # of those, with a repair of the batch's offsets alone
    finished_after_union: int = 0  # final states in which a run finished after a union repair
    finished_with_refused: int = 0  # final states in which a run finished, rows refused (excused)

    @property
    def ok(self) -> bool:
        """Whether every state and every final state kept the rules."""
        return self.violation is None


def explore(config: Config) -> Result:
    """Visit every reachable state of `config`, stopping at the first violation.

    Raises:
        StateCapExceeded: more than `config.max_states` states are reachable.
    """
    started = time.monotonic()
    start = initial_world(config)
    parents: dict[World, tuple[World | None, str]] = {start: (None, "")}
    queue = deque([start])
    phases = KEYED_PHASES if config.variant is Variant.KEYED else PHASES
    result = Result(config, 0, 0.0)
    while queue:
        world = queue.popleft()
        result.states += 1
        problem = violation(world, config)
        enabled = 0
        if problem is None:
            for label, after in successors(world, config, phases):
                enabled += 1
                if after not in parents:
                    if len(parents) >= config.max_states:
                        raise StateCapExceeded(
                            f"more than {config.max_states} states for {config.describe()}: "
                            "lower a bound or raise --max-states"
                        )
                    parents[after] = (world, label)
                    queue.append(after)
            if enabled == 0:
                problem = _final(world, config, result)
        if problem is not None:
            result.violation = problem
            result.trace = _trace(parents, world)
            break
    result.seconds = time.monotonic() - started
    return result


def _final(world: World, config: Config, result: Result) -> str | None:
    result.final_states += 1
    if left_open(world) and any(d.status is Status.FINISHED for d in world.drivers):
        result.final_with_open_txns += 1
    for driver in world.drivers:
        result.stops[driver.status.value] = result.stops.get(driver.status.value, 0) + 1
    finished = any(d.status is Status.FINISHED for d in world.drivers)
    repairs = [e for e in world.log if e.kind is Kind.REPAIR]
    if finished and repairs:
        result.finished_after_repair += 1
    if finished and any({p.partition for p in e.participants} == {PROGRESS} for e in repairs):
        result.offsets_only_repairs += 1
    if finished and config.regroup and any(e.refused for e in repairs):
        result.finished_with_refused += 1
    if finished and config.regroup and any(took_together(world, config, e) for e in repairs):
        result.finished_after_union += 1
    return final_violation(world, config)


def _trace(parents: dict[World, tuple[World | None, str]], world: World) -> list[str]:
    steps: list[str] = []
    current: World | None = world
    while current is not None:
        parent, label = parents[current]
        if parent is not None:
            steps.append(label)
        current = parent
    return list(reversed(steps))
