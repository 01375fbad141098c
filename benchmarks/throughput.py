"""kafka_txn beside Spark's own sinks, on Spark 4.3 and 4.0 in one run: the benchmark matrix.

    ci/setup_spark_newest.sh
    .venv/bin/python benchmarks/throughput.py --newest-python .venv-spark-newest/bin/python
    .venv/bin/python benchmarks/throughput.py --newest-python .venv-spark-newest/bin/python \
        --rows 20000 --rounds 1 --memory-rows 2000 --commit-tasks 8     # every cell once

Every writer reads the same preloaded input with the Kafka source, in two shapes: `wide`, many
partitions in one large batch (8 partitions, `--rows` in one batch), and `narrow`, few
partitions in several batches (2 partitions, `--rows` in 4 batches); and two row variants
(bench_rows.py): `100b` (~100-byte values) and `log12` (twelve typed fields). Writers:

  kafka       Spark's format("kafka") (at-least-once)         both variants
  records     kafka_txn records mode                          both variants
  records_avro  the same, the value an Avro struct registered   log12
              with the test bed's Schema Registry (valueFormat=avro)
  records_dl  kafka_txn records with badRows=deadLetter        both variants
              and no bad row (what dead letters cost)
  floor       a Python sink that writes nothing (noop_sink)   both variants
  avro        Spark's format("avro"), local                   log12
  avro_p      the same, partitioned by service, level (16)    log12
  files       kafka_txn files mode, local                     log12
  files_p     the same, partitioned like avro_p               log12
  files_s3    kafka_txn files mode on the S3 server (moto)    log12
  files_s3_p  the same, partitioned                           log12
  payload     kafka_txn files, the JSON value as payload      log12

All run on PySpark 4.3 (`--newest-python`; kafka_txn takes Arrow batches) and, beside it, the
row path of this venv's PySpark 4.0 (LINE40_WRITERS). One Spark application per line runs every
round in turn; the order of the writers rotates from round to round.
A query's rate is its rows over its batches' `triggerExecution`, without its first batch when
it has several; a writer's figure is the median over the rounds after the first (the first warms
up the JVM and the Python workers; with one round, that round), with the spread (min-max).
Ratios are taken round by round (writers of the same round), then the same median and spread.
Then the peak RSS of the executor Python worker that wrote one partition of `--memory-rows` and
of 16 times that (fresh applications, records, files and payload mode, per line), and the
driver's commit overhead (commit_overhead.py). Every Kafka writer runs with its client's
defaults unless `--shared-producer` gives all of them the same batching settings
(SHARED_PRODUCER); Avro files are uncompressed on both sides unless `--avro-codec` names another
codec for both.
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
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import commit_overhead
from bench_report import (
    Costs,
    Rates,
    cpu_table,
    memory_table,
    rate_table,
    ratio_table,
    throughput_chart,
)
from bench_rows import LOG12_DDL, PARTITION_BY, VARIANTS, Data, make_data, produce_all

from kafka_txn_sink import testing
from tests.e2e.harness import create_topics

BENCHMARKS = Path(__file__).resolve().parent
SHARED_PRODUCER = {"linger.ms": "20", "batch.size": "1000000", "compression.type": "none"}
SHAPES = {"wide": (8, 1), "narrow": (2, 4)}  # shape -> (partitions, batches)
QUERY_TIMEOUT_S = 1800
# kafka_txn's avroCodec -> Spark's Avro `compression` (Spark's default, snappy, is not ours: null)
AVRO_CODECS = {"null": "uncompressed", "snappy": "snappy", "deflate": "deflate"}


@dataclass(frozen=True)
class Writer:
    """One writer of the matrix: how its query is shaped and what it writes to."""

    label: str
    format: str  # "" for the floor, whose format depends on the line
    shape: str  # bench_job's row shape: kafka, files or payload
    variants: tuple[str, ...] = VARIANTS
    partitioned: bool = False
    s3: bool = False


LOG12 = ("log12",)
WRITERS = {
    "kafka": Writer("Spark format('kafka')", "kafka", "kafka"),
    "records": Writer("kafka_txn records", "kafka_txn", "kafka"),
    "records_avro": Writer("kafka_txn records, Avro values", "kafka_txn", "avro_value", LOG12),
    "records_dl": Writer("kafka_txn records, badRows=deadLetter", "kafka_txn", "kafka"),
    "floor": Writer("a Python sink writing nothing", "", "kafka"),
    "avro": Writer("Spark format('avro')", "avro", "files", LOG12),
    "avro_p": Writer("Spark format('avro'), 16 partitions", "avro", "files", LOG12, True),
    "files": Writer("kafka_txn files, local", "kafka_txn", "files", LOG12),
    "files_p": Writer("kafka_txn files, local, 16 partitions", "kafka_txn", "files", LOG12, True),
    "files_s3": Writer("kafka_txn files, S3", "kafka_txn", "files", LOG12, s3=True),
    "files_s3_p": Writer(
        "kafka_txn files, S3, 16 partitions", "kafka_txn", "files", LOG12, True, True
    ),
    "payload": Writer("kafka_txn files, JSON payload", "kafka_txn", "payload", LOG12),
}
LINE40_WRITERS = (
    "kafka",
    "records",
    "records_avro",
    "records_dl",
    "floor",
    "avro",
    "avro_p",
    "files",
    "files_p",
)
# 4.0 gives Python sinks rows, the newest line Arrow batches
FLOORS = {"4.0": "noop_python", testing.newest_spark_line(): "noop_arrow"}


@dataclass(frozen=True)
class Line:
    """A Spark line: its tag, interpreter, jars and the environment that resolved them."""

    tag: str
    python: str
    jars: str
    env: dict[str, str]


@dataclass
class Cell:
    """One input of the matrix: a row variant in a shape, preloaded into its own topic."""

    variant: str
    shape: str
    topic: str
    partitions: int
    per_batch: int
    bytes_per_row: float
    raw_rows_per_s: float

    @property
    def key(self) -> str:
        """`variant shape`, the cell's column in the tables."""
        return f"{self.variant} {self.shape}"


@dataclass
class Bench:
    """The broker, S3 bucket and scratch directory every query of the run shares."""

    bootstrap: str
    s3_endpoint: str
    bucket: str
    work: Path
    producer: dict[str, str]
    codec: str
    registry: str = ""  # the Schema Registry's URL, when a writer needs it
    broker_pid: int | None = None  # to read the broker's CPU per query
    topics: dict[str, str] = field(default_factory=dict)

    def topic(self, name: str, partitions: int) -> str:
        """The output topic `name` of `partitions` partitions, created on first use."""
        if name not in self.topics:
            self.topics[name] = f"bench_{name}_{uuid.uuid4().hex[:8]}".replace(" ", "_")
            create_topics(self.bootstrap, partitions, self.topics[name])
        return self.topics[name]

    def txn_options(self, name: str) -> dict[str, str]:
        """kafka_txn's options for a fresh sink `name`, common to both modes."""
        return {
            "kafka.bootstrap.servers": self.bootstrap,
            "sinkId": f"bench_{name}",
            "commitLog": str(self.work / f"log_{name}"),
            **{f"kafka.{k}": v for k, v in self.producer.items()},
        }

    def options(self, key: str, cell: Cell, run: str, line: str) -> dict[str, str]:
        """The writer options of writer `key` in `cell`; `run` names this one query."""
        writer = WRITERS[key]
        out = f"{line} {cell.key} {key}"
        if key == "kafka":
            topic = self.topic(out, cell.partitions)
            producer = {f"kafka.{k}": v for k, v in self.producer.items()}
            return {"kafka.bootstrap.servers": self.bootstrap, "topic": topic, **producer}
        if key == "records":
            return {**self.txn_options(run), "topic": self.topic(out, cell.partitions)}
        if key == "records_dl":  # dead letters on, and no bad row: what the good path costs
            dead = {"badRows": "deadLetter", "deadLetterTopic": self.topic(f"{out} dlq", 1)}
            return {**self.txn_options(run), "topic": self.topic(out, cell.partitions), **dead}
        if key == "records_avro":
            registry = {"valueFormat": "avro", "schema.registry.url": self.registry}
            return {**self.txn_options(run), "topic": self.topic(out, cell.partitions), **registry}
        if writer.format == "avro":
            return {"path": str(self.work / f"out_{run}"), "compression": AVRO_CODECS[self.codec]}
        if writer.format != "kafka_txn":
            return {}
        options = {
            **self.txn_options(run),
            "referencesTopic": self.topic(out, cell.partitions),
            "avroCodec": self.codec,
        }
        if writer.s3:
            options.update(testing.sink_s3_options(self.s3_endpoint))
            options["path"] = f"s3://{self.bucket}/{run}"
        else:
            options["path"] = str(self.work / f"out_{run}")
        if writer.partitioned:
            options["partitionBy"] = ",".join(PARTITION_BY)
        if writer.shape == "payload":
            options["payloadColumn"] = "payload"
        return options

    def query(self, key: str, cell: Cell, line: str, round_no: int) -> dict[str, Any]:
        """bench_job's description of writer `key` on `cell` in round `round_no`."""
        writer = WRITERS[key]
        run = f"{key}_{line}_{cell.variant}_{cell.shape}_r{round_no}_{uuid.uuid4().hex[:6]}"
        run = run.replace(".", "")
        spark_partitions = writer.partitioned and writer.format == "avro"  # kafka_txn: an option
        return {
            "name": f"{line}|{cell.key}|{key}|r{round_no}",
            "bootstrap": self.bootstrap,
            "input": cell.topic,
            "per_batch": cell.per_batch,
            "variant": cell.variant,
            "shape": writer.shape,
            "ddl": LOG12_DDL,
            "format": writer.format or FLOORS[line],
            "checkpoint": str(self.work / f"ck_{run}"),
            "options": self.options(key, cell, run, line),
            "partition_by": list(PARTITION_BY) if spark_partitions else [],
            "timeout_s": QUERY_TIMEOUT_S,
        }


def run_app(
    line: Line,
    queries: list[dict[str, Any]],
    env: dict[str, str] | None = None,
    broker_pid: int | None = None,
) -> dict[str, dict[str, Any]]:
    """Run `queries` in one Spark application of `line`; what bench_job printed of each query
    (its batches and its CPU) by its name."""
    full_env = {
        **os.environ,
        **line.env,
        **(env or {}),
        "PYSPARK_PYTHON": line.python,
        "SPARK_LOCAL_IP": "127.0.0.1",
        "PYTHONPATH": str(BENCHMARKS),
    }
    done = subprocess.run(
        [
            line.python,
            str(BENCHMARKS / "bench_job.py"),
            json.dumps({"jars": line.jars, "queries": queries, "broker_pid": broker_pid}),
        ],
        capture_output=True,
        text=True,
        env=full_env,
        timeout=600 + QUERY_TIMEOUT_S * len(queries),
        check=False,
    )
    found = [json.loads(x) for x in done.stdout.splitlines() if x.startswith("{")]
    if done.returncode != 0 or len(found) != len(queries):
        raise RuntimeError(f"Spark {line.tag} application failed:\n{done.stderr[-4000:]}")
    return {body["name"]: body for body in found}


def rows_per_s(batches: list[list[int]]) -> float:
    """Rows over the batches' triggerExecution, without the first of several batches."""
    steady = batches[1:] or batches
    millis = sum(b[1] for b in steady)
    return sum(b[0] for b in steady) / (millis / 1000) if millis else 0.0


def rotated(keys: list[str], round_no: int) -> list[str]:
    """`keys` rotated by `round_no`: each round starts with another writer."""
    shift = round_no % len(keys) if keys else 0
    return keys[shift:] + keys[:shift]


def preload(bench: Bench, variants: list[str], shapes: list[str], rows: int) -> list[Cell]:
    """One input topic per variant and shape, loaded with the same rows."""
    cells = []
    for variant in variants:
        data: Data = make_data(variant, rows)
        for shape in shapes:
            partitions, batches = SHAPES[shape]
            topic = f"bench_in_{variant}_{shape}_{uuid.uuid4().hex[:8]}"
            create_topics(bench.bootstrap, partitions, topic)
            raw = produce_all(bench.bootstrap, topic, data)
            # Spark shares maxOffsetsPerTrigger among partitions rounding down: the slack keeps
            # the remainder out of a tiny extra batch.
            per_batch = -(-rows // batches) + partitions
            cells.append(
                Cell(variant, shape, topic, partitions, per_batch, data.bytes_per_row, raw)
            )
            print(
                f"input {variant} {shape}: {rows:,} rows, {data.bytes_per_row:.0f} B/row, "
                f"{partitions} partitions, {batches} batch(es); raw producer {raw:,.0f} rows/s",
                flush=True,
            )
    return cells


def run_rounds(
    bench: Bench, lines: list[Line], cells: list[Cell], writers: list[str], rounds: int
) -> tuple[Rates, Costs]:
    """One application per line runs every round in turn: each writer on each cell, in an
    order that rotates from round to round. The first round warms up the application's JVM
    and Python workers (a cold first query runs at a third of its warm rate) and is left out
    of the figures when there are more. Also each query's CPU per row (machine, broker)."""
    rates: Rates = {}
    costs: Costs = {}
    for line in lines:
        queries = [
            bench.query(k, cell, line.tag, round_no)
            for round_no in range(rounds)
            for cell in cells
            for k in rotated(writers, round_no)
            if runs_on(k, line.tag) and cell.variant in WRITERS[k].variants
        ]
        started = time.monotonic()
        for name, body in run_app(line, queries, broker_pid=bench.broker_pid).items():
            line_tag, cell_key, key, _ = name.split("|")
            batches, cpu = body["batches"], body["cpu"]
            rates.setdefault((line_tag, cell_key, key), []).append(rows_per_s(batches))
            rows = sum(b[0] for b in batches) or 1
            per_row = (cpu["busy_s"] * 1e6 / rows, cpu["broker_s"] * 1e6 / rows)
            costs.setdefault((line_tag, cell_key, key), []).append(per_row)
            print(
                f"  {name:<40} {rows_per_s(batches):>10,.0f} rows/s {batches}; CPU "
                f"{cpu['busy_s']:.1f} s (broker {cpu['broker_s']:.1f}) in {cpu['wall_s']:.1f} s",
                flush=True,
            )
        print(
            f"Spark {line.tag}: {rounds} round(s), {len(queries)} queries in "
            f"{time.monotonic() - started:.0f} s",
            flush=True,
        )
    return rates, costs


def runs_on(key: str, tag: str) -> bool:
    """Whether writer `key` runs on the Spark line `tag`."""
    return tag != "4.0" or key in LINE40_WRITERS


MEMORY_INPUTS = {  # mode -> (row variant, bench_job shape)
    "records": ("100b", "kafka"),
    "files": ("100b", "files"),
    "payload": ("log12", "payload"),
}


def memory(bench: Bench, line: Line, base_rows: int) -> dict[str, dict[int, int]]:
    """Peak RSS (KiB) of the worker that wrote one partition of 1x and 16x base_rows, per mode
    (payload mode: log12 JSON values as the payload column)."""
    peaks: dict[str, dict[int, int]] = {mode: {} for mode in MEMORY_INPUTS}
    for factor in (1, 16):
        rows = base_rows * factor
        for mode, (variant, shape) in MEMORY_INPUTS.items():
            topic = f"bench_mem_{uuid.uuid4().hex[:8]}"
            create_topics(bench.bootstrap, 1, topic)
            produce_all(bench.bootstrap, topic, make_data(variant, rows))
            cell = Cell(variant, "memory", topic, 1, rows, 0.0, 0.0)
            peaks[mode][rows] = memory_peak(bench, line, cell, mode, shape, factor)
    return peaks


def memory_peak(bench: Bench, line: Line, cell: Cell, mode: str, shape: str, factor: int) -> int:
    """Peak RSS (KiB) of the task that wrote `cell` in `mode`, in a fresh application."""
    name = f"m{mode}{factor}_{line.tag}_{uuid.uuid4().hex[:6]}".replace(".", "")
    options = {**bench.txn_options(name), "transactionTimeoutMs": "600000"}
    out = bench.topic(f"mem {name}", 1)
    if mode == "records":
        options["topic"] = out
    else:
        options.update({"referencesTopic": out, "path": str(bench.work / f"mem_{name}")})
    if mode == "payload":
        options["payloadColumn"] = "payload"
    query = {
        "name": name,
        "bootstrap": bench.bootstrap,
        "input": cell.topic,
        "per_batch": cell.per_batch,
        "variant": cell.variant,
        "shape": shape,
        "ddl": LOG12_DDL,
        "format": "kafka_txn_measured",
        "checkpoint": str(bench.work / f"ck_{name}"),
        "options": options,
        "timeout_s": QUERY_TIMEOUT_S,
    }
    rss_file = bench.work / f"rss_{name}.jsonl"
    run_app(line, [query], {"KTS_BENCH_RSS_FILE": str(rss_file)})
    found = [json.loads(x) for x in rss_file.read_text().splitlines()]
    print(f"  memory {line.tag} {mode} {cell.per_batch:,} rows: {found}", flush=True)
    return max(r["peak_rss_kb"] for r in found if r["rows"] > 0)


def parse_args() -> argparse.Namespace:
    """The command line."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000, help="rows per input")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--shapes", default=",".join(SHAPES))
    parser.add_argument("--writers", default=",".join(WRITERS), help="of " + ",".join(WRITERS))
    parser.add_argument("--newest-python", default="", help="e.g. .venv-spark-newest/bin/python")
    parser.add_argument("--no-spark40", action="store_true", help="leave out the 4.0 row path")
    parser.add_argument("--memory-rows", type=int, default=25_000, help="0: skip memory")
    parser.add_argument("--commit-tasks", default="8,32,128", help="'': skip commit overhead")
    parser.add_argument("--avro-codec", default="null", choices=sorted(AVRO_CODECS))
    parser.add_argument("--chart", default="", help="an SVG file: rows/s and ratios")
    parser.add_argument(
        "--shared-producer", action="store_true", help=f"every Kafka writer: {SHARED_PRODUCER}"
    )
    return parser.parse_args()


def spark_lines(options: argparse.Namespace) -> list[Line]:
    """The Spark lines to measure: the newest first when given, then this venv's 4.0."""
    lines = []
    if options.newest_python:
        python = str(Path(options.newest_python).absolute())
        env = testing.spark_newest_package_env()
        jars = ",".join(testing.spark_jars_of(python, env))
        lines.append(Line(testing.newest_spark_line(), python, jars, env))
    if not options.no_spark40:
        jars = ",".join(testing.spark_jars_of(sys.executable, {}))
        lines.append(Line("4.0", sys.executable, jars, {}))
    if not lines:
        raise SystemExit("nothing to run: give --newest-python or drop --no-spark40")
    return lines


def main() -> int:
    """Start (or reach) a broker and an S3 server, run the matrix, print its tables."""
    options = parse_args()
    with tempfile.TemporaryDirectory(prefix="kts-bench-") as tmp:
        work = Path(tmp)
        with broker(work) as (bootstrap, pid), testing.s3_endpoint(work) as s3:
            if "records_avro" not in options.writers.split(","):
                return run(options, work, (bootstrap, pid), s3, "")
            with testing.SchemaRegistry(work / "registry") as registry:
                return run(options, work, (bootstrap, pid), s3, registry.url)


@contextmanager
def broker(work: Path) -> Iterator[tuple[str, int | None]]:
    """The test bed's broker (`KTS_KAFKA_BOOTSTRAP`, its pid from `KTS_KAFKA_PID`) or one of
    ours: its bootstrap and pid."""
    if os.environ.get("KTS_KAFKA_BOOTSTRAP"):
        pid = os.environ.get("KTS_KAFKA_PID")
        yield os.environ["KTS_KAFKA_BOOTSTRAP"], int(pid) if pid else None
        return
    ours = testing.KafkaBroker(work / "broker")
    bootstrap = ours.start()
    try:
        yield bootstrap, ours.pid
    finally:
        ours.stop()


def run(
    options: argparse.Namespace,
    work: Path,
    kafka: tuple[str, int | None],
    s3: str,
    registry: str,
) -> int:
    """The whole run: inputs, rounds, memory, commit overhead, then the tables."""
    began = time.monotonic()
    lines = spark_lines(options)
    producer = SHARED_PRODUCER if options.shared_producer else {}
    bucket = testing.create_bucket(s3)
    bootstrap, broker_pid = kafka
    bench = Bench(
        bootstrap, s3, bucket, work, dict(producer), options.avro_codec, registry, broker_pid
    )
    writers = [w for w in options.writers.split(",") if w]
    unknown = set(writers) - set(WRITERS)
    if unknown:
        raise SystemExit(f"unknown writers {sorted(unknown)}; known: {', '.join(WRITERS)}")
    cells = preload(bench, options.variants.split(","), options.shapes.split(","), options.rows)
    rates, costs = run_rounds(bench, lines, cells, writers, options.rounds)
    measured = lines if options.memory_rows else []
    memories = {line.tag: memory(bench, line, options.memory_rows) for line in measured}
    commits = [
        result
        for n in (int(t) for t in options.commit_tasks.split(",") if t)
        for result in commit_overhead.measure(
            bootstrap, work, n, commit_overhead.DEFAULT_ROUNDS.get(n, 20)
        )
    ]
    print("\n".join(report(options, lines, cells, writers, rates)))
    if bench.broker_pid:
        print("\n".join(cpu_table(costs, [line.tag for line in lines], [c.key for c in cells])))
    if options.chart:
        tags, keys = [line.tag for line in lines], [cell.key for cell in cells]
        labels = {k: WRITERS[k].label for k in writers}
        throughput_chart(rates, tags, keys, labels, options.chart)
    for tag, peaks in memories.items():
        print("\n".join(memory_table(tag, peaks)))
    if commits:
        print("\n" + commit_overhead.report(commits))
    print(f"\nwall time {time.monotonic() - began:.0f} s")
    return 0


def report(
    options: argparse.Namespace,
    lines: list[Line],
    cells: list[Cell],
    writers: list[str],
    rates: Rates,
) -> list[str]:
    """The settings, the rate table and the ratio table."""
    inputs = "; ".join(
        f"{c.key}: {c.partitions} partitions, {c.per_batch:,} rows a batch, "
        f"{c.bytes_per_row:.0f} B/row, raw producer {c.raw_rows_per_s:,.0f} rows/s"
        for c in cells
    )
    rounds = f"median of rounds 2-{options.rounds}" if options.rounds > 1 else "no warm-up round"
    tags, keys = [line.tag for line in lines], [cell.key for cell in cells]
    return [
        "",
        f"{options.rows:,} rows per input, {options.rounds} round(s), {rounds} (min-max); "
        f"local[2], {os.cpu_count()} CPUs; producers: "
        f"{'shared ' + json.dumps(SHARED_PRODUCER) if options.shared_producer else 'defaults'}; "
        f"Avro codec {options.avro_codec}; partitioned: {', '.join(PARTITION_BY)}",
        f"inputs: {inputs}",
        "",
        "rows/s:",
        *rate_table(rates, tags, keys, {k: WRITERS[k].label for k in writers}),
        "",
        "ratios (round by round, median (min-max)):",
        *ratio_table(rates, tags, keys),
    ]


if __name__ == "__main__":
    sys.exit(main())
