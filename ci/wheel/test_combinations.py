"""Each install combination a user would choose runs one batch write (ci/check_wheel.sh).

Run by the wheel check's user venv (the test kit's broker and S3 server, shared by every
combination); each combination's own Python (`KTS_COMBINATIONS`: name=python,...) runs
query.py. A read_committed consumer sees what each wrote; the core install refuses an s3://
commit log at the driver's start with the s3 extra's pip line.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from kafka_txn_sink.testing import create_topic
from kafka_txn_sink.testing.s3_server import sink_s3_options
from kafka_txn_sink.testing.topics import read_topic

QUERY = Path(__file__).with_name("query.py")
PYTHONS = dict(item.split("=", 1) for item in os.environ["KTS_COMBINATIONS"].split(","))
ROWS = 10


@pytest.fixture
def kafka_bootstrap(kts_kafka: Any) -> str:
    """The test kit's broker (its own, or the one at $KTS_KAFKA_BOOTSTRAP)."""
    return str(kts_kafka.bootstrap)

S3 = tuple[str, dict[str, str]]


def write(python: str, options: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [python, str(QUERY), json.dumps(options)], capture_output=True, text=True, timeout=300
    )


def options_of(combination: str, bootstrap: str, out: str, tmp: Path, s3: S3) -> dict[str, str]:
    """The options of the mode that combination is for (`s3`: the bucket and its options)."""
    base = {
        "kafka.bootstrap.servers": bootstrap,
        "sinkId": f"wheel_{combination}",
        "writeId": "w1",
        "commitLog": str(tmp / "log"),
    }
    bucket, s3_options = s3
    if combination == "core":
        return {**base, "topic": out}
    if combination == "files":
        return {**base, "path": str(tmp / "files"), "referencesTopic": out}
    if combination == "delta":
        return {**base, "topic": out, "commitLogFormat": "delta"}
    if combination == "s3":
        return {**base, **s3_options, "topic": out, "commitLog": f"{bucket}/log"}
    # all: files on S3 with the Delta log
    return {
        **base,
        **s3_options,
        "path": f"{bucket}/files",
        "referencesTopic": out,
        "commitLog": f"{bucket}/log",
        "commitLogFormat": "delta",
    }


@pytest.mark.parametrize("combination", sorted(PYTHONS))
def test_each_combination_writes_its_mode_once(
    combination: str, kafka_bootstrap: str, kts_s3: Any, kts_s3_bucket: str, tmp_path: Path
) -> None:
    out = f"wheel_{combination}"
    create_topic(kafka_bootstrap, out, partitions=1)
    s3 = (f"s3://{kts_s3_bucket}", sink_s3_options(kts_s3.endpoint))
    options = options_of(combination, kafka_bootstrap, out, tmp_path, s3)

    done = write(PYTHONS[combination], options)

    assert done.returncode == 0, done.stderr[-3000:]
    seen = len(read_topic(kafka_bootstrap, out))
    assert seen >= 1 if "path" in options else seen == ROWS  # files: one reference a file


def test_the_core_install_names_the_missing_s3_extra(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    done = write(
        PYTHONS["core"],
        {
            "kafka.bootstrap.servers": kafka_bootstrap,
            "sinkId": "wheel_missing",
            "writeId": "w1",
            "topic": "wheel_missing",
            "commitLog": "s3://bucket/log",
        },
    )

    assert done.returncode != 0
    assert (
        "option commitLog=s3://... needs the s3 extra (boto3, botocore not installed): "
        "pip install 'kafka-txn-sink[s3]'"
    ) in done.stderr
    assert "ModuleNotFoundError" not in done.stderr
    print(next(line for line in done.stderr.splitlines() if "needs the s3 extra" in line))
