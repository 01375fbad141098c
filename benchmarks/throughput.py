"""kafka_txn beside Spark's own sinks and a raw producer: one run, one broker, the same rows.

    .venv/bin/python benchmarks/throughput.py                      # defaults: ~10-15 min here
    .venv/bin/python benchmarks/throughput.py --rows 2000000       # the issue's full size
    ci/setup_spark42.sh && .venv/bin/python benchmarks/throughput.py \
        --spark42-python .venv-spark42/bin/python                  # + the Arrow path on 4.2

Per variant (`100b`: a ~100-byte value with a short key; `log12`: a log-like JSON object of 12
fields, parsed by the query into 12 columns), the input topic is preloaded once and read by every
Spark writer with the same `maxOffsetsPerTrigger`:

  (a) Spark's built-in Kafka sink, format("kafka") (at-least-once)
  (b) kafka_txn records mode
  (c) kafka_txn files mode to a local directory (Avro, no compression, no partitioning)
  (d) Spark's format("avro") file sink to a local directory (the same columns)
  (c3) kafka_txn files mode to the S3 server (moto, or KTS_S3_ENDPOINT)
  (e) a raw confluent-kafka produce loop of the same keys and values, no Spark
  (f) the floor of any Python sink: a Python data source that writes nothing (noop_sink.py)
  (cp), (dp): log12 only, (c) and (d) partitioned by service and level (16 directories)

Kafka writers share one set of producer settings (printed). Spark's rate is rows over the sum of
the batches' `triggerExecution`, without the first batch (it also starts the JVM's Kafka
consumers and, for Python sinks, the Python workers; the all-batch rate is printed too). MB/s is
of the input rows (key + value bytes as read from Kafka). Memory: peak RSS (VmHWM) of the
executor Python worker that ran one partition of `--memory-rows` rows and of 16 times that,
each in a fresh Spark application, records mode and files mode. Last, the driver's commit
overhead per batch (benchmarks/commit_overhead.py) for 8, 32 and 128 tasks.

With --spark42-python, (a), (b) and (c) run again on PySpark 4.2 (SPARK42_VERSION), where
kafka_txn takes Arrow batches (DataSourceStreamArrowWriter); on the test bed's 4.0.0 it takes rows.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import boto3
import commit_overhead
from confluent_kafka import Producer

from kafka_txn_sink import testing
from tests.e2e.harness import create_topics

ROOT = Path(__file__).resolve().parents[1]

# The same for every Kafka writer; acks=all and idempotence on (kafka_txn owns both).
PRODUCER = {"linger.ms": "20", "batch.size": "1000000", "compression.type": "none"}
LOG12_DDL = (
    "ts TIMESTAMP, user STRING, level STRING, service STRING, host STRING, message STRING, "
    "status INT, latency_ms DOUBLE, bytes BIGINT, trace_id STRING, path STRING, user_agent STRING"
)
LEVELS = ["DEBUG", "INFO", "INFO", "INFO", "WARN", "ERROR"]
PARTITION_BY = ("service", "level")  # (cp) and (dp): 4 x 4 = 16 directories

SPARK_JOB = r"""
import json, sys
args = json.loads(sys.argv[1])
from pyspark.sql import SparkSession
from pyspark.sql.functions import col, from_json
spark = (SparkSession.builder.master("local[2]").config("spark.jars", args["jars"])
         .config("spark.ui.enabled", "false").config("spark.sql.shuffle.partitions", "2")
         .config("spark.sql.session.timeZone", "UTC").getOrCreate())
spark.sparkContext.setLogLevel("ERROR")
if args["format"] == "kafka_txn_measured":
    from bench_source import MeasuredKafkaTxn
    spark.dataSource.register(MeasuredKafkaTxn)
if args["format"] == "noop_python":
    from noop_sink import NoopSource
    spark.dataSource.register(NoopSource)
if args["format"] == "noop_arrow":
    from noop_sink import NoopArrowSource
    spark.dataSource.register(NoopArrowSource)
df = (spark.readStream.format("kafka").option("kafka.bootstrap.servers", args["bootstrap"])
      .option("subscribe", args["input"]).option("startingOffsets", "earliest")
      .option("maxOffsetsPerTrigger", args["per_batch"]).load())
if args["variant"] == "log12":
    rows = df.select(from_json(col("value").cast("string"), args["ddl"]).alias("r")).select("r.*")
    if args["shape"] == "kafka":
        rows = rows.selectExpr("CAST(user AS STRING) AS key", "to_json(struct(*)) AS value")
else:
    rows = df.selectExpr("key", "value")
writer = rows.writeStream.format(args["format"]).option("checkpointLocation", args["checkpoint"])
if args.get("partition_by") and args["format"] == "avro":
    writer = writer.partitionBy(*args["partition_by"])
for key, value in args["options"].items():
    writer = writer.option(key, value)
query = writer.trigger(availableNow=True).start()
query.awaitTermination()
batches = [(p["numInputRows"], p["durationMs"]["triggerExecution"]) for p in query.recentProgress]
print(json.dumps({"batches": batches, "spark": spark.version}))
"""


@dataclass
class Data:
    variant: str
    topic: str
    keys: list[bytes]
    values: list[bytes]

    @property
    def bytes_per_row(self) -> float:
        return sum(len(k) + len(v) for k, v in zip(self.keys, self.values, strict=True)) / len(
            self.keys
        )


@dataclass
class Result:
    label: str
    rows_per_s: float
    all_rows_per_s: float
    mb_per_s: float
    batches: list[tuple[int, int]]
    spark: str = ""


def make_data(variant: str, rows: int, topic: str, seed: int = 7) -> Data:
    rnd = random.Random(seed)
    keys = [str(i).encode() for i in range(rows)]
    if variant == "100b":
        values = [(f"{i:012d}-" + "v" * 100)[:100].encode() for i in range(rows)]
    else:
        start = 1_795_000_000
        values = [
            json.dumps(
                {
                    "ts": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(start + i)),
                    "user": f"user{rnd.randrange(1000):05d}",
                    "level": rnd.choice(LEVELS),
                    "service": rnd.choice(["api", "auth", "billing", "search"]),
                    "host": f"host-{rnd.randrange(20):02d}.example.internal",
                    "message": f"request {i} handled with result {rnd.randrange(1000)}",
                    "status": rnd.choice([200, 200, 200, 201, 404, 500]),
                    "latency_ms": round(rnd.uniform(0.1, 900.0), 3),
                    "bytes": rnd.randrange(100, 100_000),
                    "trace_id": f"{rnd.getrandbits(64):016x}",
                    "path": f"/v1/items/{rnd.randrange(10_000)}",
                    "user_agent": "Mozilla/5.0 (X11; Linux x86_64) bench/1.0",
                },
                separators=(",", ":"),
            ).encode()
            for i in range(rows)
        ]
    return Data(variant, topic, keys, values)


def produce_all(bootstrap: str, topic: str, data: Data) -> float:
    """The raw loop (e): rows/s of produce + flush with the shared settings."""
    producer = Producer(
        {"bootstrap.servers": bootstrap, "enable.idempotence": True, "acks": "all", **PRODUCER}
    )
    produce, poll = producer.produce, producer.poll
    started = time.perf_counter()
    for key, value in zip(data.keys, data.values, strict=True):
        while True:
            try:
                produce(topic, value, key)
                break
            except BufferError:
                poll(0.01)
    producer.flush(300)
    return len(data.keys) / (time.perf_counter() - started)


def spark_run(
    python: str, jars: str, env_extra: dict[str, str], args: dict[str, Any]
) -> tuple[list[tuple[int, int]], str]:
    env = {
        **os.environ,
        **env_extra,
        "PYSPARK_PYTHON": python,
        "SPARK_LOCAL_IP": "127.0.0.1",
        "PYTHONPATH": str(ROOT / "benchmarks"),
    }
    done = subprocess.run(
        [python, "-c", SPARK_JOB, json.dumps({**args, "jars": jars, "ddl": LOG12_DDL})],
        capture_output=True,
        text=True,
        env=env,
        timeout=3600,
        check=False,
    )
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or not lines:
        raise RuntimeError(f"{args['format']} run failed:\n{done.stderr[-4000:]}")
    body = json.loads(lines[-1])
    return [tuple(b) for b in body["batches"] if b[0] > 0], body["spark"]  # type: ignore[misc]


def rate(label: str, batches: list[tuple[int, int]], data: Data, spark: str) -> Result:
    steady = batches[1:] or batches
    rows_per_s = sum(b[0] for b in steady) / (sum(b[1] for b in steady) / 1000)
    all_rate = sum(b[0] for b in batches) / (sum(b[1] for b in batches) / 1000)
    return Result(
        label, rows_per_s, all_rate, rows_per_s * data.bytes_per_row / 1e6, batches, spark
    )


def jars_of(python: str, env: dict[str, str]) -> str:
    """The ``--jars`` value of the Spark line of interpreter ``python``."""
    return ",".join(testing.spark_jars_of(python, env))


@dataclass
class Bench:
    bootstrap: str
    s3_endpoint: str
    work: Path
    per_batch: int
    partitions: int
    pythons: dict[str, tuple[str, str, dict[str, str]]]  # tag -> (python, jars, env)

    def kafka_options(self) -> dict[str, str]:
        return {"kafka.bootstrap.servers": self.bootstrap}

    def txn_options(self, name: str) -> dict[str, str]:
        return {
            **self.kafka_options(),
            "sinkId": f"bench_{name}",
            "commitLog": str(self.work / f"log_{name}"),
            **{f"kafka.{k}": v for k, v in PRODUCER.items()},
        }

    def run(
        self,
        tag: str,
        label: str,
        fmt: str,
        shape: str,
        data: Data,
        options: dict[str, str],
        partition_by: tuple[str, ...] = (),
    ) -> Result:
        python, jars, env = self.pythons[tag]
        name = f"{label}_{tag}_{data.variant}_{uuid.uuid4().hex[:6]}".replace(".", "_")
        batches, spark = spark_run(
            python,
            jars,
            env,
            {
                "bootstrap": self.bootstrap,
                "input": data.topic,
                "per_batch": self.per_batch,
                "format": fmt,
                "shape": shape,
                "variant": data.variant,
                "checkpoint": str(self.work / f"ck_{name}"),
                "options": options,
                "partition_by": list(partition_by),
            },
        )
        result = rate(f"{label} ({tag})" if tag != "4.0" else label, batches, data, spark)
        print(
            f"  {result.label:<34} {result.rows_per_s:>10,.0f} rows/s  "
            f"(all batches {result.all_rows_per_s:,.0f}) {batches}",
            flush=True,
        )
        return result

    def variant(self, data: Data, s3_bucket: str) -> dict[str, Result]:
        results: dict[str, Result] = {}
        for tag in self.pythons:
            out = {k: f"bench_{k}_{uuid.uuid4().hex[:8]}" for k in ("a", "b", "refs")}
            create_topics(self.bootstrap, self.partitions, *out.values())
            suffix = "" if tag == "4.0" else f" {tag}"
            results["a" + suffix] = self.run(
                tag,
                "(a) Spark format('kafka')",
                "kafka",
                "kafka",
                data,
                {
                    **self.kafka_options(),
                    "topic": out["a"],
                    "kafka.acks": "all",
                    "kafka.enable.idempotence": "true",
                    **{f"kafka.{k}": v for k, v in PRODUCER.items()},
                },
            )
            name = uuid.uuid4().hex[:8]
            results["b" + suffix] = self.run(
                tag,
                "(b) kafka_txn records",
                "kafka_txn",
                "kafka",
                data,
                {**self.txn_options("b" + name), "topic": out["b"]},
            )
            files = {"referencesTopic": out["refs"]}
            results["c" + suffix] = self.run(
                tag,
                "(c) kafka_txn files, local",
                "kafka_txn",
                "files",
                data,
                {**self.txn_options("c" + name), **files, "path": str(self.work / f"c_{name}")},
            )
            if data.variant == "log12":
                results["cp" + suffix] = self.run(
                    tag,
                    "(cp) kafka_txn files, partitioned",
                    "kafka_txn",
                    "files",
                    data,
                    {
                        **self.txn_options("cp" + name),
                        **files,
                        "path": str(self.work / f"cp_{name}"),
                        "partitionBy": ",".join(PARTITION_BY),
                    },
                )
            floor = "noop_python" if tag == "4.0" else "noop_arrow"
            results["f" + suffix] = self.run(tag, f"(f) floor: {floor}", floor, "kafka", data, {})
            if tag != "4.0":
                continue
            results["d"] = self.run(
                tag,
                "(d) Spark format('avro'), local",
                "avro",
                "files",
                data,
                {"path": str(self.work / f"d_{name}")},
            )
            if data.variant == "log12":
                results["dp"] = self.run(
                    tag,
                    "(dp) Spark format('avro'), partitioned",
                    "avro",
                    "files",
                    data,
                    {"path": str(self.work / f"dp_{name}")},
                    partition_by=PARTITION_BY,
                )
            results["c3"] = self.run(
                tag,
                "(c3) kafka_txn files, S3 (moto)",
                "kafka_txn",
                "files",
                data,
                {
                    **self.txn_options("c3" + name),
                    **files,
                    "path": f"s3://{s3_bucket}/{name}",
                    "s3.endpoint": self.s3_endpoint,
                    "s3.region": "us-east-1",
                    "s3.accessKeyId": "testing",
                    "s3.secretAccessKey": "testing",
                },
            )
        return results

    def memory(self, base_rows: int, tag: str) -> dict[str, dict[int, int]]:
        """Peak RSS (KiB) of the worker that wrote one partition of 1x and 16x base_rows."""
        peaks: dict[str, dict[int, int]] = {"records": {}, "files": {}}
        python, jars, env = self.pythons[tag]
        for factor in (1, 16):
            rows = base_rows * factor
            topic = f"bench_mem_{uuid.uuid4().hex[:8]}"
            create_topics(self.bootstrap, 1, topic)
            data = make_data("100b", rows, topic)
            produce_all(self.bootstrap, topic, data)
            del data
            for mode in ("records", "files"):
                out = f"bench_memout_{uuid.uuid4().hex[:8]}"
                refs = f"bench_memrefs_{uuid.uuid4().hex[:8]}"
                create_topics(self.bootstrap, 1, out, refs)
                name = f"m{mode}{factor}_{uuid.uuid4().hex[:6]}"
                options = {**self.txn_options(name), "transactionTimeoutMs": "600000"}
                if mode == "records":
                    options["topic"] = out
                else:
                    options.update(
                        {"referencesTopic": refs, "path": str(self.work / f"mem_{name}")}
                    )
                rss_file = self.work / f"rss_{name}.jsonl"
                spark_run(
                    python,
                    jars,
                    {**env, "KTS_BENCH_RSS_FILE": str(rss_file)},
                    {
                        "bootstrap": self.bootstrap,
                        "input": topic,
                        "per_batch": rows,
                        "format": "kafka_txn_measured",
                        "shape": "kafka" if mode == "records" else "files",
                        "variant": "100b",
                        "checkpoint": str(self.work / f"ck_{name}"),
                        "options": options,
                    },
                )
                found = [json.loads(line) for line in rss_file.read_text().splitlines()]
                peaks[mode][rows] = max(r["peak_rss_kb"] for r in found if r["rows"] > 0)
                print(f"  memory {mode} {rows} rows: {found}", flush=True)
        return peaks


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=150_000, help="rows per variant")
    parser.add_argument("--per-batch", type=int, default=50_000, help="maxOffsetsPerTrigger")
    parser.add_argument("--partitions", type=int, default=2, help="of every topic (= tasks)")
    parser.add_argument("--variants", default="100b,log12")
    parser.add_argument("--memory-rows", type=int, default=25_000, help="0: skip memory")
    parser.add_argument("--spark42-python", default="", help="e.g. .venv-spark42/bin/python")
    parser.add_argument(
        "--commit-tasks", default="8,32,128", help="driver commit overhead at these task counts"
    )
    options = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        with testing.kafka_bootstrap(work) as bootstrap, testing.s3_endpoint(work) as s3:
            return run(options, work, bootstrap, s3)


def run(options: argparse.Namespace, work: Path, bootstrap: str, s3: str) -> int:
    began = time.monotonic()
    pythons = {"4.0": (sys.executable, jars_of(sys.executable, {}), {})}
    if options.spark42_python:
        python42 = str(Path(options.spark42_python).absolute())
        env42 = testing.spark42_package_env()
        pythons["4.2"] = (python42, jars_of(python42, env42), env42)
    bucket = f"bench-{uuid.uuid4().hex[:10]}"
    boto3.client(
        "s3",
        endpoint_url=s3,
        region_name="us-east-1",
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
    ).create_bucket(Bucket=bucket)
    bench = Bench(bootstrap, s3, work, options.per_batch, options.partitions, pythons)
    tables = []
    for variant in options.variants.split(","):
        topic = f"bench_in_{variant}_{uuid.uuid4().hex[:8]}"
        create_topics(bootstrap, options.partitions, topic)
        data = make_data(variant, options.rows, topic)
        produce_all(bootstrap, topic, data)
        print(f"variant {variant}: {options.rows} rows, {data.bytes_per_row:.0f} B/row", flush=True)
        results = bench.variant(data, bucket)
        raw_topic = f"bench_raw_{uuid.uuid4().hex[:8]}"
        create_topics(bootstrap, options.partitions, raw_topic)
        raw = produce_all(bootstrap, raw_topic, data)
        results["e"] = Result(
            "(e) raw confluent-kafka", raw, raw, raw * data.bytes_per_row / 1e6, []
        )
        print(f"  (e) raw confluent-kafka {raw:>10,.0f} rows/s", flush=True)
        tables.append(table(variant, data, results))
    memory = {}
    if options.memory_rows:
        for tag in pythons:
            memory[tag] = bench.memory(options.memory_rows, tag)
    commits = [
        commit_overhead.measure(bootstrap, work, n, commit_overhead.DEFAULT_ROUNDS.get(n, 20))
        for n in (int(t) for t in options.commit_tasks.split(",") if t)
    ]
    print()
    print(
        f"rows={options.rows} per variant, maxOffsetsPerTrigger={options.per_batch}, "
        f"{options.partitions} partitions per topic (= Spark tasks), local[2], "
        f"{os.cpu_count()} CPUs; producer settings for every Kafka writer: {PRODUCER}, "
        f"acks=all, enable.idempotence=true; files: Avro, no compression, "
        f"unpartitioned except (cp) and (dp): {', '.join(PARTITION_BY)}"
    )
    for lines in tables:
        print("\n".join(lines))
    for tag, peaks in memory.items():
        print(f"\nexecutor Python worker peak RSS, one partition, PySpark {tag}:")
        print("| mode | rows 1x | peak RSS 1x | rows 16x | peak RSS 16x | 16x / 1x |")
        print("|---|---|---|---|---|---|")
        for mode, by_rows in peaks.items():
            (r1, p1), (r16, p16) = sorted(by_rows.items())
            print(
                f"| {mode} | {r1:,} | {p1 / 1024:.0f} MiB | {r16:,} | {p16 / 1024:.0f} MiB "
                f"| {p16 / p1:.2f} |"
            )
    if commits:
        print("\n" + commit_overhead.report(commits))
    print(f"\nwall time {time.monotonic() - began:.0f} s")
    return 0


def table(variant: str, data: Data, results: dict[str, Result]) -> list[str]:
    lines = [
        f"\nvariant {variant} ({data.bytes_per_row:.0f} B/row of key + value):",
        "| writer | Spark | rows/s | MB/s | rows/s incl. first batch |",
        "|---|---|---|---|---|",
    ]
    for result in results.values():
        lines.append(
            f"| {result.label} | {result.spark or '-'} | {result.rows_per_s:,.0f} "
            f"| {result.mb_per_s:.1f} | {result.all_rows_per_s:,.0f} |"
        )

    def ratio(top: str, bottom: str) -> str:
        if top in results and bottom in results:
            value = results[top].rows_per_s / results[bottom].rows_per_s
            return f"{top}/{bottom} = {value:.2f}"
        return ""

    pairs = [("b", "a"), ("b", "e"), ("c", "d"), ("cp", "dp"), ("c3", "d")]
    pairs += [("b 4.2", "a 4.2"), ("b 4.2", "e"), ("c 4.2", "d"), ("cp 4.2", "dp")]
    pairs += [("b", "f"), ("c", "f"), ("f", "a"), ("b 4.2", "f 4.2"), ("f 4.2", "a 4.2")]
    lines.append("ratios: " + ", ".join(r for r in (ratio(t, b) for t, b in pairs) if r))
    return lines


if __name__ == "__main__":
    sys.exit(main())
