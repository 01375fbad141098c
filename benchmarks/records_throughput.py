"""Rows/s of kafka_txn's records mode beside Spark's built-in Kafka sink and a raw producer.

    .venv/bin/python benchmarks/records_throughput.py --rows 200000

Everything runs in one go on one broker (ours, or KTS_KAFKA_BOOTSTRAP) and the same input, and
the script prints ratios, which drift less than absolute numbers on a shared machine. Spark's
rate is measured over the batches' own durations (triggerExecution), so JVM start-up is not
counted against either sink.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from confluent_kafka import Producer

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "ci"))
sys.path.insert(0, str(ROOT))

import testbed  # noqa: E402

from tests.e2e.harness import create_topics  # noqa: E402

PRODUCER_SETTINGS = {"linger.ms": 20, "batch.size": 1_000_000, "compression.type": "none"}

SPARK_JOB = r"""
import json, sys
from pyspark.sql import SparkSession
args = json.loads(sys.argv[1])
spark = (SparkSession.builder.master("local[2]").config("spark.jars", args["jars"])
         .config("spark.ui.enabled", "false").getOrCreate())
spark.sparkContext.setLogLevel("ERROR")
df = (spark.readStream.format("kafka").option("kafka.bootstrap.servers", args["bootstrap"])
      .option("subscribe", args["input"]).option("startingOffsets", "earliest")
      .option("maxOffsetsPerTrigger", args["per_batch"]).load().selectExpr("key", "value"))
writer = df.writeStream.format(args["format"]).option("checkpointLocation", args["checkpoint"])
for key, value in args["options"].items():
    writer = writer.option(key, value)
query = writer.trigger(availableNow=True).start()
query.awaitTermination()
batches = [(p["numInputRows"], p["durationMs"]["triggerExecution"]) for p in query.recentProgress]
print(json.dumps({"batches": batches}))
"""


def raw_producer(bootstrap: str, topic: str, rows: int, value: bytes) -> float:
    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "enable.idempotence": True,
            "acks": "all",
            **PRODUCER_SETTINGS,
        }
    )
    started = time.perf_counter()
    for i in range(rows):
        while True:
            try:
                producer.produce(topic, key=str(i).encode(), value=value)
                break
            except BufferError:
                producer.poll(0.01)
    producer.flush(120)
    return rows / (time.perf_counter() - started)


def preload(bootstrap: str, topic: str, rows: int, value: bytes) -> None:
    raw_producer(bootstrap, topic, rows, value)


def spark_sink(args: dict[str, Any]) -> tuple[float, list[tuple[int, int]]]:
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "SPARK_LOCAL_IP": "127.0.0.1"}
    done = subprocess.run(
        [sys.executable, "-c", SPARK_JOB, json.dumps(args)],
        capture_output=True,
        text=True,
        env=env,
        timeout=1800,
        check=False,
    )
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or not lines:
        raise RuntimeError(f"{args['format']} run failed:\n{done.stderr[-3000:]}")
    batches = [tuple(b) for b in json.loads(lines[-1])["batches"] if b[0] > 0]
    rows = sum(b[0] for b in batches)
    seconds = sum(b[1] for b in batches) / 1000
    return rows / seconds, batches  # type: ignore[return-value]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--per-batch", type=int, default=50_000)
    parser.add_argument("--value-bytes", type=int, default=100)
    options = parser.parse_args()
    value = b"v" * options.value_bytes
    with tempfile.TemporaryDirectory() as work:
        broker = None
        bootstrap = os.environ.get("KTS_KAFKA_BOOTSTRAP")
        if not bootstrap:
            broker = testbed.KafkaBroker(Path(work) / "broker")
            bootstrap = broker.start()
        try:
            return run(bootstrap, Path(work), options.rows, options.per_batch, value)
        finally:
            if broker is not None:
                broker.stop()


def run(bootstrap: str, work: Path, rows: int, per_batch: int, value: bytes) -> int:
    name = uuid.uuid4().hex[:8]
    topics = {k: f"bench_{k}_{name}" for k in ("in", "raw", "builtin", "txn")}
    create_topics(bootstrap, 3, *topics.values())
    preload(bootstrap, topics["in"], rows, value)
    jars = ",".join(str(j) for j in testbed.spark_jars())
    common = {"bootstrap": bootstrap, "input": topics["in"], "per_batch": per_batch, "jars": jars}
    kafka_settings = {f"kafka.{k}": str(v) for k, v in PRODUCER_SETTINGS.items()}
    builtin, builtin_batches = spark_sink(
        {
            **common,
            "format": "kafka",
            "checkpoint": str(work / "ck_builtin"),
            "options": {
                "kafka.bootstrap.servers": bootstrap,
                "topic": topics["builtin"],
                "kafka.acks": "all",
                "kafka.enable.idempotence": "true",
                "kafka.linger.ms": "20",
                "kafka.batch.size": "1000000",
            },
        }
    )
    txn, txn_batches = spark_sink(
        {
            **common,
            "format": "kafka_txn",
            "checkpoint": str(work / "ck_txn"),
            "options": {
                "kafka.bootstrap.servers": bootstrap,
                "topic": topics["txn"],
                "sinkId": f"bench_{name}",
                "commitLog": str(work / "log"),
                **kafka_settings,
            },
        }
    )
    raw = raw_producer(bootstrap, topics["raw"], rows, value)
    print(
        f"rows={rows} value_bytes={len(value)} batches of {per_batch}; producer settings "
        f"{PRODUCER_SETTINGS}, acks=all, idempotence on"
    )
    print(f"(a) Spark format('kafka')  {builtin:>10,.0f} rows/s  batches {builtin_batches}")
    print(f"(b) kafka_txn records      {txn:>10,.0f} rows/s  batches {txn_batches}")
    print(f"(e) raw confluent-kafka    {raw:>10,.0f} rows/s")
    print(f"b/a = {txn / builtin:.2f}   b/e = {txn / raw:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
