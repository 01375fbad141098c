"""Files mode through Spark: rows/s, MB/s, files and their sizes, and the Python workers' peak
memory and open files, writing partitioned Avro files to a local directory.

    .venv/bin/python benchmarks/files_sink_throughput.py --rows 200000 --users 100 --baseline
    .venv/bin/python benchmarks/files_sink_throughput.py --rows 50000 --users 10000 --max-open 16

Log-like JSON events (12 fields, one day in time order, users at random) are loaded into a topic
of three partitions on a broker (ours, or KTS_KAFKA_BOOTSTRAP); a Spark job (local[2]) reads them
with the Kafka source and writes them with format("kafka_txn") in files mode, partitioned by
`user` and `date=yyyy-MM-dd/hour=HH`, as columns parsed from the JSON (Spark-schema mode) or,
with --payload, as the JSON payload (schema inferred per file). --baseline also runs Spark's own
`format("avro")` file sink (at-least-once, no references) over the same input and partitions.

Rates are over the batches' own durations (triggerExecution, so JVM start-up is not counted);
MB/s counts the input values' bytes. The job's processes are sampled every 50 ms: the
largest VmHWM (peak RSS) of any Python worker and of the JVM, and the most Avro files one Python
worker held open at once (file descriptors into its spool directory).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

from confluent_kafka import Producer

from kafka_txn_sink import testing
from tests.e2e.harness import create_topics

SPOOL_MARK = "kafka-txn-sink-files-"  # files.writer.FileSet's spool directory prefix
COLUMNS = (
    "user STRING, ts TIMESTAMP, level STRING, service STRING, host STRING, message STRING, "
    "status INT, latency_ms DOUBLE, bytes BIGINT, trace_id STRING, path STRING, user_agent STRING"
)
LEVELS = ["DEBUG", "INFO", "INFO", "INFO", "WARN", "ERROR"]

SPARK_JOB = r"""
import json, sys
from pyspark.sql import SparkSession, functions as F
args = json.loads(sys.argv[1])
spark = (SparkSession.builder.master("local[2]").config("spark.jars", args["jars"])
         .config("spark.ui.enabled", "false").config("spark.sql.session.timeZone", "UTC")
         .config("spark.python.worker.reuse", "true").getOrCreate())
spark.sparkContext.setLogLevel("ERROR")
df = (spark.readStream.format("kafka").option("kafka.bootstrap.servers", args["bootstrap"])
      .option("subscribe", args["input"]).option("startingOffsets", "earliest")
      .option("maxOffsetsPerTrigger", args["per_batch"]).load())
if args["payload"]:
    df = df.selectExpr("get_json_object(CAST(value AS STRING), '$.user') AS user",
                       "to_timestamp(get_json_object(CAST(value AS STRING), '$.ts')) AS ts",
                       "CAST(value AS STRING) AS payload")
else:
    df = df.select(F.from_json(F.col("value").cast("string"), args["columns"]).alias("e"))
    df = df.select("e.*")
if args["format"] == "avro":
    df = (df.withColumn("date", F.date_format("ts", "yyyy-MM-dd"))
            .withColumn("hour", F.date_format("ts", "HH")))
writer = df.writeStream.format(args["format"]).option("checkpointLocation", args["checkpoint"])
if args["format"] == "avro":
    writer = writer.partitionBy("user", "date", "hour").option("path", args["path"])
for key, value in args["options"].items():
    writer = writer.option(key, value)
query = writer.trigger(availableNow=True).start()
query.awaitTermination()
batches = [(p["numInputRows"], p["durationMs"]["triggerExecution"]) for p in query.recentProgress]
print(json.dumps({"batches": batches}))
"""


# --- input ---------------------------------------------------------------------------------


def events(count: int, users: int, seed: int = 7) -> Iterator[bytes]:
    """Log-like JSON events over one day in time order, users at random."""
    rnd = random.Random(seed)
    start = datetime(2026, 11, 21, tzinfo=timezone.utc)
    for i in range(count):
        ts = start + timedelta(seconds=i * 86400 // count)
        event = {
            "user": f"user{rnd.randrange(users):05d}",
            "ts": ts.strftime("%Y-%m-%dT%H:%M:%SZ"),
            "level": rnd.choice(LEVELS),
            "service": rnd.choice(["api", "auth", "billing", "search"]),
            "host": f"host-{rnd.randrange(20):02d}.example.internal",
            "message": f"request {i} handled with result {rnd.randrange(1000)}",
            "status": rnd.choice([200, 200, 200, 201, 404, 500]),
            "latency_ms": rnd.random() * 250,
            "bytes": rnd.randrange(100, 100_000),
            "trace_id": f"{rnd.getrandbits(128):032x}",
            "path": f"/v1/items/{rnd.randrange(10_000)}",
            "user_agent": "Mozilla/5.0 (X11; Linux x86_64) bench/1.0",
        }
        yield json.dumps(event).encode()


def preload(bootstrap: str, topic: str, rows: int, users: int) -> int:
    """Produce the events; returns their total value bytes."""
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20, "acks": "all"})
    total = 0
    for i, value in enumerate(events(rows, users)):
        total += len(value)
        while True:
            try:
                producer.produce(topic, key=str(i).encode(), value=value)
                break
            except BufferError:
                producer.poll(0.01)
    if producer.flush(120) != 0:
        raise RuntimeError("input was not fully produced")
    return total


# --- sampling the job's processes ----------------------------------------------------------


@dataclass
class Peaks:
    python_hwm_kib: int = 0
    jvm_hwm_kib: int = 0
    open_avro_files: int = 0
    python_workers: set[int] = field(default_factory=set)


def _read(path: str) -> str:
    try:
        with open(path, "rb") as handle:
            return handle.read().decode(errors="replace")
    except OSError:
        return ""


def _hwm_kib(pid: int) -> int:
    for line in _read(f"/proc/{pid}/status").splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    return 0


def _spool_fds(pid: int) -> int:
    try:
        names = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return 0
    count = 0
    for name in names:
        try:
            if SPOOL_MARK in os.readlink(f"/proc/{pid}/fd/{name}"):
                count += 1
        except OSError:
            continue
    return count


def _descendants(root: int) -> list[int]:
    """`root` and every process below it (PySpark's daemons leave its process group)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            stat = _read(f"/proc/{entry}/stat")
            fields = stat.rpartition(")")[2].split()
            if len(fields) > 1:
                children.setdefault(int(fields[1]), []).append(int(entry))
    found, pending = [], [root]
    while pending:
        pid = pending.pop()
        found.append(pid)
        pending.extend(children.get(pid, []))
    return found


def sample(root: int, peaks: Peaks, stop: threading.Event) -> None:
    while not stop.wait(0.05):
        for pid in _descendants(root):
            command = _read(f"/proc/{pid}/cmdline")
            if "java" in command.split("\0", 1)[0]:
                peaks.jvm_hwm_kib = max(peaks.jvm_hwm_kib, _hwm_kib(pid))
            elif "pyspark.daemon" in command or "pyspark.worker" in command:
                peaks.python_workers.add(pid)
                peaks.python_hwm_kib = max(peaks.python_hwm_kib, _hwm_kib(pid))
                peaks.open_avro_files = max(peaks.open_avro_files, _spool_fds(pid))


# --- one run -------------------------------------------------------------------------------


@dataclass
class Run:
    rows: int
    seconds: float  # sum of the batches' triggerExecution
    wall_s: float  # the whole job, JVM start-up included
    batches: int
    files: list[int]  # sizes in bytes
    peaks: Peaks


def spark_job(args: dict[str, Any]) -> Run:
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "SPARK_LOCAL_IP": "127.0.0.1"}
    peaks, stop = Peaks(), threading.Event()
    started = time.monotonic()
    process = subprocess.Popen(
        [sys.executable, "-c", SPARK_JOB, json.dumps(args)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        start_new_session=True,
    )
    sampler = threading.Thread(target=sample, args=(process.pid, peaks, stop), daemon=True)
    sampler.start()
    try:
        out, err = process.communicate(timeout=3600)
    finally:
        stop.set()
        sampler.join()
    wall = time.monotonic() - started
    lines = [line for line in out.splitlines() if line.startswith("{")]
    if process.returncode != 0 or not lines:
        raise RuntimeError(f"{args['format']} run failed:\n{err[-3000:]}")
    batches = [b for b in json.loads(lines[-1])["batches"] if b[0] > 0]
    sizes = [p.stat().st_size for p in Path(args["path"]).rglob("*.avro")]
    return Run(
        rows=sum(b[0] for b in batches),
        seconds=sum(b[1] for b in batches) / 1000,
        wall_s=wall,
        batches=len(batches),
        files=sizes,
        peaks=peaks,
    )


def describe(label: str, run: Run, input_bytes: int) -> str:
    sizes = sorted(run.files) or [0]
    mib = 1024 * 1024
    return (
        f"{label}: {run.rows / run.seconds:,.0f} rows/s, {input_bytes / run.seconds / 1e6:.2f} "
        f"MB/s of input ({run.rows} rows in {run.batches} batches, {run.seconds:.1f} s of "
        f"batches, {run.wall_s:.1f} s wall)\n"
        f"  files={len(run.files)} total={sum(sizes) / 1e6:.1f} MB size min/median/max="
        f"{sizes[0] / 1024:.1f}/{statistics.median(sizes) / 1024:.1f}/{sizes[-1] / 1024:.1f} KiB\n"
        f"  peak RSS: python worker {run.peaks.python_hwm_kib / 1024:.0f} MiB "
        f"({len(run.peaks.python_workers)} workers seen), JVM {run.peaks.jvm_hwm_kib / mib:.2f} GiB"
        f"; most Avro files open in one worker: {run.peaks.open_avro_files}"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--users", type=int, default=100)
    parser.add_argument("--per-batch", type=int, default=100_000)
    parser.add_argument("--max-open", type=int, default=32)
    parser.add_argument("--codec", default="snappy")
    parser.add_argument("--payload", action="store_true", help="JSON payload column mode")
    parser.add_argument("--baseline", action="store_true", help="also Spark's format('avro')")
    options = parser.parse_args()
    with (
        tempfile.TemporaryDirectory(prefix="files-sink-bench-") as work,
        testing.kafka_bootstrap(Path(work)) as bootstrap,
    ):
        return run(bootstrap, Path(work), options)


def run(bootstrap: str, work: Path, options: argparse.Namespace) -> int:
    name = uuid.uuid4().hex[:8]
    source, refs = f"bench_files_in_{name}", f"bench_files_refs_{name}"
    create_topics(bootstrap, 3, source, refs)
    input_bytes = preload(bootstrap, source, options.rows, options.users)
    common = {
        "bootstrap": bootstrap,
        "input": source,
        "per_batch": options.per_batch,
        "jars": ",".join(str(j) for j in testing.spark_jars()),
        "payload": options.payload,
        "columns": COLUMNS,
    }
    txn = spark_job(
        {
            **common,
            "format": "kafka_txn",
            "checkpoint": str(work / "ck_txn"),
            "path": str(work / "files_txn"),
            "options": {
                "kafka.bootstrap.servers": bootstrap,
                "sinkId": f"bench_{name}",
                "commitLog": str(work / "log"),
                "path": str(work / "files_txn"),
                "referencesTopic": refs,
                "partitionBy": "user",
                "timePartitionColumn": "ts",
                "timePartitionPattern": "date=yyyy-MM-dd/hour=HH",
                "avroCodec": options.codec,
                "maxOpenFiles": str(options.max_open),
                **({"payloadColumn": "payload"} if options.payload else {}),
            },
        }
    )
    print(
        f"rows={options.rows} users={options.users} per_batch={options.per_batch} "
        f"mode={'payload' if options.payload else 'spark-schema'} codec={options.codec} "
        f"maxOpenFiles={options.max_open} input={input_bytes / 1e6:.1f} MB"
    )
    print(describe("kafka_txn files mode", txn, input_bytes))
    if options.baseline:
        avro = spark_job(
            {
                **common,
                "format": "avro",
                "checkpoint": str(work / "ck_avro"),
                "path": str(work / "files_avro"),
                "options": {"compression": options.codec.replace("zstandard", "zstd")},
            }
        )
        print(describe("Spark format('avro')", avro, input_bytes))
        print(
            f"kafka_txn / avro rows/s = {(txn.rows / txn.seconds) / (avro.rows / avro.seconds):.2f}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
