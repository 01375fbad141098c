"""Exactly-once from Spark to Kafka and Avro files, shown in one command, with one crash.

Starts a local Kafka broker (or uses $KTS_KAFKA_BOOTSTRAP) and writes N log events of a few
users to an input topic. One streaming query (examples/pipeline.py, Kafka -> format("kafka_txn"))
writes each event twice in one sink: as a record to a topic, and into an Avro file partitioned
by user/date/hour (schema inferred from the JSON payloads), with one reference message per
file. In the middle of the run the query is killed with SIGKILL right after the driver decided
a batch and before it committed that batch's Kafka transactions; it is restarted from its
checkpoint and recovery finishes the batch. At the end the verifier reads the records topic
and the referenced files as a read_committed consumer and compares them id by id with the input.

    ci/demo.sh [--events 5000] [--batches 5] [--keep]

Exit status 0 only when every id came out exactly once, in the records and in the files.
"""

from __future__ import annotations

import argparse
import contextlib
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
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import fastavro
from confluent_kafka import Producer
from rich.console import Console
from rich.table import Table

from kafka_txn_sink import failpoints, testing
from kafka_txn_sink.cli.log import batch_rows, batches_table
from kafka_txn_sink.commit_log import open_commit_log
from kafka_txn_sink.errors import KafkaTxnSinkError
from kafka_txn_sink.files.references import parse_reference
from kafka_txn_sink.protocol.messages import FileRef
from kafka_txn_sink.testing.topics import IdReport, compare_ids, read_topic

ROOT = Path(__file__).resolve().parents[1]

PIPELINE = ROOT / "examples" / "pipeline.py"
CRASH_POINT = "driver.after_decision"
INPUT_PARTITIONS = 3
USERS = ("ada", "grace", "linus", "margaret", "ken", "barbara")
LEVELS = ("info", "info", "info", "warn", "error")
FIRST_EVENT = datetime(2026, 11, 21, 9, 0, tzinfo=timezone.utc)
HOURS = 3  # the events span this many hours: 3 hour directories per user and date
# Columns for both modes: key/value become the records, user/ts the directories, payload the
# files' contents (the Avro schema is inferred from these JSON payloads).
SELECT = [
    "key",
    "value",
    "get_json_object(CAST(value AS STRING), '$.user') AS user",
    "to_timestamp(get_json_object(CAST(value AS STRING), '$.ts')) AS ts",
    "CAST(value AS STRING) AS payload",
]


@dataclass(frozen=True)
class Run:
    """Where one demo keeps its topics, files, commit log, checkpoint and signals."""

    workdir: Path
    bootstrap: str
    sink_id: str
    input: str
    output: str
    references: str

    @property
    def commit_log(self) -> Path:
        return self.workdir / "commit_log"

    @property
    def files(self) -> Path:
        return self.workdir / "files"

    @property
    def checkpoint(self) -> Path:
        return self.workdir / "checkpoint"

    @property
    def signals(self) -> Path:
        return self.workdir / "failpoints"

    def sink_options(self) -> dict[str, str]:
        return {
            "path": str(self.files),
            "referencesTopic": self.references,
            "partitionBy": "user",
            "timePartitionColumn": "ts",
            "timePartitionPattern": "date=yyyy-MM-dd/hour=HH",
            "payloadColumn": "payload",
            "avroCodec": "snappy",
        }


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--events", type=int, default=5000, help="input events (default 5000)")
    parser.add_argument("--batches", type=int, default=5, help="about this many micro-batches")
    parser.add_argument("--timeout", type=float, default=300, help="seconds for each query run")
    parser.add_argument("--keep", action="store_true", help="keep the work directory")
    args = parser.parse_args(argv)
    if args.events < 1 or args.batches < 2:
        parser.error("--events must be positive and --batches at least 2")
    return args


def say(message: str) -> None:
    print(f"demo: {message}", flush=True)


@contextmanager
def kafka(workdir: Path) -> Iterator[str]:
    """A broker for the demo: $KTS_KAFKA_BOOTSTRAP, or ours, stopped afterwards."""
    external = os.environ.get("KTS_KAFKA_BOOTSTRAP")
    if external:
        say(f"using the Kafka broker at {external} (KTS_KAFKA_BOOTSTRAP)")
        testing.wait_broker_ready(external, timeout=60)
        yield external
        return
    broker = testing.KafkaBroker(workdir / "kafka")
    say(f"starting a local Kafka {broker.version} broker (KRaft, one node)...")
    started = time.monotonic()
    try:
        broker.start(timeout=120)
        say(f"broker ready at {broker.bootstrap} in {time.monotonic() - started:.0f} s")
        yield broker.bootstrap
    finally:
        broker.stop()
        say("broker stopped")


def log_event(rng: random.Random, n: int, count: int) -> dict[str, Any]:
    """One log line of a user; some carry extra fields, so each file's schema is a merge."""
    at = FIRST_EVENT + timedelta(seconds=HOURS * 3600 * n / count)
    event: dict[str, Any] = {
        "id": uuid.UUID(int=rng.getrandbits(128)).hex,
        "user": rng.choice(USERS),
        "ts": at.strftime("%Y-%m-%dT%H:%M:%SZ"),
        "level": rng.choice(LEVELS),
        "message": rng.choice(("login", "search", "checkout", "logout")),
    }
    if n % 4 == 0:
        event["latency_ms"] = rng.randint(1, 900)
    if n % 9 == 0:
        event["tags"] = rng.sample(["mobile", "beta", "eu", "retry"], 2)
    return event


def produce_events(bootstrap: str, topic: str, count: int) -> list[str]:
    """`count` JSON log events keyed by a random id; the ids are what the check compares."""
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 10, "acks": "all"})
    rng = random.Random(count)
    ids = []
    for n in range(count):
        event = log_event(rng, n, count)
        ids.append(event["id"])
        producer.produce(topic, key=event["id"], value=json.dumps(event))
        if n % 1000 == 999:
            producer.poll(0)
    if producer.flush(60) != 0:
        raise RuntimeError(f"the input events were not all acknowledged by {bootstrap}")
    return ids


# -- the query -------------------------------------------------------------------------------


def start_pipeline(run: Run, max_offsets: int, name: str, spec: str) -> subprocess.Popen[bytes]:
    jars = ",".join(str(jar) for jar in testing.spark_jars())
    args = [
        sys.executable, str(PIPELINE),
        "--bootstrap", run.bootstrap, "--input", run.input, "--output", run.output,
        "--sink-id", run.sink_id, "--commit-log", str(run.commit_log),
        "--checkpoint", str(run.checkpoint), "--max-offsets", str(max_offsets),
        "--master", "local[2,4]", "--jars", jars,
    ]  # fmt: skip
    for key, value in run.sink_options().items():
        args += ["--option", f"{key}={value}"]
    for expression in SELECT:
        args += ["--select", expression]
    env = {
        **os.environ,
        "PYSPARK_PYTHON": sys.executable,
        "PYSPARK_DRIVER_PYTHON": sys.executable,
        "SPARK_LOCAL_IP": "127.0.0.1",
        **failpoints.environment(spec, run.signals),
    }
    # Files, not pipes: nobody reads Spark's chatter while the query runs.
    out, log = run.workdir / f"{name}.out", run.workdir / f"{name}.log"
    with out.open("wb") as stdout, log.open("wb") as stderr:
        return subprocess.Popen(
            args, env=env, stdout=stdout, stderr=stderr, start_new_session=True, cwd=ROOT
        )


def kill_query(process: subprocess.Popen[bytes]) -> int:
    """SIGKILL the query: its process group and pyspark's daemons, which have groups of their
    own (they call setpgid). The group is frozen first, so no new worker starts meanwhile.
    Returns how many processes were killed."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGSTOP)
    pids = [process.pid, *descendants(process.pid)]
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    process.wait(timeout=30)
    return len(pids)


def descendants(root: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        with contextlib.suppress(OSError, ValueError, IndexError):
            parent = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            children.setdefault(parent, []).append(int(entry.name))
    found, pending = [], [root]
    while pending:
        for child in children.get(pending.pop(), []):
            found.append(child)
            pending.append(child)
    return found


def crash_run(run: Run, max_offsets: int, batch: int, timeout_s: float) -> None:
    """Run until the driver decided `batch`, then kill the whole query at that point."""
    process = start_pipeline(run, max_offsets, "run1", f"{CRASH_POINT}=block@{batch}")
    deadline = time.monotonic() + timeout_s
    announced: set[int] = set()
    try:
        while not failpoints.reached(run.signals, CRASH_POINT):
            if process.poll() is not None:
                raise RuntimeError(f"the query ended before the crash:\n{failure(run, 'run1')}")
            if time.monotonic() > deadline:
                raise TimeoutError("the query did not reach the crash point in time (--timeout)")
            announced |= announce_decisions(run, announced, batch)
            time.sleep(0.2)
        announce_decisions(run, announced, batch)
    finally:
        killed = kill_query(process) if process.poll() is None else 0
    say(
        f"CRASH: batch {batch} was decided (its decision is in the commit log) and its Kafka "
        f"transactions are still open; SIGKILL of the whole query ({killed} processes: "
        f"driver, JVM, Python workers)"
    )


def final_run(run: Run, max_offsets: int, timeout_s: float) -> None:
    """Restart from the checkpoint: recovery completes the decided batch, the query goes on."""
    process = start_pipeline(run, max_offsets, "run2", "")
    announced = set(decided_batches(run))
    try:
        deadline = time.monotonic() + timeout_s
        while process.poll() is None:
            if time.monotonic() > deadline:
                raise TimeoutError("the restarted query did not finish in time (--timeout)")
            announced |= announce_decisions(run, announced, None)
            time.sleep(0.3)
        announce_decisions(run, announced, None)
    finally:
        if process.poll() is None:
            kill_query(process)
    if process.returncode != 0:
        raise RuntimeError(f"the restarted query failed:\n{failure(run, 'run2')}")


def failure(run: Run, name: str) -> str:
    out = (run.workdir / f"{name}.out").read_text(errors="replace")[-2000:]
    return out + "\n" + testing.tail(run.workdir / f"{name}.log", 30)


def decided_batches(run: Run) -> list[int]:
    decisions = run.commit_log / "decisions"
    return sorted(int(p.stem) for p in decisions.glob("*.json")) if decisions.is_dir() else []


def announce_decisions(run: Run, announced: set[int], crash_batch: int | None) -> set[int]:
    new = set()
    for batch in decided_batches(run):
        if batch in announced:
            continue
        body = json.loads((run.commit_log / "decisions" / f"{batch:020d}.json").read_text())
        files = sum(len(p.get("files", [])) for p in body["participants"])
        say(
            f"batch {batch} decided: {body['rows']} rows and {files} files in "
            f"{len(body['participants'])} task transactions"
            + (" <- the driver is about to crash" if batch == crash_batch else "")
        )
        new.add(batch)
    return new


# -- the check ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Verdict:
    records: IdReport
    files: IdReport
    references: list[FileRef]
    twice: list[str]  # files referenced more than once
    unlisted: list[str]  # referenced files the commit log does not list, and the reverse

    @property
    def exact(self) -> bool:
        return self.records.exact and self.files.exact and not self.twice and not self.unlisted


def verify(run: Run, ids: list[str]) -> Verdict:
    """What a read_committed consumer sees, id by id: the records topic, and the ids inside
    the files that the references name (each file must be named once and be in the log)."""
    seen = read_topic(run.bootstrap, run.output, "read_committed", timeout_s=60)
    refs = [parse_reference(r.value or b"") for r in read_topic(run.bootstrap, run.references)]
    named = Counter(ref.location for ref in refs)
    file_ids = []
    for ref in refs:
        with Path(ref.location).open("rb") as avro:
            file_ids += [str(row["id"]) for row in fastavro.reader(avro)]  # type: ignore[call-overload,index]
    logged = logged_files(run)
    return Verdict(
        records=compare_ids(ids, [(r.key or b"").decode() for r in seen]),
        files=compare_ids(ids, file_ids),
        references=refs,
        twice=sorted(loc for loc, n in named.items() if n > 1),
        unlisted=sorted(set(named) ^ logged),
    )


def logged_files(run: Run) -> set[str]:
    commit_log = open_commit_log(str(run.commit_log))
    locations = set()
    for batch in commit_log.decided_batches():
        decision = commit_log.decision(batch)
        if decision is not None:
            locations |= {f.location for p in decision.participants for f in p.files}
    return locations


def show(run: Run, verdict: Verdict) -> None:
    console = Console(highlight=False)
    if not console.is_terminal:
        console.width = 120
    rows, _ = batch_rows(open_commit_log(str(run.commit_log)))
    console.print(batches_table(rows, f"commit log {run.commit_log}"))
    console.print(partitions_table(run, verdict.references))


def partitions_table(run: Run, refs: list[FileRef]) -> Table:
    table = Table(title="Avro files by partition", title_justify="left")
    for column in ("user", "date", "hour", "files", "records"):
        table.add_column(column, justify="right" if column in ("files", "records") else "left")
    by_partition: dict[tuple[str, str, str], list[FileRef]] = {}
    for ref in refs:
        values = ref.partition_values
        key = (str(values.get("user")), str(values.get("date")), str(values.get("hour")))
        by_partition.setdefault(key, []).append(ref)
    for key, found in sorted(by_partition.items()):
        table.add_row(*key, str(len(found)), str(sum(r.records for r in found)))
    return table


def report(verdict: Verdict) -> None:
    files = len(verdict.references)
    say(f"records topic, read_committed: {verdict.records.summary()}")
    say(
        f"files ({files} Avro files, each referenced "
        f"{'once' if not verdict.twice else 'MORE THAN ONCE'}, "
        f"{'all' if not verdict.unlisted else 'NOT all'} listed in the commit log): "
        f"{verdict.files.summary()}"
    )
    for name, found in (("records", verdict.records), ("files", verdict.files)):
        if not found.exact:
            say(f"NOT exactly once in the {name}: missing {found.missing[:5]}, duplicated "
                f"{list(found.duplicated)[:5]}, unexpected {found.unexpected[:5]}")  # fmt: skip
    print(
        f"records: {verdict.records.summary()}; files: {verdict.files.summary()}"
        + ("" if verdict.exact else " -- NOT EXACTLY ONCE"),
        flush=True,
    )


# -- main --------------------------------------------------------------------------------------


def demo(args: argparse.Namespace, workdir: Path) -> int:
    with kafka(workdir) as bootstrap:
        name = uuid.uuid4().hex[:8]
        run = Run(
            workdir, bootstrap, f"demo_{name}", f"events_{name}", f"events_out_{name}",
            f"event_files_{name}",
        )  # fmt: skip
        run.signals.mkdir(parents=True)
        for topic in (run.input, run.output, run.references):
            testing.create_topic(bootstrap, topic, INPUT_PARTITIONS)
        say(f"topics: {run.input} -> records {run.output} + file references {run.references}")
        ids = produce_events(bootstrap, run.input, args.events)
        say(f"produced {len(ids)} log events of {len(USERS)} users to {run.input}")
        # maxOffsetsPerTrigger spans all input partitions, and Spark rounds each partition's
        # share down: one offset of slack per partition keeps the batch count as asked.
        max_offsets = math.ceil(args.events / args.batches) + INPUT_PARTITIONS
        crash_batch = args.batches // 2
        say(
            f"streaming query: maxOffsetsPerTrigger={max_offsets}; sink {run.sink_id} writes "
            f"records and Avro files partitioned by user/date/hour; crash planned right after "
            f"the decision of batch {crash_batch} ({CRASH_POINT})"
        )
        crash_run(run, max_offsets, crash_batch, args.timeout)
        say("restarting the query from its checkpoint (recovery commits the decided batch)")
        final_run(run, max_offsets, args.timeout)
        say(f"query finished; reading {run.output} and {run.references} with "
            "isolation.level=read_committed, and the files the references name")  # fmt: skip
        verdict = verify(run, ids)
        show(run, verdict)
        report(verdict)
        return 0 if verdict.exact else 1


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    started = time.monotonic()
    workdir = Path(tempfile.mkdtemp(prefix="kafka-txn-sink-demo-"))
    try:
        code = demo(args, workdir)
    except (testing.TestbedError, KafkaTxnSinkError, TimeoutError, RuntimeError, OSError) as exc:
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
