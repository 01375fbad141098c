"""Spark SQL reads the Delta commit log that delta-rs wrote (delta-spark, from Maven Central)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from kafka_txn_sink.commit_log.delta_log import DeltaCommitLog
from kafka_txn_sink.protocol.messages import Completion, Decision, Participant, Triple
from kafka_txn_sink.protocol.run_records import SinkMeta
from kafka_txn_sink.testing import MARKER, MAVEN_SETTINGS, cache_dir

pytestmark = pytest.mark.spark

# Delta 4.0.x is built for Spark 4.0, the pinned pyspark (kafka_txn_sink/testing/versions.env).
DELTA_ARTIFACTS = ("io.delta:delta-spark_2.13:4.0.0", "io.delta:delta-storage:4.0.0")

SPARK_SQL = r"""
import json, sys
from pyspark.sql import SparkSession
jars, table = sys.argv[1], sys.argv[2]
spark = (SparkSession.builder.master("local[1]").config("spark.jars", jars)
         .config("spark.sql.extensions", "io.delta.sql.DeltaSparkSessionExtension")
         .config("spark.sql.catalog.spark_catalog",
                 "org.apache.spark.sql.delta.catalog.DeltaCatalog")
         .config("spark.ui.enabled", "false").getOrCreate())
spark.sparkContext.setLogLevel("ERROR")
rows = spark.sql(f'''
    SELECT kind, batch_id, query_id, rows, size(participants) AS participants,
           participants[0].transactional_id AS first_id, lost_rows,
           get_json_object(record, '$.output.out.0') AS output
    FROM delta.`{table}` WHERE batch_id > 1 ORDER BY kind DESC, batch_id''').collect()
print(json.dumps([row.asDict() for row in rows]))
"""


@pytest.fixture(scope="session")
def delta_jars() -> list[str]:
    out = cache_dir() / "delta-spark-4.0.0"
    if not (out / MARKER).exists():
        mvn = shutil.which("mvn")
        assert mvn is not None, "Maven (mvn) resolves the delta-spark jars"
        settings = str(MAVEN_SETTINGS)
        for artifact in DELTA_ARTIFACTS:
            copy = [f"-Dartifact={artifact}", f"-DoutputDirectory={out}"]
            command = [mvn, "-q", "-B", "-s", settings, "dependency:copy", *copy]
            subprocess.run(command, check=True, timeout=900)
        (out / MARKER).touch()
    return sorted(str(jar) for jar in out.glob("*.jar"))


def decision(batch_id: int) -> Decision:
    participant = Participant(
        0, 0, Triple("orders-0", 7, batch_id), 10, {"out": {0: (batch_id, batch_id)}}
    )
    return Decision("orders", "query-1", batch_id, (participant,), 1, 10, 1_000 + batch_id)


def test_spark_sql_reads_the_log_table(tmp_path: Path, delta_jars: list[str]) -> None:
    # Compaction and checkpoints every 3 batches: Spark must read what delta-rs made of them too.
    log = DeltaCommitLog(str(tmp_path / "log"), compact_every=3)
    log.create(SinkMeta("orders", created_at_ms=1))
    for batch_id in range(5):
        log.put_decision(decision(batch_id))
        log.put_completion(Completion("orders", batch_id, completed_at_ms=2_000 + batch_id))

    done = subprocess.run(
        [sys.executable, "-c", SPARK_SQL, ",".join(delta_jars), str(tmp_path / "log")],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    rows = json.loads(done.stdout.strip().splitlines()[-1])
    decisions = [
        {
            "kind": "decision",
            "batch_id": b,
            "query_id": "query-1",
            "rows": 10,
            "participants": 1,
            "first_id": "orders-0",
            "lost_rows": None,
            "output": f"[{b},{b}]",
        }
        for b in (2, 3, 4)
    ]
    completions = [
        {
            "kind": "completion",
            "batch_id": b,
            "query_id": None,
            "rows": None,
            "participants": None,
            "first_id": None,
            "lost_rows": 0,
            "output": None,
        }
        for b in (2, 3, 4)
    ]
    assert rows == decisions + completions
