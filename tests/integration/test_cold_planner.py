"""A batch's planner in a new Python worker, as Spark starts one once the last idled a minute:
with the log in place and nothing to roll forward, its start asks the transaction coordinators
nothing, so it neither imports kafka-python (~130 ms) nor bootstraps a client of it.

Each start runs in a fresh interpreter that has imported what Spark's planner worker has, then
unpickles the data source and calls `streamWriter()` against the test bed's broker, one driver
identity for all. The first start of a sink asks the brokers whether they already know its ids
(kafka-python's ListTransactions), which shows the check looks where it should.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from kafka_txn_sink.protocol.runs import SPARK_DIRS_ENV
from kafka_txn_sink.testing import create_topic

pytestmark = pytest.mark.kafka

PLANNER = """
import json, sys
import pyspark.worker
import pyspark.sql.worker.write_into_data_source
from pyspark.sql.types import StringType, StructField, StructType

from kafka_txn_sink.datasource import KafkaTxnDataSource

schema = StructType([StructField("value", StringType())])
writer = KafkaTxnDataSource(json.loads(sys.argv[1])).streamWriter(schema, False)
print(json.dumps({"run": writer.plan.run.run, "kafka_python": "kafka" in sys.modules}))
"""


def start_in_new_worker(options: dict[str, str], driver: str, cwd: Path) -> dict[str, object]:
    done = subprocess.run(
        [sys.executable, "-c", PLANNER, json.dumps(options)],
        cwd=cwd,
        env={**os.environ, SPARK_DIRS_ENV: driver},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    found: dict[str, object] = json.loads(done.stdout.strip().splitlines()[-1])
    return found


def test_a_cold_planner_with_its_log_in_place_loads_no_kafka_python(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    topic = f"cold_planner_{uuid.uuid4().hex[:8]}"
    create_topic(kafka_bootstrap, topic, partitions=2)
    options = {
        "kafka.bootstrap.servers": kafka_bootstrap,
        "topic": topic,
        "sinkId": f"cold_{uuid.uuid4().hex[:8]}",
        "commitLog": str(tmp_path / "log"),
    }
    driver = str(tmp_path / f"blockmgr-{uuid.uuid4()}")

    first = start_in_new_worker(options, driver, tmp_path)
    later = [start_in_new_worker(options, driver, tmp_path) for _ in range(2)]

    assert first["kafka_python"] is True  # the sink's first start asks for its known ids
    assert [start["kafka_python"] for start in later] == [False, False]
    assert {start["run"] for start in later} == {first["run"]}  # the same driver's run
