"""Commit-log latency per batch (JSON vs Delta, local vs S3) and the Delta table's size.

    .venv/bin/python benchmarks/commit_log_latency.py --batches 200 --size-batches 1000

Latency: per batch, what the driver writes (decision, completion, hint) on one log object, and
what a fresh driver step reads first (open the log, latest decision, incomplete batches). S3 is
the test bed's moto server (or KTS_S3_ENDPOINT). Size: files and bytes after `--size-batches`
decided and completed batches on a local directory, with and without compaction.
"""

from __future__ import annotations

import argparse
import functools
import os
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import boto3

from kafka_txn_sink import testing
from kafka_txn_sink.commit_log import CommitLog, LogFormat, open_commit_log
from kafka_txn_sink.commit_log.delta_log import TABLE_PROPERTIES, DeltaCommitLog
from kafka_txn_sink.protocol.messages import Completion, Decision, Participant, Triple
from kafka_txn_sink.protocol.run_records import SinkMeta
from kafka_txn_sink.storage import S3Settings

PARTITIONS = 4
READS = 50


def decision(batch_id: int) -> Decision:
    participants = tuple(
        Participant(
            partition=p,
            attempt=0,
            triple=Triple(f"bench-{p}", 1000 + p, batch_id % 30_000),
            rows=250,
            offsets={"out": {p: (batch_id * 250, batch_id * 250 + 249)}},
        )
        for p in range(PARTITIONS)
    )
    return Decision("bench", "query-1", batch_id, participants, PARTITIONS, 1000, _now_ms())


def write_batch(log: CommitLog, batch_id: int) -> None:
    log.put_decision(decision(batch_id))
    log.put_completion(Completion("bench", batch_id, _now_ms()))
    log.write_hint(batch_id)


def read_step(uri: str, s3: S3Settings | None, fmt: LogFormat) -> None:
    log = open_commit_log(uri, s3, fmt)
    log.latest_decision()
    log.incomplete_batches()


def timed(action: Callable[[], None]) -> float:
    started = time.perf_counter()
    action()
    return (time.perf_counter() - started) * 1000


def percentiles(samples: list[float]) -> str:
    ordered = sorted(samples)
    p99 = ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))]
    return f"{statistics.median(ordered):8.1f} {p99:8.1f}"


def latency(uri: str, s3: S3Settings | None, fmt: LogFormat, batches: int) -> tuple[str, str]:
    log = open_commit_log(uri, s3, fmt)
    log.create(SinkMeta("bench", _now_ms()))
    writes = [timed(functools.partial(write_batch, log, b)) for b in range(batches)]
    reads = [timed(functools.partial(read_step, uri, s3, fmt)) for _ in range(READS)]
    return percentiles(writes), percentiles(reads)


def tree_size(root: Path) -> tuple[int, int, int]:
    """(data files, _delta_log files, bytes) under root."""
    data = log = size = 0
    for path in root.rglob("*"):
        if path.is_file():
            size += path.stat().st_size
            if "_delta_log" in path.parts:
                log += 1
            else:
                data += 1
    return data, log, size


def size_row(label: str, root: Path, log: CommitLog, batches: int) -> str:
    log.create(SinkMeta("bench", _now_ms()))
    started = time.perf_counter()
    for batch_id in range(batches):
        write_batch(log, batch_id)
    seconds = time.perf_counter() - started
    data, log_files, size = tree_size(root)
    active = len(log._table.file_uris()) if isinstance(log, DeltaCommitLog) and log._table else "-"
    return f"{label:<44} {active!s:>7} {data:>7} {log_files:>7} {size / 1024:>9.0f} {seconds:>7.1f}"


def s3_target(endpoint: str) -> tuple[str, S3Settings]:
    settings = S3Settings(endpoint_url=endpoint, region="us-east-1")
    bucket = f"bench-{uuid.uuid4().hex[:10]}"
    boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1").create_bucket(Bucket=bucket)
    return f"s3://{bucket}", settings


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, default=200, help="batches per latency run")
    parser.add_argument("--size-batches", type=int, default=1000, help="batches for the size runs")
    parser.add_argument("--no-s3", action="store_true", help="skip the S3 latency runs")
    args = parser.parse_args()
    testing.set_default_aws_env()
    work = Path(tempfile.mkdtemp(prefix="commit-log-bench-"))

    server = None
    endpoint = os.environ.get("KTS_S3_ENDPOINT")
    if not args.no_s3 and not endpoint:
        server = testing.S3Server(work / "moto")
        endpoint = server.start()
    try:
        print(f"latency per batch, ms ({args.batches} batches; reads: {READS} fresh opens)")
        print(f"{'log':<14} {'write p50':>9} {'p99':>8}  {'read p50':>8} {'p99':>8}")
        formats: tuple[LogFormat, ...] = ("json", "delta")
        for fmt in formats:
            targets: list[tuple[str, str, S3Settings | None]] = [
                ("local", str(work / f"latency-{fmt}"), None)
            ]
            if endpoint and not args.no_s3:
                targets.append(("s3", *s3_target(endpoint)))
            for where, uri, s3 in targets:
                writes, reads = latency(uri, s3, fmt, args.batches)
                print(f"{fmt + ' ' + where:<14} {writes}  {reads}")
    finally:
        if server is not None:
            server.stop()

    n = args.size_batches
    print(f"\nsize after {n} decided and completed batches, local")
    print(f"{'log':<44} {'active':>7} {'data':>7} {'_log':>7} {'KiB':>9} {'s':>7}")
    json_root = work / "size-json"
    print(size_row("json", json_root, open_commit_log(str(json_root)), n))
    for label, every, properties in [
        ("delta, no compaction", 0, TABLE_PROPERTIES),
        ("delta, compact every 100 (default retention)", 100, TABLE_PROPERTIES),
        ("delta, compact every 100, retention 0", 100, _no_retention()),
    ]:
        root = work / f"size-{uuid.uuid4().hex[:6]}"
        log = DeltaCommitLog(str(root), compact_every=every, table_properties=properties)
        print(size_row(label, root, log, n))
    return 0


def _no_retention() -> dict[str, str]:
    return {
        **TABLE_PROPERTIES,
        "delta.deletedFileRetentionDuration": "interval 0 seconds",
        "delta.logRetentionDuration": "interval 0 seconds",
    }


def _now_ms() -> int:
    return int(time.time() * 1000)


if __name__ == "__main__":
    sys.exit(main())
