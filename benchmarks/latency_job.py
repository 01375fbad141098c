"""One Spark application of the latency benchmark: one continuous query until told to stop.

    python benchmarks/latency_job.py '<json>'   # run by latency.py with a line's interpreter

The query reads the input topic from its end (Spark's Kafka source, `latest`) and writes key and
value unchanged with `format` (kafka_txn, Spark's kafka, or `floor`: a Python sink writing nothing)
at a processing-time trigger. It
prints `{"started": true}` once its first batch is done, runs until the file `stop` names exists
(at most `max_s`), then prints the mean of each part of its batches' `durationMs` and the batch
count as one JSON line.
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from pyspark.sql import SparkSession


def main() -> int:
    """Run the query of argv[1] (JSON) until its stop file appears."""
    args: dict[str, Any] = json.loads(sys.argv[1])
    spark = (
        SparkSession.builder.master("local[2]")
        .config("spark.jars", args["jars"])
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    sink = args["format"]
    if sink == "floor":  # a Python sink that writes nothing (noop_sink.py), the writer's kind
        from noop_sink import ArrowWriterBase, NoopArrowSource, NoopSource

        floor = NoopArrowSource if ArrowWriterBase is not None else NoopSource
        spark.dataSource.register(floor)
        sink = floor.name()
    source = (
        spark.readStream.format("kafka")
        .option("kafka.bootstrap.servers", args["bootstrap"])
        .option("subscribe", args["input"])
        .option("startingOffsets", "latest")
        .load()
        .select("key", "value")
    )
    writer = source.writeStream.format(sink).option(
        "checkpointLocation", args["checkpoint"]
    )
    for key, value in args["options"].items():
        writer = writer.option(key, value)
    query = writer.trigger(processingTime=f"{args['trigger_ms']} milliseconds").start()
    deadline = time.monotonic() + args["max_s"]
    while not query.recentProgress and time.monotonic() < deadline:
        time.sleep(0.05)
    print(json.dumps({"started": True}), flush=True)
    stop = Path(args["stop"])
    while not stop.exists() and time.monotonic() < deadline and query.isActive:
        time.sleep(0.05)
    error = query.exception()
    query.stop()
    batches = [p for p in query.recentProgress if p["numInputRows"] > 0]
    parts = sorted({k for p in batches for k in p["durationMs"]})
    means = {k: statistics.fmean(p["durationMs"].get(k, 0) for p in batches) for k in parts}
    print(json.dumps({"batches": len(batches), "duration_ms": means, "error": str(error or "")}))
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
