"""Spark Declarative Pipelines (`pyspark.pipelines`, PySpark 4.1+) writing through the sink: a
pipeline project whose one file, the Lakeflow example's (examples/databricks/lakeflow), declares
`create_sink(name, format="kafka_txn", options)` and an append flow from a Kafka topic into it,
configured by the spec's `configuration`, run by `spark-pipelines run` of the newest Spark line,
as a user runs it. The pipeline owns the flow's checkpoint (under its storage,
`_checkpoints/<sink>/<flow>/<n>`), and a full refresh replaces it.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from kafka_txn_sink import failpoints
from kafka_txn_sink.testing.processes import SPARK_CONNECT_DEFAULT_PORT, bindable, wait_for
from kafka_txn_sink.testing.spark_cluster import spark_home
from tests.e2e.conftest import SparkLine
from tests.e2e.harness import Pipeline, assert_exactly_once, kill_group, produce_ids

# One worker runs them one after another: spark-pipelines starts its Spark Connect server on
# the default port (15002), so two runs at once on one machine collide (the test bed lends
# other servers no port of that number).
pytestmark = [pytest.mark.kafka, pytest.mark.spark, pytest.mark.xdist_group("spark_pipelines")]

N = 500  # batch 0 of 400 rows (maxOffsetsPerTrigger), batch 1 of 100
# The pipeline source users get: examples/databricks/lakeflow, run here by spark-pipelines.
EXAMPLE = (
    Path(__file__).resolve().parents[2]
    / "examples"
    / "databricks"
    / "lakeflow"
    / "transformations"
    / "orders_to_kafka.py"
)


def project(pipeline: Pipeline) -> Path:
    """The pipeline project: its spec, whose configuration holds the example's settings, and
    the example's transformation file."""
    sink = {
        "kafka.bootstrap.servers": pipeline.bootstrap,
        "topic": pipeline.output,
        "sinkId": pipeline.sink_id,
        "commitLog": str(pipeline.commit_log),
        **pipeline.options,
    }
    configuration = {
        "kafka_txn.input.bootstrap": pipeline.bootstrap,
        "kafka_txn.input.topic": pipeline.input,
        "kafka_txn.input.maxOffsetsPerTrigger": str(pipeline.max_offsets),
        **{f"kafka_txn.sink.{key}": value for key, value in sink.items()},
    }
    spec = {
        "name": "orders",
        "storage": f"file://{pipeline.workdir / 'storage'}",
        "configuration": configuration,
        "libraries": [{"glob": {"include": "transformations/**"}}],
    }
    root = pipeline.workdir / "project"
    (root / "transformations").mkdir(parents=True, exist_ok=True)
    (root / "spark-pipeline.yml").write_text(json.dumps(spec, indent=2))  # JSON is YAML
    shutil.copy(EXAMPLE, root / "transformations" / EXAMPLE.name)
    return root


def start(
    pipeline: Pipeline, line: SparkLine, *args: str, failpoint_spec: str = ""
) -> subprocess.Popen[str]:
    """`spark-pipelines run ARGS` in the project, with the newest line's environment."""
    venv = Path(line.python).parent
    env = {
        **os.environ,
        "PATH": f"{venv}:{os.environ['PATH']}",
        "SPARK_HOME": str(spark_home(line.python)),
        "PYSPARK_PYTHON": line.python,
        "SPARK_LOCAL_IP": "127.0.0.1",
        **failpoints.environment(failpoint_spec, pipeline.signals, max_s=300),
    }
    command = [
        str(venv / "spark-pipelines"),
        "run",
        *("--conf", f"spark.jars={line.jars}", "--conf", "spark.ui.enabled=false"),
        *args,
    ]
    # A run that just ended may hold Spark Connect's port a moment longer (seen in CI: the next
    # run failed to bind it).
    wait_for(
        lambda: bindable(SPARK_CONNECT_DEFAULT_PORT) or None,
        60,
        f"port {SPARK_CONNECT_DEFAULT_PORT}, which spark-pipelines serves Spark Connect on",
    )
    # Into a file: a pipe nobody reads while the run waits at a failpoint would fill and stop it.
    output = (pipeline.workdir / "spark-pipelines.log").open("a")
    return subprocess.Popen(
        command,
        cwd=project(pipeline),
        env=env,
        stdout=output,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )


def output_of(pipeline: Pipeline) -> str:
    """Every run's output so far ("" before the first run)."""
    log = pipeline.workdir / "spark-pipelines.log"
    return log.read_text(errors="replace") if log.exists() else ""


def wait_reached(pipeline: Pipeline, name: str, process: subprocess.Popen[str]) -> bool:
    """Until failpoint `name` is reached (True), or False if the run's server never started;
    the run's output when it ends otherwise or never gets there."""
    before = len(output_of(pipeline))
    deadline = time.monotonic() + 300
    while not failpoints.reached(pipeline.signals, name):
        if process.poll() is not None:
            if server_never_started(output_of(pipeline)[before:]):
                return False
            raise AssertionError(f"the run ended before {name}:\n{output_of(pipeline)[-4000:]}")
        if time.monotonic() > deadline:
            kill_group(process)
            raise AssertionError(f"{name} not reached:\n{output_of(pipeline)[-4000:]}")
        time.sleep(0.2)
    return True


def finished(
    pipeline: Pipeline, process: subprocess.Popen[str], timeout_s: float = 420
) -> tuple[int, str]:
    """The run's exit code and its output so far (every run of the test's project)."""
    try:
        process.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        kill_group(process)
        raise
    return process.returncode, output_of(pipeline)


def server_never_started(out: str) -> bool:
    """Whether the run failed before its pipeline began because its Spark Connect server could
    not bind its port (seen in CI though the port was bindable just before the run)."""
    return "Run is" not in out and ("BindException" in out or "Address already in use" in out)


def run(pipeline: Pipeline, line: SparkLine, *args: str) -> tuple[int, str]:
    """A whole `spark-pipelines run ARGS`: its exit code and its own output. A run whose server
    never started is started again, three tries at most; who held the port goes in the log."""
    for _ in range(3):
        before = len(output_of(pipeline))
        code, out = finished(pipeline, start(pipeline, line, *args))
        out = out[before:]
        if not server_never_started(out):
            break
        holders = subprocess.run(
            ["ss", "-tanp", f"sport = :{SPARK_CONNECT_DEFAULT_PORT}"],
            capture_output=True,
            text=True,
            check=False,
        )
        with (pipeline.workdir / "spark-pipelines.log").open("a") as log:
            log.write(f"\n[test] the server never started; port holders:\n{holders.stdout}\n")
    return code, out


def test_a_pipeline_killed_after_a_decision_runs_again_once_and_refuses_a_full_refresh(
    pipeline: Pipeline, spark_newest: SparkLine
) -> None:
    """Killed after batch 0's decision, the pipeline's next run completes it and writes every id
    once. Then a full refresh, which replaces the flow's checkpoint (a new query, from
    `startingOffsets`) and whose replay would write every id again: the sink refuses it, saying
    why and what to do, the run fails, and what was committed stays once. (One test, so the
    refresh needs no run of its own before it: each spark-pipelines run starts a JVM.)"""
    ids = produce_ids(pipeline.bootstrap, pipeline.input, N)
    for _ in range(3):
        process = start(pipeline, spark_newest, failpoint_spec="driver.after_decision=block@1")
        if wait_reached(pipeline, "driver.after_decision", process):
            break
    else:
        raise AssertionError(f"no run's server started:\n{output_of(pipeline)[-4000:]}")
    kill_group(process)

    code, out = run(pipeline, spark_newest)

    assert code == 0, out[-4000:]
    assert "Run is COMPLETED" in out, out[-4000:]
    assert_exactly_once(pipeline, ids)
    checkpoints = pipeline.workdir / "storage" / "_checkpoints" / "orders_out" / "orders"
    assert sorted(p.name for p in checkpoints.iterdir()) == ["0"]

    code, out = run(pipeline, spark_newest, "--full-refresh-all")

    assert code != 0, out[-4000:]
    assert "QueryIdMismatchError" in out, out[-6000:]
    assert "a declarative pipeline's full refresh" in out, out[-6000:]
    assert "start over with a new sinkId and commitLog" in out, out[-6000:]
    assert_exactly_once(pipeline, ids)
