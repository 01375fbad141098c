"""A Databricks job: the records of a Kafka topic to another topic, exactly once, then stop.

Run by the job of databricks.yml (a Python script task), and unchanged by ``spark-submit`` on any
Spark 4 with the wheel installed::

    spark-submit --jars <spark-sql-kafka-0-10 and its deps> orders_job.py \\
        --bootstrap broker:9092 --input-topic orders --output-topic orders_copy \\
        --sink-id orders_copy --commit-log /Volumes/main/default/kts/orders_copy/_log \\
        --checkpoint /Volumes/main/default/kts/orders_copy/checkpoint

One run writes everything the input holds when it starts (``availableNow``: the only trigger
serverless compute allows) and exits 0; a failed query exits non-zero with its error. A value
of ``--source-option`` or ``--sink-option`` written ``secret:SCOPE/KEY`` is read from that
Databricks secret scope (``dbutils.secrets.get``), so no secret appears in the job's definition.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.functions import col, from_json

import kafka_txn_sink

SECRET_PREFIX = "secret:"


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """The job's parameters (the ``parameters`` of its task in databricks.yml)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bootstrap", required=True, help="Kafka bootstrap servers")
    parser.add_argument("--input-topic", required=True)
    parser.add_argument("--output-topic", required=True)
    parser.add_argument("--sink-id", required=True, help="stable identity of this sink")
    parser.add_argument("--commit-log", required=True, help="a /Volumes/... path or s3://...")
    parser.add_argument("--checkpoint", required=True, help="the query's checkpointLocation")
    parser.add_argument("--max-offsets-per-trigger", type=int, default=100_000)
    parser.add_argument(
        "--source-option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="option of Spark's Kafka source (Java client settings as kafka.KEY)",
    )
    parser.add_argument(
        "--value-ddl",
        help="parse the input's JSON values into this struct (a DDL string, e.g. 'id STRING, "
        "amount DOUBLE') and write that struct: with --sink-option valueFormat=avro the sink "
        "registers its Avro schema in the Schema Registry and writes Confluent's wire format",
    )
    parser.add_argument(
        "--sink-option",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="option of the kafka_txn sink (librdkafka settings as kafka.KEY, s3.*)",
    )
    return parser.parse_args(argv)


def options(pairs: Sequence[str]) -> dict[str, str]:
    """``KEY=VALUE`` pairs as options, ``secret:SCOPE/KEY`` values read from secret scopes."""
    found: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise SystemExit(f"orders_job: expected KEY=VALUE, got {pair!r}")
        found[key] = (
            secret(value[len(SECRET_PREFIX) :]) if value.startswith(SECRET_PREFIX) else value
        )
    return found


def secret(reference: str) -> str:
    """The secret ``SCOPE/KEY`` from a Databricks secret scope."""
    scope, sep, key = reference.partition("/")
    if not sep or not scope or not key:
        raise SystemExit(
            f"orders_job: a secret is named {SECRET_PREFIX}SCOPE/KEY, not {reference!r}"
        )
    try:
        from databricks.sdk.runtime import dbutils
    except ImportError as exc:
        raise SystemExit(
            f"orders_job: {SECRET_PREFIX}{reference} needs Databricks' dbutils"
        ) from exc
    return str(dbutils.secrets.get(scope=scope, key=key))


def read_input(spark: SparkSession, args: argparse.Namespace, extra: dict[str, str]) -> DataFrame:
    """The input topic from its start, as key and value (Spark's Kafka source); with
    ``--value-ddl`` the value parsed from JSON into that struct."""
    records = (
        spark.readStream.format("kafka")
        .option("kafka.bootstrap.servers", args.bootstrap)
        .option("subscribe", args.input_topic)
        .option("startingOffsets", "earliest")
        .option("maxOffsetsPerTrigger", args.max_offsets_per_trigger)
        .options(**extra)
        .load()
    )
    if not args.value_ddl:
        return records.select("key", "value")
    value = from_json(col("value").cast("string"), args.value_ddl)
    return records.select("key", value.alias("value"))


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Write everything the input holds now, exactly once; a summary of the run."""
    spark = SparkSession.builder.appName(f"kafka_txn {args.sink_id}").getOrCreate()
    # Databricks does not discover Python data sources of installed packages: register it.
    kafka_txn_sink.register(spark)
    query = (
        read_input(spark, args, options(args.source_option))
        .writeStream.format("kafka_txn")
        .option("kafka.bootstrap.servers", args.bootstrap)
        .option("topic", args.output_topic)
        .option("sinkId", args.sink_id)
        .option("commitLog", args.commit_log)
        .option("checkpointLocation", args.checkpoint)
        .options(**options(args.sink_option))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    progress = query.recentProgress
    return {
        "batches": [p["batchId"] for p in progress],
        "rows": sum(p["numInputRows"] for p in progress),
        "spark": spark.version,
    }


def main(argv: Sequence[str] | None = None) -> int:
    """Run the job; print its summary as one JSON line."""
    print(json.dumps(run(parse_args(argv))), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
