"""Named protocol steps where a test can make a task or the driver block, fail or die.

Inert unless `KAFKA_TXN_SINK_FAILPOINTS` is set, e.g.
`KAFKA_TXN_SINK_FAILPOINTS="driver.after_decision=block;task.after_produce=raise-once"`
with `KAFKA_TXN_SINK_FAILPOINT_DIR` naming a directory for the signal files, and the test
switch `KAFKA_TXN_SINK_TESTING=1` is set too (`environment` gives all three): a failpoint
variable left in a job's environment is ignored, with a warning, rather than fail or block a
production sink.

- `<dir>/<name>.reached` is written each time a failpoint fires (with the pid and batch);
- `block` waits until `<dir>/<name>.release` exists (bounded by `KAFKA_TXN_SINK_FAILPOINT_MAX_S`);
- `raise` raises `FailpointError`; `raise-once` raises only the first time (across processes);
- `kill` sends SIGKILL to the firing process's group. Spark's Python daemon puts its workers,
  where `commit()` runs too, in a group of their own, so this spares the driver's JVM: to kill
  a whole query, `block` it and kill its group from outside (tests/e2e/harness.py `kill_group`).

An action may be limited to one batch with `@batch`, e.g. `driver.after_decision=block@2`.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import time
from pathlib import Path

ENV = "KAFKA_TXN_SINK_FAILPOINTS"
ENV_DIR = "KAFKA_TXN_SINK_FAILPOINT_DIR"
ENV_MAX = "KAFKA_TXN_SINK_FAILPOINT_MAX_S"
ENV_SWITCH = "KAFKA_TXN_SINK_TESTING"
VARIABLES = (ENV, ENV_DIR, ENV_MAX, ENV_SWITCH)
"""Every variable of the failpoints, e.g. to hand them on to executors."""

log = logging.getLogger(__name__)
_warned = False

# Every failpoint the protocol has, in protocol order.
TASK_POINTS = ("task.after_init", "task.after_produce", "task.after_flush")
DRIVER_POINTS = (
    "driver.before_prepare_check",
    "driver.before_decision",
    "driver.after_decision",
    "driver.after_first_endtxn",
    "driver.after_completion",
    "driver.before_cleanup",
)
# Reached only when recovery republishes the file references of a batch the broker aborted.
REPUBLISH_POINTS = ("driver.republish_prepared", "driver.republish_recorded")
# Reached only with option consumerGroup: the rows are visible, the group's offsets not yet.
PROGRESS_POINTS = ("driver.before_progress_endtxn",)
# Reached only with the group on another cluster: the rows are visible, the group not moved yet.
ACROSS_POINTS = ("driver.before_group_commit",)
# Reached at each start of a streaming batch on the driver (protocol/start.py): the planner's,
# and the commit worker's only when the tasks' messages do not carry the planner's run.
START_POINTS = ("driver.start",)
ALL_POINTS = (
    TASK_POINTS + DRIVER_POINTS + REPUBLISH_POINTS + PROGRESS_POINTS + ACROSS_POINTS + START_POINTS
)


class FailpointError(RuntimeError):
    """Raised by a failpoint set to `raise`: an injected failure, never a real one."""


def environment(spec: str, directory: Path | str, max_s: float | None = None) -> dict[str, str]:
    """The environment that arms failpoints `spec` in a test's processes (and the Spark
    workers they start): signal files in `directory`, blocks bounded by `max_s`, the switch."""
    armed = {ENV: spec, ENV_DIR: str(directory), ENV_SWITCH: "1"}
    if max_s is not None:
        armed[ENV_MAX] = str(max_s)
    return armed


def fire(name: str, batch_id: int | None = None) -> None:
    """Run the action configured for `name`, if any. Costs one dict lookup when inert."""
    spec = os.environ.get(ENV)
    if not spec:
        return
    if os.environ.get(ENV_SWITCH) != "1":
        _warn_ignored()
        return
    if name not in ALL_POINTS:
        raise ValueError(f"unknown failpoint {name!r}")
    action = _actions(spec).get(name)
    if action is None:
        return
    verb, _, only_batch = action.partition("@")
    if only_batch and batch_id is not None and int(only_batch) != batch_id:
        return
    directory = Path(os.environ.get(ENV_DIR) or ".")
    if verb == "raise-once" and not _first_time(directory, name):
        return
    _signal(directory, name, batch_id)
    if verb == "block":
        _block(directory, name)
    elif verb in {"raise", "raise-once"}:
        raise FailpointError(f"failpoint {name} fired (batch {batch_id})")
    elif verb == "kill":
        os.killpg(os.getpgid(0), signal.SIGKILL)
    elif verb != "signal":
        raise ValueError(f"unknown failpoint action {verb!r} for {name}")


def _warn_ignored() -> None:
    global _warned
    if not _warned:
        _warned = True
        log.warning(
            "%s is set but ignored: failpoints are a test facility, armed only with %s=1; "
            "remove %s from this job's environment",
            ENV,
            ENV_SWITCH,
            ENV,
        )


def reached(directory: Path, name: str) -> bool:
    """Whether failpoint `name` has fired (its signal file exists in `directory`)."""
    return (directory / f"{name}.reached").exists()


def release(directory: Path, name: str) -> None:
    """Let a process blocked at failpoint `name` go on."""
    (directory / f"{name}.release").touch()


def _actions(spec: str) -> dict[str, str]:
    actions = {}
    for item in spec.split(";"):
        if item.strip():
            key, _, value = item.partition("=")
            actions[key.strip()] = value.strip()
    return actions


def _first_time(directory: Path, name: str) -> bool:
    try:
        fd = os.open(directory / f"{name}.once", os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    except FileExistsError:
        return False
    os.close(fd)
    return True


def _signal(directory: Path, name: str, batch_id: int | None) -> None:
    line = json.dumps({"pid": os.getpid(), "batch": batch_id, "at": time.time()})
    with open(directory / f"{name}.reached", "a") as out:
        out.write(line + "\n")


def _block(directory: Path, name: str) -> None:
    deadline = time.monotonic() + float(os.environ.get(ENV_MAX, "600"))
    while not (directory / f"{name}.release").exists():
        if time.monotonic() > deadline:
            raise FailpointError(f"failpoint {name} was never released")
        time.sleep(0.05)
