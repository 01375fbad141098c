"""Throughput and memory of one task's FileSet (files mode, executor side), no Spark.

    .venv/bin/python benchmarks/files_throughput.py --rows 200000 --users 100 --codec snappy
    .venv/bin/python benchmarks/files_throughput.py --rows 100000 --users 10000 --max-open 16

Rows are log-like with 12 fields, partitioned by `user` and `date=yyyy-MM-dd/hour=HH` of their
timestamp, written to a local directory (fsync off unless --durable) or, with --payload, as a
JSON payload column whose schema is inferred per file. Prints rows/s, MB/s of input (the
row's UTF-8 size as JSON) and of Avro output, files, and the peak RSS of the process (with
--sorted, which sorts every row in memory first, the RSS is the sort's, not the FileSet's).
"""

from __future__ import annotations

import argparse
import json
import random
import resource
import tempfile
import time
from collections.abc import Iterable, Iterator
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

from pyspark.sql.types import (
    DoubleType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from kafka_txn_sink.files.naming import FileNaming
from kafka_txn_sink.files.plan import plan_files
from kafka_txn_sink.files.writer import FileSet
from kafka_txn_sink.storage.files import LocalFileSink

SCHEMA = StructType(
    [
        StructField("ts", TimestampType(), False),
        StructField("user", StringType(), False),
        StructField("level", StringType(), True),
        StructField("service", StringType(), True),
        StructField("host", StringType(), True),
        StructField("message", StringType(), True),
        StructField("status", IntegerType(), True),
        StructField("latency_ms", DoubleType(), True),
        StructField("bytes", LongType(), True),
        StructField("trace_id", StringType(), True),
        StructField("path", StringType(), True),
        StructField("user_agent", StringType(), True),
    ]
)
PAYLOAD_SCHEMA = StructType(
    [
        StructField("ts", TimestampType(), False),
        StructField("user", StringType(), False),
        StructField("payload", StringType(), False),
    ]
)
LEVELS = ["DEBUG", "INFO", "INFO", "INFO", "WARN", "ERROR"]


def make_rows(count: int, users: int, seed: int = 7) -> Iterator[tuple[Any, ...]]:
    """Rows over one day in time order, users at random; made on the fly (not held)."""
    rnd = random.Random(seed)
    start = datetime(2026, 11, 21, 0, 0, tzinfo=timezone.utc)
    for i in range(count):
        yield (
            start + timedelta(seconds=i * 86400 // count),
            f"user{rnd.randrange(users):05d}",
            rnd.choice(LEVELS),
            rnd.choice(["api", "auth", "billing", "search"]),
            f"host-{rnd.randrange(20):02d}.example.internal",
            f"request {i} handled with result {rnd.randrange(1000)}",
            rnd.choice([200, 200, 200, 201, 404, 500]),
            rnd.random() * 250,
            rnd.randrange(100, 100_000),
            f"{rnd.getrandbits(128):032x}",
            f"/v1/items/{rnd.randrange(10_000)}",
            "Mozilla/5.0 (X11; Linux x86_64) bench/1.0",
        )


def as_payload_rows(rows: Iterable[tuple[Any, ...]]) -> Iterator[tuple[Any, ...]]:
    names = SCHEMA.names
    for row in rows:
        body = {n: v for n, v in zip(names, row, strict=True) if n not in ("ts", "user")}
        yield (row[0], row[1], json.dumps(body))


def rows_of(args: argparse.Namespace) -> Iterator[tuple[Any, ...]]:
    rows: Iterable[tuple[Any, ...]] = make_rows(args.rows, args.users)
    if args.sorted:
        rows = sorted(rows, key=lambda r: r[1])
    return as_payload_rows(rows) if args.payload else iter(rows)


def rss_mib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--users", type=int, default=100)
    parser.add_argument("--codec", default="snappy")
    parser.add_argument("--max-open", type=int, default=32)
    parser.add_argument("--max-records", type=int, default=0)
    parser.add_argument("--payload", action="store_true")
    parser.add_argument("--durable", action="store_true")
    parser.add_argument("--sorted", action="store_true", help="rows sorted by user first")
    args = parser.parse_args()

    input_bytes = sum(len(json.dumps(r, default=str).encode()) for r in rows_of(args))
    plan = plan_files(
        PAYLOAD_SCHEMA if args.payload else SCHEMA,
        partition_by=["user"],
        time_column="ts",
        time_pattern="date=yyyy-MM-dd/hour=HH",
        payload_column="payload" if args.payload else None,
        codec=args.codec,
        max_open_files=args.max_open,
        max_records_per_file=args.max_records,
    )
    with tempfile.TemporaryDirectory(prefix="files-bench-") as root:
        sink = LocalFileSink(root, durable=args.durable)
        rows = rows_of(args)
        baseline_mib = rss_mib()
        started = time.perf_counter()
        with FileSet(plan, sink, FileNaming(0, 0, 0)) as files:
            for row in rows:
                files.add(row)
            written = files.close()
        elapsed = time.perf_counter() - started
    output_bytes = sum(w.ref.bytes for w in written)
    peak_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(
        f"mode={'payload' if args.payload else 'spark'} codec={args.codec} rows={args.rows} "
        f"users={args.users} max_open={args.max_open} sorted={args.sorted}\n"
        f"  {args.rows / elapsed:,.0f} rows/s, input {input_bytes / elapsed / 1e6:.1f} MB/s, "
        f"avro {output_bytes / elapsed / 1e6:.1f} MB/s, {elapsed:.2f} s\n"
        f"  files={len(written)} avro={output_bytes / 1e6:.1f} MB "
        f"peak_open={files.peak_open_files} rss before={baseline_mib:.0f} MiB "
        f"peak={peak_mib:.0f} MiB"
    )


if __name__ == "__main__":
    main()
