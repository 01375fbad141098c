"""A records-only sink loads neither the Avro stack nor the S3 client, in the driver or a task.

A fresh Python process plays one batch through the sink's real code against the test bed's
broker: `streamWriter()` (the driver's start of a batch), `write()` as a task (Spark's task
context stood in by a stub), `commit()` (decision, EndTxn, completion, clean-up). It then
reports which libraries it imported and what a read_committed consumer sees. The same script
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

pytestmark = pytest.mark.kafka

SCRIPT = textwrap.dedent(
    """
    import json, sys
    from unittest import mock

    from pyspark.sql.types import StringType, StructField, StructType

    import kafka_txn_sink.protocol.prepare as prepare
    from kafka_txn_sink.datasource import KafkaTxnDataSource
    from kafka_txn_sink.testing.topics import read_topic


    class TaskContextStub:
        def getLocalProperty(self, key):
            return {"streaming.sql.batchId": "0", "sql.streaming.queryId": "q-1"}.get(key)

        def partitionId(self):
            return 0

        def attemptNumber(self):
            return 0


    options = json.loads(sys.argv[1])
    schema = StructType([StructField("value", StringType())])
    writer = KafkaTxnDataSource(options).streamWriter(schema, False)
    with mock.patch.object(prepare.TaskContext, "get", return_value=TaskContextStub()):
        message = writer.write(iter([("a",), ("b",)]))
    writer.commit([message], 0)
    loaded = {name: name in sys.modules for name in ("fastavro", "boto3", "botocore")}
    topic = options.get("topic") or options["referencesTopic"]
    seen = len(read_topic(options["kafka.bootstrap.servers"], topic))
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


def test_a_records_only_batch_imports_neither_fastavro_nor_boto3(
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
    assert result["loaded"] == {"fastavro": False, "boto3": False, "botocore": False}


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
