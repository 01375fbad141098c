"""A late task attempt: one that starts after its batch was decided, in another Spark
application (a zombie of an abandoned stage attempt). It must return `skipped`."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from tests.chaos.query import QuerySpec
from tests.e2e.harness import LATE_ATTEMPT_SCRIPT

LATE_S = 180.0


def late_attempt(spec: QuerySpec, batch_id: int, partition: int) -> str:
    """Run a task attempt of `batch_id` for `partition` now; what it returned (or `failed:
    ...` with the end of its output)."""
    options = {
        **spec.options,
        "kafka.bootstrap.servers": spec.bootstrap,
        "topic": spec.output,
        "sinkId": spec.sink_id,
        "commitLog": spec.commit_log,
        "checkpointLocation": str(spec.checkpoint),  # Spark hands it to the sink (consumerGroup)
    }
    command = [
        sys.executable,
        "-c",
        LATE_ATTEMPT_SCRIPT,
        json.dumps(options),
        str(batch_id),
        str(partition),
    ]
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "SPARK_LOCAL_IP": "127.0.0.1"}
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=LATE_S, env=env)
    except subprocess.TimeoutExpired:
        return f"failed: no answer within {LATE_S:.0f} s"
    lines = [x for x in done.stdout.splitlines() if x.startswith("{")]
    if done.returncode != 0 or not lines:
        return f"failed: exit {done.returncode}: {done.stderr[-400:]}"
    status: str = json.loads(lines[-1])["status"]
    return status
