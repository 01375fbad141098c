"""Clean-up, abort and recovery of a batch of 256, 512 and 1,024 participants, on a real broker.

    .venv/bin/python benchmarks/recovery_scale.py                      # 256, 512, 1,024 tasks
    .venv/bin/python benchmarks/recovery_scale.py --tasks 1024 --rounds 3 --nodes 3

The steps of the driver a batch of N participants meets when something went wrong, each timed
in one process as Spark's commit worker runs them (N task transactions prepared as tasks leave
them: commit_overhead.py `prepare_tasks`). Per round:

- **clean-up, nothing to find**: a commit() whose full clean-up is due (as on the first commit of
  a process); the clean-up lists the sink's open transactions and describes every id the log
  knows of (4 slots of N, about 4N), and aborts none;
- **clean-up of N strays**: the same with N open transactions no decision holds (the ids of
  partitions N..2N-1, as a query that ran wider before its restart leaves them): all aborted;
- **abort()**: Spark's abort of a batch whose N tasks prepared (the abort record, N EndTxn
  aborts); the batch is then run again and committed;
- **roll-forward**: the driver fails just after the decision (failpoint `driver.after_decision`
  set to raise), the next streamWriter() claims the log and rolls the batch forward (N EndTxn
  commits on fresh clients, the completion), and the replay's commit() finds it decided and runs
  the clean-up a roll-forward makes due.

Every step's outcome is checked, and at the end what a read_committed consumer sees: exactly N
records of each committed batch, none of an aborted or stray transaction, and no open
transaction of the sink left on the brokers. Prints p50 and max of each step per size.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from commit_overhead import (
    SCHEMA,
    Sink,
    brokers,
    ids_held,
    new_sink,
    new_topic,
    prepare_tasks,
)

from kafka_txn_sink import failpoints
from kafka_txn_sink.protocol import decide, start
from kafka_txn_sink.protocol.session import cleanup_schedule
from kafka_txn_sink.testing.kafka_cluster import KafkaCluster
from kafka_txn_sink.testing.topics import read_topic

WARMUP_BATCHES = 3
STEPS = (
    "commit(), no clean-up",
    "commit() with the clean-up",
    "of it the clean-up, nothing found",
    "clean-up of N strays",
    "abort()",
    "streamWriter() after a failed commit",
    "of it the roll-forward",
    "the replay's commit()",
)


class Timer:
    """Wraps `module.name` so each call's time (ms) and result are kept."""

    def __init__(self, module: Any, name: str):
        self.ms: list[float] = []
        self.results: list[Any] = []
        original: Callable[..., Any] = getattr(module, name)

        def timed(*args: Any, **kwargs: Any) -> Any:
            began = time.perf_counter()
            try:
                result = original(*args, **kwargs)
            finally:
                self.ms.append((time.perf_counter() - began) * 1000)
            self.results.append(result)
            return result

        setattr(module, name, timed)

    def last(self) -> tuple[float, Any]:
        return self.ms[-1], self.results[-1]


CLEANUP = Timer(decide, "clean_up")
ROLL_FORWARD = Timer(start, "roll_forward")


class Round:
    """The steps of one size, their times, and the batches a reader must see."""

    def __init__(self, bootstrap: str, topic: str, sink: Sink, tasks: int, work: Path):
        self.bootstrap, self.topic, self.sink, self.tasks = bootstrap, topic, sink, tasks
        self.work = work
        self.batch = 0
        self.committed = 0  # batches whose N records a reader must see
        self.times: dict[str, list[float]] = {step: [] for step in STEPS}

    def prepare(self, pool: ThreadPoolExecutor, first_partition: int = 0) -> list[Any]:
        sink = self.sink
        return prepare_tasks(
            self.bootstrap, self.topic, sink.sink_id, sink.slot, self.batch, self.tasks, pool,
            first_partition=first_partition,
        )  # fmt: skip

    def commit(self, messages: list[Any], cleanup_due: bool = False) -> float:
        writer = self.sink.source.streamWriter(SCHEMA, False)
        if cleanup_due:
            cleanup_schedule(writer.plan.options).make_due("the benchmark")  # type: ignore[attr-defined]
        began = time.perf_counter()
        writer.commit(messages, self.batch)
        took = (time.perf_counter() - began) * 1000
        self.batch += 1
        self.committed += 1
        return took

    def run(self, pool: ThreadPoolExecutor, measured: bool) -> None:
        n = self.tasks
        cleaned_before = len(CLEANUP.ms)
        plain = self.commit(self.prepare(pool))
        _expect(len(CLEANUP.ms) == cleaned_before, "the plain commit() ran no clean-up")
        with_cleanup = self.commit(self.prepare(pool), cleanup_due=True)
        found_ms, found = CLEANUP.last()
        _expect(len(CLEANUP.ms) == cleaned_before + 1 and not found,
                f"the due clean-up ran once and found nothing: {found}")  # fmt: skip
        self.prepare(pool, first_partition=n)  # N strays, left open
        self.commit(self.prepare(pool), cleanup_due=True)
        strays_ms, strays = CLEANUP.last()
        _expect(len(strays) == n, f"the clean-up aborted {len(strays)} strays, not {n}")
        aborted_ms = self.abort(self.prepare(pool))
        self.commit(self.prepare(pool))  # Spark runs the aborted batch again
        writer_ms, roll_ms, replay_ms = self.roll_forward(pool)
        if measured:
            for step, ms in zip(STEPS, (plain, with_cleanup, found_ms, strays_ms, aborted_ms,
                                        writer_ms, roll_ms, replay_ms), strict=True):  # fmt: skip
                self.times[step].append(ms)

    def abort(self, messages: list[Any]) -> float:
        writer = self.sink.source.streamWriter(SCHEMA, False)
        began = time.perf_counter()
        writer.abort(messages, self.batch)
        return (time.perf_counter() - began) * 1000

    def roll_forward(self, pool: ThreadPoolExecutor) -> tuple[float, float, float]:
        """A commit that fails after its decision; the next streamWriter() rolls it forward;
        the replay's commit(): the times of the last two and of the roll-forward."""
        messages = self.prepare(pool)
        writer = self.sink.source.streamWriter(SCHEMA, False)
        armed = failpoints.environment(f"driver.after_decision=raise@{self.batch}", self.work)
        os.environ.update(armed)
        try:
            writer.commit(messages, self.batch)
            raise AssertionError("the failpoint after the decision did not fire")
        except failpoints.FailpointError:
            pass
        finally:
            for name in armed:
                os.environ.pop(name, None)
        rolled = len(ROLL_FORWARD.ms)
        began = time.perf_counter()
        writer = self.sink.source.streamWriter(SCHEMA, False)
        writer_ms = (time.perf_counter() - began) * 1000
        roll_ms, completions = ROLL_FORWARD.last()
        whole = len(ROLL_FORWARD.ms) == rolled + 1 and len(completions) == 1
        _expect(whole and not completions[0].lost, f"one batch rolled forward: {completions}")
        return writer_ms, roll_ms, self.commit(messages)

    def check(self) -> str:
        """What a read_committed reader sees and what the brokers hold: each as it must be."""
        seen = read_topic(self.bootstrap, self.topic, timeout_s=300)
        wanted = self.committed * self.tasks
        _expect(len(seen) == wanted, f"a reader saw {len(seen)} records, not {wanted}")
        held = ids_held(self.bootstrap, self.sink.sink_id)
        _expect("Ongoing" not in held, f"open transactions left: {held}")
        return f"{len(seen)} records of {self.committed} batches; ids held {held}"


def _expect(condition: bool, what: str) -> None:
    if not condition:
        raise AssertionError(what)


def measure(
    bootstrap: str, work: Path, tasks: int, rounds: int, cluster: KafkaCluster | None
) -> tuple[Round, str]:
    topic = f"recovery_bench_{uuid.uuid4().hex[:8]}"
    new_topic(bootstrap, cluster, topic, 8)
    sink = new_sink(bootstrap, work, topic, tasks, False)
    writer = sink.source.streamWriter(SCHEMA, False)
    sink.slot = writer.plan.run.slot  # type: ignore[attr-defined]
    # The steps make the clean-up due themselves; the schedule's 60 s safety net would land on
    # whichever commit() comes next on a slow cluster.
    cleanup_schedule(writer.plan.options).every_s = float("inf")  # type: ignore[attr-defined]
    steps = Round(bootstrap, topic, sink, tasks, work)
    with ThreadPoolExecutor(max_workers=16) as pool:
        for _ in range(WARMUP_BATCHES):
            steps.commit(steps.prepare(pool))
        for number in range(rounds + 1):  # the first round warms the clients up
            steps.run(pool, measured=number > 0)
    return steps, steps.check()


def report(results: list[tuple[Round, str]]) -> str:
    lines = [
        "| tasks | step | p50 ms | max ms | rounds |",
        "|---|---|---|---|---|",
    ]
    for steps, _ in results:
        for step, ms in steps.times.items():
            lines.append(
                f"| {steps.tasks} | {step} | {statistics.median(ms):.1f} | {max(ms):.1f} "
                f"| {len(ms)} |"
            )
    lines.extend(f"- {steps.tasks} tasks: {outcome}" for steps, outcome in results)
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, nargs="*", default=[256, 512, 1024])
    parser.add_argument("--rounds", type=int, default=3, help="measured, after one of warm-up")
    parser.add_argument("--nodes", type=int, default=1, help="as in commit_overhead.py")
    options = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp, brokers(Path(tmp), options.nodes) as found:
        bootstrap, cluster = found
        results = [measure(bootstrap, Path(tmp), n, options.rounds, cluster) for n in options.tasks]
    print(report(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
