from __future__ import annotations

import os
import uuid
from pathlib import Path

import pytest

from tests.e2e.harness import Pipeline, create_topics


@pytest.fixture
def pipeline(kafka_bootstrap: str, spark_jars: list[Path], tmp_path: Path) -> Pipeline:
    name = uuid.uuid4().hex[:10]
    built = Pipeline(
        bootstrap=kafka_bootstrap,
        jars=",".join(str(j) for j in spark_jars),
        workdir=tmp_path,
        sink_id=f"sink_{name}",
        input=f"in_{name}",
        output=f"out_{name}",
    )
    log_format = os.environ.get("KTS_COMMIT_LOG_FORMAT")
    if log_format:
        built.options["commitLogFormat"] = log_format
    create_topics(kafka_bootstrap, 3, built.input, built.output)
    return built
