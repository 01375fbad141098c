"""A task's transaction phase by phase, reading its producer id the two ways, side by side.

    .venv/bin/python benchmarks/task_prepare.py                 # starts its own broker
    .venv/bin/python benchmarks/task_prepare.py --rows 420 --rounds 25 --warmup 5

Each round runs one task transaction of each way, their order alternating:

- `sample seen`: as the sink does since 2026-11-28, prepare() takes the producer id and epoch
  from a statistics sample already seen inside the transaction, and waits only when none came;
- `fresh sample`: as before, prepare() waits for the first sample after the flush (up to
  `STATS_INTERVAL_MS`).

Phases (ms, p50 and p90 over the rounds after the warm-up): the producer created, init and
begin, the records sent (`send_many`), prepare (flush and the triple), and the whole task.
Each transaction is aborted after it is timed, so the next init fences nothing.
"""

from __future__ import annotations

import argparse
import itertools
import os
import statistics
import tempfile
import time
import uuid
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path

from kafka_txn_sink.kafka.producer import TaskTransaction
from kafka_txn_sink.kafka.producer_settings import producer_config
from kafka_txn_sink.protocol.messages import Triple
from kafka_txn_sink.testing.kafka_broker import KafkaBroker, create_topic

TIMEOUT_S = 30.0
PHASES = ("create", "init", "send", "prepare", "task")


class FreshSampleTransaction(TaskTransaction):
    """The way before 2026-11-28: the triple only from a sample taken after the flush."""

    def _read_triple(self) -> Triple:
        self._stats.latest = {}
        return super()._read_triple()


def one_task(
    make: Callable[..., TaskTransaction], bootstrap: str, topic: str, txn_id: str, rows: int
) -> dict[str, float]:
    """One transaction of `rows` 100-byte records, timed phase by phase (ms)."""
    values: list[bytes | None] = [os.urandom(50).hex().encode() for _ in range(rows)]
    keys: list[bytes | None] = [b"key-%d" % i for i in range(rows)]
    marks = [time.perf_counter()]
    txn = make(producer_config(bootstrap, {}, txn_id, 60_000), timeout_s=TIMEOUT_S)
    marks.append(time.perf_counter())
    txn.init()
    marks.append(time.perf_counter())
    txn.send_many(topic, values, keys)
    marks.append(time.perf_counter())
    prepared = txn.prepare()
    marks.append(time.perf_counter())
    assert prepared is not None and prepared.rows == rows
    txn.abort()
    spans = [(b - a) * 1000 for a, b in itertools.pairwise(marks)]
    return dict(zip(PHASES, [*spans, (marks[-1] - marks[0]) * 1000], strict=True))


def quantile(values: list[float], q: float) -> float:
    """The q-quantile of `values` (inclusive method)."""
    return statistics.quantiles(values, n=100, method="inclusive")[round(q * 100) - 1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=420, help="records per task")
    parser.add_argument("--partitions", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=25)
    parser.add_argument("--warmup", type=int, default=5)
    args = parser.parse_args()
    with ExitStack() as stack:
        bootstrap = os.environ.get("KTS_KAFKA_BOOTSTRAP") or _start_broker(stack)
        topic = f"prepare_bench_{uuid.uuid4().hex[:8]}"
        create_topic(bootstrap, topic, args.partitions)
        ways: dict[str, Callable[..., TaskTransaction]] = {
            "sample seen": TaskTransaction,
            "fresh sample": FreshSampleTransaction,
        }
        timings: dict[str, list[dict[str, float]]] = {name: [] for name in ways}
        for round_ in range(args.warmup + args.rounds):
            order = list(ways) if round_ % 2 == 0 else list(reversed(ways))
            for name in order:
                txn_id = f"prepare-bench-{name.replace(' ', '-')}"
                timed = one_task(ways[name], bootstrap, topic, txn_id, args.rows)
                if round_ >= args.warmup:
                    timings[name].append(timed)
        report(timings, args)


def _start_broker(stack: ExitStack) -> str:
    """A broker of the test bed's, in a temporary folder, stopped on exit."""
    work = stack.enter_context(tempfile.TemporaryDirectory(prefix="task-prepare-"))
    broker = KafkaBroker(Path(work) / "broker")
    bootstrap = broker.start()
    stack.callback(broker.stop)
    return bootstrap


def report(timings: dict[str, list[dict[str, float]]], args: argparse.Namespace) -> None:
    """A markdown table: each phase's p50 / p90 per way, and the ratio of the p50s."""
    print(
        f"{args.rows} records a task, {args.partitions} partitions, {args.rounds} rounds "
        f"after {args.warmup} of warm-up"
    )
    print("| phase | " + " | ".join(f"{name} p50 / p90 ms" for name in timings) + " |")
    print("|---|" + "---|" * len(timings))
    for phase in PHASES:
        cells = []
        for runs in timings.values():
            values = [run[phase] for run in runs]
            cells.append(f"{quantile(values, 0.5):.1f} / {quantile(values, 0.9):.1f}")
        print(f"| {phase} | " + " | ".join(cells) + " |")
    seen, fresh = (statistics.median(run["task"] for run in runs) for runs in timings.values())
    print(f"\nwhole task p50, sample seen / fresh sample: {seen / fresh:.2f}")


if __name__ == "__main__":
    main()
