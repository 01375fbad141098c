"""A batch job: N generated rows -> `df.write.format("kafka_txn")...save()`, run as a separate
process group that the batch-write tests can hold at a failpoint, kill and run again.

    python tests/e2e/batch_job.py --bootstrap 127.0.0.1:9092 --topic out --sink-id nightly \
        --commit-log /tmp/nightly/_log --write-id 2026-11-21 --rows 1000

The rows have the columns `n` (0..N-1), `key` (`row-000000`...), `user` (`user0`..`user2`) and
`value` (JSON of `id`, the key, `user` and `n`); `--select` picks SQL expressions over them
(default: key, value). It exits 0 when the write succeeded, and 3 with the error on stderr
(and as JSON on stdout) when it failed.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

COLUMNS = (
    "n",
    "format_string('row-%06d', n) AS key",
    "concat('user', CAST(n % 3 AS STRING)) AS user",
)
VALUE = "to_json(named_struct('id', key, 'user', user, 'n', n)) AS value"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--topic", default="", help="output topic; '' for files mode alone")
    parser.add_argument("--sink-id", required=True)
    parser.add_argument("--commit-log", required=True)
    parser.add_argument("--write-id", default="", help="option writeId; '' leaves it out")
    parser.add_argument("--rows", type=int, default=1000)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--mode", default="append", help="the save mode")
    parser.add_argument("--option", action="append", default=[], help="extra sink option k=v")
    parser.add_argument("--select", action="append", default=[], help="an output column (SQL)")
    return parser.parse_args(argv)


def run(args: argparse.Namespace) -> dict[str, Any]:
    from pyspark.sql import SparkSession

    from kafka_txn_sink.protocol.batch_writer import batch_writer_class

    spark = (
        SparkSession.builder.master(args.master)
        .appName("kafka_txn_batch_job")
        .config("spark.ui.enabled", "false")
        .config("spark.driver.memory", "1g")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    rows = spark.range(0, args.rows, 1, args.partitions).withColumnRenamed("id", "n")
    rows = rows.selectExpr(*COLUMNS).selectExpr("*", VALUE)
    frame = rows.selectExpr(*(args.select or ["key", "value"]))
    writer = (
        frame.write.format("kafka_txn")
        .mode(args.mode)
        .option("kafka.bootstrap.servers", args.bootstrap)
        .option("sinkId", args.sink_id)
        .option("commitLog", args.commit_log)
    )
    if args.topic:
        writer = writer.option("topic", args.topic)
    if args.write_id:
        writer = writer.option("writeId", args.write_id)
    for item in args.option:
        key, _, value = item.partition("=")
        writer = writer.option(key, value)
    started = time.monotonic()
    writer.save()
    return {
        "ok": True,
        "seconds": round(time.monotonic() - started, 2),
        "spark": spark.version,
        "writer": batch_writer_class().__name__,
    }


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        result = run(args)
    except Exception as exc:  # the caller wants the job's error, whatever its type
        message = f"{type(exc).__name__}: {exc}"
        print(json.dumps({"ok": False, "error": message}), flush=True)
        print(message, file=sys.stderr, flush=True)
        return 3
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
