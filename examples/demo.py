"""Exactly-once from Spark to Kafka, shown in one command, with one injected task failure.

Starts a local Kafka broker (or uses $KTS_KAFKA_BOOTSTRAP), writes N events with random ids to an
input topic, runs examples/pipeline.py (Kafka -> format("kafka_txn") -> Kafka) in several
micro-batches while one Spark task fails after producing its rows, then reads the output as a
read_committed consumer and compares it id by id with the input.

    ci/demo.sh [--events 5000] [--batches 5] [--keep]

Exit status 0 only when every id came out exactly once.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path

from confluent_kafka import Producer
from rich.console import Console

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "ci"))

import testbed  # noqa: E402

from kafka_txn_sink import failpoints  # noqa: E402
from kafka_txn_sink.cli import batch_rows, batches_table  # noqa: E402
from kafka_txn_sink.commit_log import open_commit_log  # noqa: E402
from kafka_txn_sink.errors import KafkaTxnSinkError  # noqa: E402
from kafka_txn_sink.verify import IdReport, compare_ids, read_topic  # noqa: E402

PIPELINE = ROOT / "examples" / "pipeline.py"
FAILPOINT = "task.after_produce"
INPUT_PARTITIONS = 3
USERS = ("ada", "grace", "linus", "margaret", "ken", "barbara")


@dataclass(frozen=True)
class Run:
    """Where one demo keeps its topics, commit log, checkpoint and signals."""

    workdir: Path
    bootstrap: str
    sink_id: str
    input: str
    output: str

    @property
    def commit_log(self) -> Path:
        return self.workdir / "commit_log"

    @property
    def checkpoint(self) -> Path:
        return self.workdir / "checkpoint"

    @property
    def signals(self) -> Path:
        return self.workdir / "failpoints"

    @property
    def spark_log(self) -> Path:
        return self.workdir / "spark.log"

    @property
    def result_path(self) -> Path:
        return self.workdir / "pipeline.out"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=int, default=5000, help="input events (default 5000)")
    parser.add_argument("--batches", type=int, default=5, help="about this many micro-batches")
    parser.add_argument("--timeout", type=float, default=300, help="seconds for the query")
    parser.add_argument("--keep", action="store_true", help="keep the work directory")
    args = parser.parse_args(argv)
    if args.events < 1 or args.batches < 1:
        parser.error("--events and --batches must be positive")
    return args


def say(message: str) -> None:
    print(f"demo: {message}", flush=True)


@contextmanager
def kafka(workdir: Path) -> Iterator[str]:
    """A broker for the demo: $KTS_KAFKA_BOOTSTRAP, or ours, stopped afterwards."""
    external = os.environ.get("KTS_KAFKA_BOOTSTRAP")
    if external:
        say(f"using the Kafka broker at {external} (KTS_KAFKA_BOOTSTRAP)")
        testbed.wait_broker_ready(external, timeout=60)
        yield external
        return
    broker = testbed.KafkaBroker(workdir / "kafka")
    say(f"starting a local Kafka {broker.version} broker (KRaft, one node)...")
    started = time.monotonic()
    try:
        broker.start(timeout=120)
        say(f"broker ready at {broker.bootstrap} in {time.monotonic() - started:.0f} s")
        yield broker.bootstrap
    finally:
        broker.stop()
        say("broker stopped")


def produce_events(bootstrap: str, topic: str, count: int) -> list[str]:
    """`count` JSON events keyed by a random id; the ids are what the check compares."""
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 10, "acks": "all"})
    ids = [uuid.uuid4().hex for _ in range(count)]
    now_ms = int(time.time() * 1000)
    for n, event_id in enumerate(ids):
        event = {"id": event_id, "user": random.choice(USERS), "ts": now_ms + n}
        producer.produce(topic, key=event_id, value=json.dumps(event))
        if n % 1000 == 999:
            producer.poll(0)
    if producer.flush(60) != 0:
        raise RuntimeError(f"the input events were not all acknowledged by {bootstrap}")
    return ids


def start_pipeline(run: Run, max_offsets: int) -> subprocess.Popen[bytes]:
    jars = ",".join(str(jar) for jar in testbed.spark_jars())
    args = [
        sys.executable, str(PIPELINE),
        "--bootstrap", run.bootstrap, "--input", run.input, "--output", run.output,
        "--sink-id", run.sink_id, "--commit-log", str(run.commit_log),
        "--checkpoint", str(run.checkpoint), "--max-offsets", str(max_offsets),
        "--master", "local[2,4]", "--jars", jars,
    ]  # fmt: skip
    env = {
        **os.environ,
        "PYSPARK_PYTHON": sys.executable,
        "PYSPARK_DRIVER_PYTHON": sys.executable,
        "SPARK_LOCAL_IP": "127.0.0.1",
        failpoints.ENV: f"{FAILPOINT}=raise-once",
        failpoints.ENV_DIR: str(run.signals),
    }
    # Files, not pipes: nobody reads Spark's chatter while the query runs.
    with run.result_path.open("wb") as out, run.spark_log.open("wb") as log:
        return subprocess.Popen(
            args, env=env, stdout=out, stderr=log, start_new_session=True, cwd=ROOT
        )


def run_pipeline(run: Run, max_offsets: int, timeout_s: float) -> int:
    """Run the query to its end, killing its whole process group if anything goes wrong."""
    process = start_pipeline(run, max_offsets)
    try:
        return watch(run, process, time.monotonic() + timeout_s)
    finally:
        if process.poll() is None:
            with suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=30)


def watch(run: Run, process: subprocess.Popen[bytes], deadline: float) -> int:
    """Wait for the query, telling what happens: decided batches, the injected failure."""
    announced: set[int] = set()
    failure_told = False
    while process.poll() is None:
        if time.monotonic() > deadline:
            raise TimeoutError("the streaming query did not finish in time (--timeout)")
        if not failure_told and failpoints.reached(run.signals, FAILPOINT):
            failure_told = True
            say("injected failure: a task failed after producing its rows; Spark retries it")
        announced |= announce_decisions(run, announced)
        time.sleep(0.3)
    announce_decisions(run, announced)
    return process.returncode


def announce_decisions(run: Run, announced: set[int]) -> set[int]:
    decisions = run.commit_log / "decisions"
    if not decisions.is_dir():
        return set()
    new = set()
    for path in sorted(decisions.glob("*.json")):
        batch = int(path.stem)
        if batch in announced:
            continue
        body = json.loads(path.read_text())
        say(
            f"batch {batch} decided: {body['rows']} rows in {len(body['participants'])} task "
            "transactions, committed by the driver with EndTxn"
        )
        new.add(batch)
    return new


def failure_report(run: Run) -> str:
    path = run.signals / f"{FAILPOINT}.reached"
    if not path.exists():
        return "the injected task failure did not fire"
    batches = sorted({json.loads(line)["batch"] for line in path.read_text().splitlines()})
    retried = retried_participants(run)
    detail = f"; committed instead: {', '.join(retried)}" if retried else ""
    return f"the injected task failure fired in batch {', '.join(map(str, batches))}{detail}"


def retried_participants(run: Run) -> list[str]:
    """Participants that were a task's second (or later) attempt: the retries that won."""
    found = []
    for path in sorted((run.commit_log / "decisions").glob("*.json")):
        body = json.loads(path.read_text())
        found += [
            f"batch {body['batch_id']} task {p['partition']} attempt {p['attempt']}"
            for p in body["participants"]
            if p["attempt"] > 0
        ]
    return found


def verify(run: Run, ids: list[str]) -> IdReport:
    seen = read_topic(run.bootstrap, run.output, "read_committed", timeout_s=60)
    return compare_ids(ids, [(r.key or b"").decode() for r in seen])


def demo(args: argparse.Namespace, workdir: Path) -> int:
    with kafka(workdir) as bootstrap:
        name = uuid.uuid4().hex[:8]
        run = Run(workdir, bootstrap, f"demo_{name}", f"events_{name}", f"events_out_{name}")
        run.signals.mkdir(parents=True)
        testbed.create_topic(bootstrap, run.input, INPUT_PARTITIONS)
        testbed.create_topic(bootstrap, run.output, INPUT_PARTITIONS)
        say(f"topics {run.input} -> {run.output} ({INPUT_PARTITIONS} partitions each)")
        ids = produce_events(bootstrap, run.input, args.events)
        say(f"produced {len(ids)} events with random ids to {run.input}")
        # maxOffsetsPerTrigger spans all input partitions, and Spark rounds each partition's
        # share down: one offset of slack per partition keeps the batch count as asked.
        max_offsets = math.ceil(args.events / args.batches) + INPUT_PARTITIONS
        say(
            f"running the streaming query: maxOffsetsPerTrigger={max_offsets}, sink "
            f"{run.sink_id}, one task set to fail after producing ({FAILPOINT}=raise-once)"
        )
        started = time.monotonic()
        code = run_pipeline(run, max_offsets, args.timeout)
        if code != 0:
            say(f"the streaming query failed (exit {code}): {run.result_path.read_text()[-2000:]}")
            say(testbed.tail(run.spark_log, 40))
            return 1
        say(f"query finished in {time.monotonic() - started:.0f} s; reading {run.output} "
            "with isolation.level=read_committed")  # fmt: skip
        report = verify(run, ids)
        show_batches(run)
        say(failure_report(run))
        print(report.summary(), flush=True)
        if not report.exact:
            say(f"NOT exactly once: missing {report.missing[:5]}, duplicated "
                f"{list(report.duplicated)[:5]}, unexpected {report.unexpected[:5]}")  # fmt: skip
        return 0 if report.exact else 1


def show_batches(run: Run) -> None:
    rows, _ = batch_rows(open_commit_log(str(run.commit_log)))
    console = Console(highlight=False)
    if not console.is_terminal:
        console.width = 120
    console.print(batches_table(rows, f"commit log {run.commit_log}"))


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    started = time.monotonic()
    workdir = Path(tempfile.mkdtemp(prefix="kafka-txn-sink-demo-"))
    try:
        code = demo(args, workdir)
    except (testbed.TestbedError, KafkaTxnSinkError, TimeoutError, RuntimeError, OSError) as exc:
        say(f"failed: {exc}")
        code = 1
    finally:
        if args.keep:
            say(f"kept {workdir}; try: kafka-txn-sink log list --log {workdir / 'commit_log'}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)
    say(f"done in {time.monotonic() - started:.0f} s")
    return code


if __name__ == "__main__":
    sys.exit(main())
