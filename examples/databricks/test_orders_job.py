"""orders_job.py, unchanged, run by ``spark-submit`` in local mode, as CI runs it from the wheel.

A real broker and the connector jars come from the fixtures of ``kafka_txn_sink.testing``. Two
runs of the job over the same input and checkpoint: the second finds nothing new, so a
read_committed consumer sees every input record exactly once, and the job's consumer group
(option consumerGroup) shows every input record read.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pyspark
from chispa import assert_df_equality
from pyspark.sql import SparkSession

from kafka_txn_sink.testing import AnyKafkaBroker, read_committed
from kafka_txn_sink.testing.consumer_groups import describe_group

JOB = Path(__file__).with_name("orders_job.py")
RECORDS = [(f"k{n}", json.dumps({"order_id": f"o-{n}", "amount": n})) for n in range(50)]
JOB_TIMEOUT_S = 600


def spark_submit(jars: list[str], *args: str) -> dict[str, Any]:
    """Run the job with this interpreter's pyspark in local mode; its summary line."""
    command = [
        str(Path(pyspark.__file__).parent / "bin" / "spark-submit"),
        "--master", "local[2]",
        "--jars", ",".join(jars),
        "--conf", "spark.ui.enabled=false",
        str(JOB), *args,
    ]  # fmt: skip
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "SPARK_LOCAL_IP": "127.0.0.1"}
    done = subprocess.run(
        command, env=env, capture_output=True, text=True, timeout=JOB_TIMEOUT_S, check=False
    )
    assert done.returncode == 0, f"spark-submit exited {done.returncode}:\n{done.stderr[-4000:]}"
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def test_job_copies_each_record_once_across_two_runs(
    kts_spark: SparkSession, kts_kafka: AnyKafkaBroker, kts_spark_jars: list[str], tmp_path: Path
) -> None:
    name = uuid.uuid4().hex[:8]
    source = kts_kafka.create_topic(f"orders_{name}")
    copy = kts_kafka.create_topic(f"orders_copy_{name}")
    records = kts_spark.createDataFrame(RECORDS, "key STRING, value STRING")
    records.write.format("kafka").option("kafka.bootstrap.servers", kts_kafka.bootstrap).option(
        "topic", source
    ).save()
    job_args = [
        "--bootstrap", kts_kafka.bootstrap,
        "--input-topic", source,
        "--output-topic", copy,
        "--sink-id", f"orders_copy_{name}",
        "--commit-log", str(tmp_path / "commit_log"),
        "--checkpoint", str(tmp_path / "checkpoint"),
        "--max-offsets-per-trigger", "20",
        "--sink-option", "kafka.linger.ms=5",
        "--sink-option", f"consumerGroup=orders_copy_{name}",
    ]  # fmt: skip

    first = spark_submit(kts_spark_jars, *job_args)
    again = spark_submit(kts_spark_jars, *job_args)

    assert first["rows"] == len(RECORDS) and len(first["batches"]) >= 3, first
    assert again["rows"] == 0, again
    seen = read_committed(kts_spark, copy).selectExpr(
        "CAST(key AS STRING) AS key", "CAST(value AS STRING) AS value"
    )
    assert_df_equality(seen, records, ignore_row_order=True, ignore_nullable=True)
    # The group shows the job's progress: every input record read, no lag.
    rows = describe_group(kts_kafka.bootstrap, f"orders_copy_{name}")
    assert sum(r.current or 0 for r in rows) == len(RECORDS) and all(r.lag == 0 for r in rows)
