"""Fixtures of the end-to-end tests: a `Pipeline` per test, on the first Spark line (this
interpreter's PySpark 4.0) or, where a test asks with `on_both_spark_lines`, also on the newest
(PySpark 4.3 of `.venv-spark-newest`, made by ci/setup_spark_newest.sh; there the sink takes Arrow
batches)."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from kafka_txn_sink import testing
from kafka_txn_sink.testing.kafka_cluster import KafkaCluster
from tests.e2e.harness import ROOT, Pipeline, create_topics

NEWEST = testing.newest_spark_line()
SPARK_LINES = ["4.0", NEWEST]

on_both_spark_lines = pytest.mark.parametrize("pipeline", SPARK_LINES, indirect=True)
"""Run a test that takes `pipeline` (directly or through another fixture) on each Spark line."""

on_the_newest_line_in_full = pytest.mark.parametrize(
    "pipeline", [SPARK_LINES[0], pytest.param(NEWEST, marks=pytest.mark.full)], indirect=True
)
"""Both lines too, but the newest in the full tier only (ci/test_full.sh): for the tests whose
path on the newest line another CI test takes already (test_arrow_writer.py, the kill matrix)."""


@dataclass(frozen=True)
class SparkLine:
    """Another Spark installation: the interpreter of its venv and its `--jars`."""

    python: str
    jars: str


@pytest.fixture(scope="session")
def spark_newest() -> SparkLine:
    """The newest Spark line: `.venv-spark-newest` (or `$KTS_SPARK_NEWEST_PYTHON`), its jars."""
    default = ROOT / ".venv-spark-newest/bin/python"
    python = Path(os.environ.get("KTS_SPARK_NEWEST_PYTHON", str(default)))
    if not python.exists():
        pytest.fail(f"no PySpark {NEWEST} at {python}: run ci/setup_spark_newest.sh (ci/setup.sh "
                    "does)")
    jars = testing.spark_jars_of(str(python), testing.spark_newest_package_env())
    return SparkLine(str(python), ",".join(jars))


@pytest.fixture
def pipeline(
    request: pytest.FixtureRequest, kafka_bootstrap: str, spark_jars: list[Path], tmp_path: Path
) -> Pipeline:
    name = uuid.uuid4().hex[:10]
    built = Pipeline(
        bootstrap=kafka_bootstrap,
        jars=",".join(str(j) for j in spark_jars),
        workdir=tmp_path,
        sink_id=f"sink_{name}",
        input=f"in_{name}",
        output=f"out_{name}",
    )
    if getattr(request, "param", SPARK_LINES[0]) == NEWEST:
        line: SparkLine = request.getfixturevalue("spark_newest")
        built.python, built.jars, built.spark_line = line.python, line.jars, NEWEST
    log_format = os.environ.get("KTS_COMMIT_LOG_FORMAT")
    if log_format:
        built.options["commitLogFormat"] = log_format
    create_topics(kafka_bootstrap, 3, built.input, built.output)
    return built


@pytest.fixture(scope="module")
def kafka_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KafkaCluster]:
    """Three KRaft nodes of our own (never `KTS_KAFKA_BOOTSTRAP`'s broker) for the tests that
    kill one (per module: three idle JVMs would slow the rest of the suite); it fails them,
    never skips them, when it cannot start."""
    cluster = KafkaCluster(tmp_path_factory.mktemp("kafka_cluster"))
    try:
        cluster.start()
    except testing.TestbedError as exc:
        cluster.stop()
        pytest.fail(f"the three-node Kafka cluster did not start: {exc}", pytrace=False)
    yield cluster
    cluster.stop()
