"""A records-only sink loads no module of the files, s3 or delta extras (the Avro stack, the S3
client, delta-rs), in the driver or a task: the core install runs it.

A fresh Python process with a local Spark plays one batch through the sink's real code against
the test bed's broker: `streamWriter()` (the driver's start of a batch), `write()` in a real
Spark task (its own Python worker, the batch's local properties set as a micro-batch has them),
`commit()` (decision, EndTxn, completion, clean-up). It then reports which libraries the driver
process and the task's worker imported, and what a read_committed consumer sees. The same script
in files mode imports fastavro, which shows the check looks where it should.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path

import pytest

from kafka_txn_sink.testing import create_topic

pytestmark = [pytest.mark.kafka, pytest.mark.spark]

SCRIPT = textwrap.dedent(
    """
    import json, os, sys

    from pyspark.sql import SparkSession
    from pyspark.sql.types import StringType, StructField, StructType

    from kafka_txn_sink.datasource import KafkaTxnDataSource
    from kafka_txn_sink.testing.topics import read_topic

    LIBRARIES = ("fastavro", "polars_avro", "boto3", "botocore", "deltalake")

    builder = SparkSession.builder.master("local[1]").config("spark.ui.enabled", "false")
    spark = builder.getOrCreate()
    context = spark.sparkContext
    # What Spark gives a driver-side Python worker (protocol/runs.py tells drivers apart by it):
    # the driver's block manager directories; this script runs the driver's steps itself.
    disk = context._jvm.org.apache.spark.SparkEnv.get().blockManager().diskBlockManager()
    os.environ["SPARK_LOCAL_DIRS"] = ",".join(d.getPath() for d in disk.localDirs())
    # What Spark sets for a micro-batch's tasks: they reach the task's real TaskContext.
    context.setLocalProperty("streaming.sql.batchId", "0")
    context.setLocalProperty("sql.streaming.queryId", "q-1")

    options = json.loads(sys.argv[1])
    schema = StructType([StructField("value", StringType())])
    writer = KafkaTxnDataSource(options).streamWriter(schema, False)


    def task(_):
        message = writer.write(iter([("a",), ("b",)]))
        yield message, {name: name in sys.modules for name in LIBRARIES}


    [(message, task_loaded)] = context.parallelize([0], 1).mapPartitions(task).collect()
    writer.commit([message], 0)
    driver_loaded = {name: name in sys.modules for name in LIBRARIES}
    loaded = {name: driver_loaded[name] or task_loaded[name] for name in LIBRARIES}
    topic = options.get("topic") or options["referencesTopic"]
    seen = len(read_topic(options["kafka.bootstrap.servers"], topic))
    spark.stop()
    print(json.dumps({"loaded": loaded, "seen": seen}))
    """
)


def run_batch(options: dict[str, str]) -> dict[str, object]:
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, json.dumps(options)],
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result: dict[str, object] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def test_a_records_only_batch_imports_no_module_of_the_files_s3_or_delta_extras(
    kafka_bootstrap: str, tmp_path: Path, unique: Callable[[str], str]
) -> None:
    topic = unique("imports_out")
    create_topic(kafka_bootstrap, topic, partitions=1)

    result = run_batch(
        {
            "kafka.bootstrap.servers": kafka_bootstrap,
            "topic": topic,
            "sinkId": unique("imports"),
            "commitLog": str(tmp_path / "log"),
        }
    )

    assert result["seen"] == 2  # the batch really went through the sink
    # The core install has none of them (pyproject.toml's extras files, s3 and delta).
    assert result["loaded"] == {
        "fastavro": False,
        "polars_avro": False,
        "boto3": False,
        "botocore": False,
        "deltalake": False,
    }


def test_files_mode_does_load_fastavro(
    kafka_bootstrap: str, tmp_path: Path, unique: Callable[[str], str]
) -> None:
    refs = unique("imports_refs")
    create_topic(kafka_bootstrap, refs, partitions=1)

    result = run_batch(
        {
            "kafka.bootstrap.servers": kafka_bootstrap,
            "sinkId": unique("imports_files"),
            "commitLog": str(tmp_path / "log"),
            "path": str(tmp_path / "files"),
            "referencesTopic": refs,
        }
    )

    assert result["seen"] == 1  # one file, one reference
    assert result["loaded"]["fastavro"] is True  # type: ignore[index]
