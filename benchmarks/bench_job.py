"""One Spark application of the throughput benchmark: the queries it is given, in order.

    python benchmarks/bench_job.py '<json>'   # run by throughput.py with each line's interpreter

The argument holds the application's jars and a list of queries. Each query reads one input
topic with the Kafka source (availableNow, `maxOffsetsPerTrigger`), shapes the rows
(`kafka`: key and value, the log12 rows parsed and written back as JSON; `avro_value`: the
log12 rows as a struct value, which the sink writes as Avro; `files`: the log12 rows as twelve
typed columns, 100b as key and value; `payload`: the JSON value as a string column)
and writes them with one writer. One JSON line per query is printed: its non-empty batches as
[rows, triggerExecution ms], the Spark version and the CPU the query cost: the machine's busy
CPU seconds over the whole query (every process: Spark, its Python workers, the broker) and,
when the argument names the broker's pid, the broker's share of them.
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.functions import col, from_json


def session(jars: str) -> SparkSession:
    """A local[2] session with the Spark packages and the benchmark's Python data sources."""
    spark = (
        SparkSession.builder.master("local[2]")
        .config("spark.jars", jars)
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.sql.session.timeZone", "UTC")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    from bench_source import MeasuredKafkaTxn
    from noop_sink import NoopArrowSource, NoopSource

    for source in (MeasuredKafkaTxn, NoopSource, NoopArrowSource):
        spark.dataSource.register(source)
    return spark


def rows_of(spark: SparkSession, query: dict[str, Any]) -> DataFrame:
    """The query's input topic, shaped for its writer."""
    df = (
        spark.readStream.format("kafka")
        .option("kafka.bootstrap.servers", query["bootstrap"])
        .option("subscribe", query["input"])
        .option("startingOffsets", "earliest")
        .option("maxOffsetsPerTrigger", query["per_batch"])
        .load()
    )
    if query["shape"] == "payload":
        return df.selectExpr("CAST(value AS STRING) AS payload")
    if query["variant"] != "log12":
        return df.selectExpr("key", "value")
    rows = df.select(from_json(col("value").cast("string"), query["ddl"]).alias("r")).select("r.*")
    if query["shape"] == "kafka":
        return rows.selectExpr("CAST(user AS STRING) AS key", "to_json(struct(*)) AS value")
    if query["shape"] == "avro_value":
        return rows.selectExpr("CAST(user AS STRING) AS key", "struct(*) AS value")
    return rows


def run(spark: SparkSession, query: dict[str, Any]) -> list[list[int]]:
    """Run one query to its end; its non-empty batches as [rows, triggerExecution ms]."""
    writer = rows_of(spark, query).writeStream.format(query["format"])
    writer = writer.option("checkpointLocation", query["checkpoint"])
    if query.get("partition_by"):
        writer = writer.partitionBy(*query["partition_by"])
    for key, value in query["options"].items():
        writer = writer.option(key, value)
    started = writer.trigger(availableNow=True).start()
    started.awaitTermination(query["timeout_s"])
    if started.isActive:
        started.stop()
        raise RuntimeError(f"query {query['name']} did not end in {query['timeout_s']} s")
    progress = started.recentProgress
    return [
        [p["numInputRows"], p["durationMs"]["triggerExecution"]]
        for p in progress
        if p["numInputRows"] > 0
    ]


def cpu_seconds(broker_pid: int | None) -> tuple[float, float]:
    """CPU seconds used so far by the whole machine (busy, /proc/stat) and by the broker."""
    tick = os.sysconf("SC_CLK_TCK")
    with open("/proc/stat") as stat:
        fields = [int(x) for x in stat.readline().split()[1:]]
    busy = sum(fields[0:3]) + sum(fields[5:8])  # user, nice, system, irq, softirq, steal
    broker = 0
    if broker_pid:
        with open(f"/proc/{broker_pid}/stat") as stat:
            after_name = stat.read().rsplit(")", 1)[1].split()
        broker = int(after_name[11]) + int(after_name[12])  # utime, stime
    return busy / tick, broker / tick


def main() -> int:
    """Run the queries of argv[1] in order, printing one JSON line per query."""
    args = json.loads(sys.argv[1])
    spark = session(args["jars"])
    broker_pid = args.get("broker_pid")
    for query in args["queries"]:
        began, (busy, broker) = time.monotonic(), cpu_seconds(broker_pid)
        batches = run(spark, query)
        ended, (busy_end, broker_end) = time.monotonic(), cpu_seconds(broker_pid)
        cpu = {"wall_s": ended - began, "busy_s": busy_end - busy, "broker_s": broker_end - broker}
        print(json.dumps(
            {"name": query["name"], "batches": batches, "spark": spark.version, "cpu": cpu}
        ))  # fmt: skip
        sys.stdout.flush()
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
