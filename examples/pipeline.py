"""A streaming job: Kafka topic -> format("kafka_txn") -> Kafka topic, until the input is drained.

Used by the demo and, as a separate process that tests kill, by the end-to-end tests:

    python examples/pipeline.py --bootstrap 127.0.0.1:9092 --input events --output events_out \
        --sink-id demo --commit-log /tmp/demo/_log --checkpoint /tmp/demo/ckpt

With --input-dir the source is a directory of JSON-lines files (`key`, `value` strings) instead
of a topic, one file per batch: the tests of PySpark 4.1 use it, whose Kafka source cannot
restart (SPARK-55271).

With --remote sc://host:port it is a Spark Connect client: the query runs in that server, whose
own settings (master, jars, the Python of its workers) apply.

It exits 0 when every available input row was written, and 3 with the error on stderr (and as
JSON on stdout) when the query failed.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--input", default="", help="input topic")
    parser.add_argument("--input-bootstrap", default="", help="the input's cluster (--bootstrap)")
    parser.add_argument("--input-dir", default="", help="JSON-lines files instead of a topic")
    parser.add_argument("--output", required=True, help="output topic; '' for none")
    parser.add_argument("--sink-id", required=True)
    parser.add_argument("--commit-log", required=True)
    parser.add_argument("--checkpoint", required=True)
    parser.add_argument("--max-offsets", type=int, default=1000, help="maxOffsetsPerTrigger")
    parser.add_argument("--partitions", type=int, default=0, help="repartition to this many")
    parser.add_argument(
        "--repartition-by", default="", help="columns (comma-separated) --partitions hashes"
    )
    parser.add_argument(
        "--deduplicate",
        action="store_true",
        help="a stateful operator before the sink: streaming deduplication by key",
    )
    parser.add_argument(
        "--aggregate",
        action="store_true",
        help="a streaming aggregation before the sink (Append mode, behind a watermark): each "
        "record its own group; needs the column offset (--select)",
    )
    parser.add_argument(
        "--partition-by-task",
        action="store_true",
        help="write each Spark task's rows to the output partition of its number",
    )
    parser.add_argument("--master", default="local[2,4]")
    parser.add_argument("--jars", default=os.environ.get("KTS_SPARK_JARS", ""))
    parser.add_argument("--option", action="append", default=[], help="extra sink option k=v")
    parser.add_argument("--remote", default="", help="a Spark Connect server (sc://host:port)")
    parser.add_argument("--register", action="store_true", help="use kafka_txn_sink.register()")
    parser.add_argument(
        "--select",
        action="append",
        default=[],
        help="SQL expression of an output column "
        "over the Kafka source's columns (default: key, value)",
    )
    return parser.parse_args(argv)


def build_spark(master: str, jars: str, remote: str = "") -> Any:
    from pyspark.sql import SparkSession

    if remote:  # the server's settings apply; this client needs no kafka_txn_sink
        return SparkSession.builder.remote(remote).getOrCreate()
    builder = (
        SparkSession.builder.master(master)
        .appName("kafka_txn_pipeline")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "4")
        .config("spark.driver.memory", "1g")
        .config("spark.python.worker.reuse", "true")
    )
    if jars:
        builder = builder.config("spark.jars", jars)
    for name, value in executor_environment().items():
        builder = builder.config(f"spark.executorEnv.{name}", value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def executor_environment() -> dict[str, str]:
    """The failpoint settings of this process: executors in JVMs of their own (a standalone
    cluster) see only the environment their worker gives them, plus spark.executorEnv.*."""
    from kafka_txn_sink import failpoints

    return {name: os.environ[name] for name in failpoints.VARIABLES if os.environ.get(name)}


def run(args: argparse.Namespace) -> dict[str, Any]:
    spark = build_spark(args.master, args.jars, args.remote)
    if args.register:
        import kafka_txn_sink

        kafka_txn_sink.register(spark)
    source = shaped(read_source(spark, args).selectExpr(*(args.select or ["key", "value"])), args)
    writer = (
        source.writeStream.format("kafka_txn")
        .option("kafka.bootstrap.servers", args.bootstrap)
        .option("sinkId", args.sink_id)
        .option("commitLog", args.commit_log)
        .option("checkpointLocation", args.checkpoint)
        .trigger(availableNow=True)
    )
    if args.output:  # without it, files mode alone (option path) writes the rows
        writer = writer.option("topic", args.output)
    for item in args.option:
        key, _, value = item.partition("=")
        writer = writer.option(key, value)
    started = time.monotonic()
    query = writer.start()
    query.awaitTermination()
    progress = query.recentProgress
    # Over Connect: whether the client needed the package (only register() does).
    sink_imported = "kafka_txn_sink" in sys.modules
    return {
        "ok": True,
        "seconds": round(time.monotonic() - started, 2),
        "batches": [p["batchId"] for p in progress],
        "rows": sum(p.numInputRows for p in progress),  # over Connect the key is None
        # What Spark's own progress says of the sink: rows written, and its description.
        "sink_rows": sum(p.sink.numOutputRows for p in progress),
        "sink": progress[-1].sink.description if progress else None,
        "spark": spark.version,
        "writer": None if args.remote else local_writer(),
        "sink_imported": sink_imported,
    }


def shaped(source: Any, args: argparse.Namespace) -> Any:
    """The source with the query's shape before the sink: a repartition (by columns, or round
    robin), a deduplication, the task's number as the output partition."""
    if args.partitions:
        columns = [c for c in args.repartition_by.split(",") if c]
        source = source.repartition(args.partitions, *columns)
    if args.deduplicate:
        source = source.dropDuplicates(["key"])
    if args.aggregate:
        source = aggregated(source)
    if args.partition_by_task:
        source = source.selectExpr("*", "spark_partition_id() AS partition")
    return source


# The aggregation's event time: a record's offset, in seconds; a record keyed `flush`, produced
# last, is far ahead and closes every other window. The watermark trails the highest offset
# read by 60: more than the input partitions' ends of one batch differ by in the tests
# (tests/e2e/test_repair_shuffled.py), so no record arrives late.
EVENT_TIME = (
    "CASE WHEN CAST(key AS STRING) = 'flush' THEN timestamp_seconds(1000000000) "
    "ELSE timestamp_seconds(offset) END"
)
WATERMARK_DELAY = "60 seconds"


def aggregated(source: Any) -> Any:
    """A streaming aggregation in Append mode: every record is its own group (key, value, a
    one-second window of its event time), emitted when the watermark passes its window, one
    batch or more after the batch that read it."""
    from pyspark.sql import functions as F

    return (
        source.withColumn("event", F.expr(EVENT_TIME))
        .withWatermark("event", WATERMARK_DELAY)
        .groupBy(F.window("event", "1 second"), "key", "value")
        .count()
        .select("key", "value")
    )


def local_writer() -> str:
    """The sink's writer class in this PySpark (Arrow batches on 4.1+)."""
    from kafka_txn_sink.protocol.stream_writer import stream_writer_class

    return stream_writer_class().__name__


def read_source(spark: Any, args: argparse.Namespace) -> Any:
    if args.input_dir:
        return (
            spark.readStream.schema("key STRING, value STRING")
            .option("maxFilesPerTrigger", 1)
            .json(args.input_dir)
        )
    if not args.input:
        raise SystemExit("pipeline: --input or --input-dir is required")
    return (
        spark.readStream.format("kafka")
        .option("kafka.bootstrap.servers", args.input_bootstrap or args.bootstrap)
        .option("subscribe", args.input)
        .option("startingOffsets", "earliest")
        .option("maxOffsetsPerTrigger", args.max_offsets)
        .load()
    )


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        result = run(args)
    except Exception as exc:  # the caller wants the query's error, whatever its type
        message = f"{type(exc).__name__}: {exc}"
        print(json.dumps({"ok": False, "error": message}), flush=True)
        print(message, file=sys.stderr, flush=True)
        return 3
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
