"""Runs the example pipeline as a separate process group that tests can hold, kill and restart."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

from kafka_txn_sink import failpoints
from kafka_txn_sink.commit_log import CommitLog, open_commit_log
from kafka_txn_sink.kafka.txn_admin import ONGOING, TxnAdmin, TxnState
from kafka_txn_sink.protocol.txn_ids import owns
from kafka_txn_sink.testing.topics import IdReport, compare_ids, read_topic

if TYPE_CHECKING:
    from kafka_txn_sink.kafka.producer import Prepared

ROOT = Path(__file__).resolve().parents[2]
PIPELINE = ROOT / "examples" / "pipeline.py"
QUERY_TIMEOUT_S = 240


def commit_prepared(bootstrap: str, *prepared: Prepared) -> None:
    """Commit prepared transactions and wait until the coordinator has written every marker:
    before that, a read_committed reader may stop short of the records (EndTxn answers once
    the commit is decided, the markers follow)."""
    ids = [p.triple.transactional_id for p in prepared]
    with TxnAdmin(bootstrap, {}) as txn_admin:
        results = txn_admin.end_transactions([p.triple for p in prepared], True, deadline_s=30)
        assert all(result.ok for result in results), results
        deadline = time.monotonic() + 30
        while {s.state for s in txn_admin.describe(ids).values()} != {"CompleteCommit"}:
            assert time.monotonic() < deadline, txn_admin.describe(ids)
            time.sleep(0.05)


class LoggedQuery(subprocess.Popen[str]):
    """A query process whose output goes to files, not pipes: while a test waits for a
    failpoint nobody reads a pipe, and a full one would stop the query where it writes."""

    def __init__(self, args: list[str], logs: Path, **kwargs: object) -> None:
        logs.parent.mkdir(parents=True, exist_ok=True)
        self.out_path = logs.with_name(logs.name + ".out")
        self.err_path = logs.with_name(logs.name + ".err")
        with self.out_path.open("w") as out, self.err_path.open("w") as err:
            super().__init__(args, stdout=out, stderr=err, text=True, **kwargs)  # type: ignore[call-overload]

    def communicate(
        self, input: str | None = None, timeout: float | None = None
    ) -> tuple[str, str]:
        """Wait for the end (TimeoutExpired after `timeout`) and return what it printed."""
        self.wait(timeout)
        return self.printed()

    def printed(self) -> tuple[str, str]:
        """Its output and log so far."""
        read = lambda path: path.read_text(errors="replace")  # noqa: E731
        return read(self.out_path), read(self.err_path)


@dataclass(frozen=True)
class Outcome:
    returncode: int
    result: dict[str, object]
    stderr: str

    @property
    def error(self) -> str:
        """The query's error and the tail of its log, short enough to read in a test report."""
        return str(self.result.get("error", ""))[:4000] + "\n" + self.stderr[-4000:]


@dataclass
class Pipeline:
    """One sink (ids, topics, log, checkpoint) and the processes that run it."""

    bootstrap: str
    jars: str
    workdir: Path
    sink_id: str
    input: str
    output: str
    options: dict[str, str] = field(default_factory=dict)
    partitions: int = 0
    max_offsets: int = 400
    select: list[str] = field(default_factory=list)  # output columns, SQL over the source
    python: str = sys.executable  # of the driver and the workers (PySpark's version)
    input_dir: Path | None = None  # JSON-lines files as the source instead of the input topic
    spark_line: str = "4.0"  # the Spark version `python` runs: every successful run is checked
    signals_name: str = "failpoints"  # a second driver of the same sink blocks on its own points
    remote: str = ""  # a Spark Connect server's URL: `python` is its client, the query runs there
    register: bool = False  # kafka_txn_sink.register(spark) before the query
    input_bootstrap: str = ""  # the input topic's cluster, when not the output's
    shape: list[str] = field(default_factory=list)  # pipeline.py's flags of the query's shape

    @property
    def commit_log(self) -> Path:
        return self.workdir / "log"

    @property
    def checkpoint(self) -> Path:
        return self.workdir / "checkpoint"

    @property
    def signals(self) -> Path:
        path = self.workdir / self.signals_name
        path.mkdir(parents=True, exist_ok=True)
        return path

    def start(self, failpoint_spec: str = "", master: str = "local[2,4]") -> subprocess.Popen[str]:
        args = [
            self.python,
            str(PIPELINE),
            "--bootstrap",
            self.bootstrap,
            "--input",
            self.input,
            "--output",
            self.output,
            "--sink-id",
            self.sink_id,
            "--commit-log",
            str(self.commit_log),
            "--checkpoint",
            str(self.checkpoint),
            "--max-offsets",
            str(self.max_offsets),
            "--partitions",
            str(self.partitions),
            "--master",
            master,
            "--jars",
            self.jars,
        ]
        for key, value in self.options.items():
            args += ["--option", f"{key}={value}"]
        for expression in self.select:
            args += ["--select", expression]
        if self.input_dir is not None:
            args += ["--input-dir", str(self.input_dir)]
        if self.remote:
            args += ["--remote", self.remote]
        if self.register:
            args.append("--register")
        if self.input_bootstrap:
            args += ["--input-bootstrap", self.input_bootstrap]
        args += self.shape
        env = {
            **os.environ,
            "PYSPARK_PYTHON": self.python,
            "PYSPARK_DRIVER_PYTHON": self.python,
            "SPARK_LOCAL_IP": "127.0.0.1",
            **failpoints.environment(failpoint_spec, self.signals, max_s=300),
        }
        return LoggedQuery(
            args,
            self.workdir / "driver-logs" / f"{self.signals_name}-{uuid.uuid4().hex[:8]}",
            env=env,
            start_new_session=True,
            cwd=ROOT,
        )

    def run(self, failpoint_spec: str = "", master: str = "local[2,4]") -> Outcome:
        outcome = finish(self.start(failpoint_spec, master))
        spark = str(outcome.result.get("spark", ""))
        if outcome.returncode == 0 and not spark.startswith(self.spark_line):
            raise AssertionError(f"the query ran on Spark {spark}, not {self.spark_line}")
        return outcome

    def wait_reached(
        self, name: str, process: subprocess.Popen[str], timeout_s: float = 300
    ) -> None:
        deadline = time.monotonic() + timeout_s
        while not failpoints.reached(self.signals, name):
            if process.poll() is not None:
                out, err = process.communicate()
                raise AssertionError(f"pipeline ended before {name}: {out}\n{err[-3000:]}")
            if time.monotonic() > deadline:
                kill_group(process)
                _, err = process.communicate()
                raise AssertionError(
                    f"failpoint {name} not reached in {timeout_s}s:\n{err[-3000:]}"
                )
            time.sleep(0.1)

    def open_log(self) -> CommitLog:
        """The sink's commit log, in whichever format the pipeline writes it."""
        fmt = "delta" if self.options.get("commitLogFormat") == "delta" else "json"
        return open_commit_log(str(self.commit_log), None, fmt)

    def release(self, name: str) -> None:
        failpoints.release(self.signals, name)

    def reached_batches(self, name: str) -> list[int]:
        path = self.signals / f"{name}.reached"
        if not path.exists():
            return []
        return [json.loads(line)["batch"] for line in path.read_text().splitlines() if line]


# For the tests that wait out the transaction timeout: the margin of these settings is 17.3 s
# (margin.py), so 35 s leave a first batch 17.7 s. The fate probe reads back within
# commitTimeoutMs: at 1 s, on a loaded machine (CI, two workers), a new consumer often had no
# answer in time, rightly found the fate open, and failed the batch for a later retry instead of
# the path these tests take.
PAST_TIMEOUT = {
    "transactionTimeoutMs": "35000",
    "commitTimeoutMs": "3000",
    "commitLogTimeoutMs": "1000",
    "clockSkewMs": "0",
}


def wait_until(condition: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} did not happen within {timeout_s}s")
        time.sleep(0.5)


def describe(bootstrap: str, txn_ids: list[str]) -> dict[str, TxnState]:
    with TxnAdmin(bootstrap, {}) as txn_admin:
        return txn_admin.describe(txn_ids)


def wait_until_aborted(bootstrap: str, txn_ids: list[str], what: str) -> None:
    """Wait until the coordinators have written the abort markers of every id (CompleteAbort),
    not only bumped the epoch (PrepareAbort): a probe reading before the markers rightly finds
    the fate open and fails the batch for a later retry, a path other tests cover."""
    wait_until(
        lambda: all(
            s.state not in (ONGOING, "PrepareAbort") for s in describe(bootstrap, txn_ids).values()
        ),
        timeout_s=90,
        what=what,
    )


def finish(process: subprocess.Popen[str], timeout_s: float = QUERY_TIMEOUT_S) -> Outcome:
    try:
        out, err = process.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        kill_group(process)
        out, err = process.communicate()
        raise AssertionError(f"pipeline did not finish in {timeout_s}s: {err[-3000:]}") from None
    lines = [line for line in out.splitlines() if line.startswith("{")]
    result = json.loads(lines[-1]) if lines else {}
    return Outcome(process.returncode, result, err)


def kill_group(process: subprocess.Popen[str]) -> None:
    """SIGKILL the query's whole process group: driver JVM, Python workers, everything."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
    process.wait(timeout=30)


def create_topics(bootstrap: str, partitions: int, *names: str) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for future in admin.create_topics([NewTopic(n, partitions, 1) for n in names]).values():
        future.result(timeout=30)
    deadline = time.monotonic() + 30
    while any(n not in admin.list_topics(timeout=10).topics for n in names):
        if time.monotonic() > deadline:
            raise AssertionError(f"topics {names} did not appear")
        time.sleep(0.2)


def create_small_topic(bootstrap: str, topic: str, max_message_bytes: int) -> None:
    """A topic of 3 partitions that refuses records above `max_message_bytes`."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    new = NewTopic(topic, 3, 1, config={"max.message.bytes": str(max_message_bytes)})
    for future in admin.create_topics([new]).values():
        future.result(timeout=30)


def produce_ids(bootstrap: str, topic: str, count: int) -> list[str]:
    """`count` events with random string ids as keys (JSON values carrying the same id)."""
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, "acks": "all"})
    ids = [uuid.uuid4().hex for _ in range(count)]
    for event_id in ids:
        producer.produce(topic, key=event_id, value=json.dumps({"id": event_id}))
    if producer.flush(60) != 0:
        raise AssertionError("input was not fully produced")
    return ids


def produce_events(bootstrap: str, topic: str, count: int, users: int = 5) -> list[str]:
    """Log-like events: JSON values with an id, a user, a timestamp and a few fields."""
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, "acks": "all"})
    events = make_events(count, users)
    for event_id, value in events:
        producer.produce(topic, key=event_id, value=value)
    if producer.flush(60) != 0:
        raise AssertionError("input was not fully produced")
    return [event_id for event_id, _ in events]


def make_events(count: int, users: int = 5) -> list[tuple[str, str]]:
    """(id, JSON value) of `count` log-like events: an id, a user, a timestamp, a few fields."""
    events = []
    for n in range(count):
        event_id = uuid.uuid4().hex
        event: dict[str, object] = {
            "id": event_id,
            "user": f"user{n % users}",
            "ts": f"2026-11-21T{n % 3:02d}:{n % 60:02d}:00Z",
            "n": n,
            "level": "info" if n % 2 else "warn",
        }
        if n % 7 == 0:
            event["extra"] = {"tags": ["a", "b"], "score": n / 3}
        events.append((event_id, json.dumps(event)))
    return events


def write_input_files(directory: Path, rows: list[tuple[str, str]], files: int) -> list[str]:
    """`rows` (key, value) as `files` JSON-lines files, in order: the --input-dir source reads
    one per batch. Each file appears whole (renamed into place), as a file source needs."""
    directory.mkdir(parents=True, exist_ok=True)
    size = -(-len(rows) // files)
    for index in range(files):
        part = rows[index * size : (index + 1) * size]
        lines = "".join(json.dumps({"key": k, "value": v}) + "\n" for k, v in part)
        staging = directory / f".part-{index:05d}.json.tmp"
        staging.write_text(lines)
        staging.rename(directory / f"part-{index:05d}.json")
        time.sleep(0.01)  # distinct modification times: the source takes the oldest first
    return [k for k, _ in rows]


def committed_report(bootstrap: str, topic: str, ids: list[str]) -> IdReport:
    seen = read_topic(bootstrap, topic, "read_committed")
    return compare_ids(ids, [(r.key or b"").decode() for r in seen])


def open_transactions(bootstrap: str, sink_id: str) -> list[TxnState]:
    with TxnAdmin(bootstrap, {}) as txn_admin:
        ids = [i for i in txn_admin.list_ids([ONGOING]) if owns(sink_id, i)]
        return [s for s in txn_admin.describe(ids).values() if s.state == ONGOING]


def assert_exactly_once(pipeline: Pipeline, ids: list[str]) -> IdReport:
    report = committed_report(pipeline.bootstrap, pipeline.output, ids)
    detail = f" missing={report.missing[:5]} dup={list(report.duplicated)[:5]}"
    assert report.exact, report.summary() + detail
    assert open_transactions(pipeline.bootstrap, pipeline.sink_id) == []
    return report


# A late task attempt (a zombie of an abandoned stage attempt, started after its batch was
# decided): the plan as the driver built it before the decision (`last_decided` is stale), run
# as one Spark task of the batch's partition in another Spark application. Arguments: the
# sink's options as JSON, the batch, the partition; it prints {"status": ...}.
LATE_ATTEMPT_SCRIPT = """
import json, sys
from pyspark.sql import SparkSession
from pyspark.sql.types import StringType, StructField, StructType
from kafka_txn_sink.commit_log import open_commit_log
from kafka_txn_sink.options import parse_options
from kafka_txn_sink.protocol.prepare import prepare_task
from kafka_txn_sink.protocol.task_plan import TaskPlan
from kafka_txn_sink.protocol.runs import RunRef
from kafka_txn_sink.records.columns import plan_columns

given, batch_id, partition = json.loads(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
options = parse_options(given).with_transaction_timeout(60_000)
log = open_commit_log(options.commit_log, options.s3, options.commit_log_format)
owner = log.owners()[-1]
schema = StructType([StructField("key", StringType()), StructField("value", StringType())])
plan = TaskPlan(options, plan_columns(schema, options.topic), None,
                log.decision(batch_id).query_id, batch_id - 1, RunRef(owner.run, owner.slot))
spark = SparkSession.builder.master("local[1]").config("spark.ui.enabled", "false").getOrCreate()
context = spark.sparkContext
context.setLocalProperty("streaming.sql.batchId", str(batch_id))
context.setLocalProperty("sql.streaming.queryId", plan.log_query_id)

def attempt(_):
    yield prepare_task(plan, iter([("late", "late")]), arrow=False).status

statuses = context.parallelize(range(partition + 1), partition + 1).mapPartitions(attempt).collect()
spark.stop()
print(json.dumps({"status": statuses[partition]}))
"""
