"""The kinds of the errors tasks failed with, left next to the commit log for the metrics.

Spark tells the driver nothing of a failed task: `abort()` gets `None` in its place, and a task
that Spark retried and that then succeeded leaves no trace at all. So a task attempt that
raises leaves a small record of its own under `_task_errors/` at the commit log's location (the
same place in both log formats: Delta ignores folders whose name starts with `_`), holding its
batch, run, partition, attempt, when, and the error's kind (the sink's error class, else
`other`, as protocol/causes.py's `cause_of` gives it: never the message, which may carry what
a user passed in).

Best effort, on purpose: a task that is killed writes nothing, and a record that cannot be
written (an executor without write access to the log's location) is logged and forgotten, never
raised over the task's own error. Nothing reads these records but the metrics (the protocol
never does), so they may be deleted at any time.
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Callable
from dataclasses import dataclass

from kafka_txn_sink.protocol.causes import OTHER
from kafka_txn_sink.storage import Storage

log = logging.getLogger(__name__)

PREFIX = "_task_errors/"
_NAME = re.compile(r"_task_errors/(\d{20})-(\d{10})-(\d{6})-(\d{4})\.json")
_KIND = re.compile(r"[A-Za-z][A-Za-z0-9_]{0,99}")


@dataclass(frozen=True)
class TaskError:
    """One failed task attempt."""

    batch_id: int
    run: int
    partition: int
    attempt: int
    kind: str  # the sink's error class that it raised, or `other`
    at_ms: int

    @property
    def name(self) -> str:
        """Its object's name: in batch order, then run, partition and attempt."""
        return name_of(self.batch_id, self.run, self.partition, self.attempt)


def name_of(batch_id: int, run: int, partition: int, attempt: int) -> str:
    """The name of a task error record."""
    return f"{PREFIX}{batch_id:020d}-{run:010d}-{partition:06d}-{attempt:04d}.json"


def leave(storage: Storage, error: TaskError) -> None:
    """Write `error`'s record (put-if-absent: a retried write keeps the first); any failure is
    logged, never raised."""
    body = {
        "kind": "task_error",
        "version": 1,
        "batch": error.batch_id,
        "run": error.run,
        "partition": error.partition,
        "attempt": error.attempt,
        "error": error.kind,
        "at_ms": error.at_ms,
    }
    try:
        storage.put_if_absent(error.name, json.dumps(body, sort_keys=True).encode())
    except Exception as exc:  # the task's own error is the one to raise
        log.warning(
            "could not leave the kind of task %d's error (batch %d) at %s: %s",
            error.partition,
            error.batch_id,
            storage.uri,
            type(exc).__name__,
        )


def _parse(name: str, data: bytes | None) -> TaskError | None:
    match = _NAME.fullmatch(name)
    if match is None or data is None:
        return None
    try:
        body = json.loads(data)
        kind = str(body["error"])
        at_ms = int(body["at_ms"])
    except (ValueError, KeyError, TypeError):
        log.warning("skipping %s: not a task error record", name)
        return None
    batch_id, run, partition, attempt = (int(g) for g in match.groups())
    return TaskError(
        batch_id, run, partition, attempt, kind if _KIND.fullmatch(kind) else OTHER, at_ms
    )


@dataclass
class TaskErrorReader:
    """Reads the records left since its last `read()` (not thread-safe).

    Its first read is a baseline, as the commit log's reader's (metrics/batches.py): it counts
    only records of batches above `floor()` (None: none), so an exporter that starts again
    does not count again what it counted before.
    """

    storage: Storage
    floor: Callable[[], int | None] = lambda: None
    _after: str | None = None
    _started: bool = False

    def read(self) -> list[TaskError]:
        """The records new since the last call (the baseline's, the first time).

        Raises:
            CommitLogError (or the storage's error): the location cannot be read; the next
                call reads the same again.
        """
        names = self.storage.list(PREFIX, start_after=self._after)
        found = [e for e in (_parse(n, self.storage.get(n)) for n in names) if e is not None]
        if names:
            self._after = names[-1]
        if self._started:
            return found
        self._started = True
        floor = self.floor()
        return [] if floor is None else [e for e in found if e.batch_id > floor]
