"""The records-mode guarantees with commitLogFormat=delta: a representative subset in CI.

The whole e2e suite runs against the Delta log with `KTS_COMMIT_LOG_FORMAT=delta ci/test.sh
tests/e2e` (the `pipeline` fixture reads it).
"""

from __future__ import annotations

import pytest
from deltalake import DeltaTable

from tests.e2e.harness import Pipeline, assert_exactly_once, kill_group, produce_ids

pytestmark = [pytest.mark.kafka, pytest.mark.spark]


def logged_batches(pipeline: Pipeline) -> dict[str, list[int]]:
    rows = DeltaTable(str(pipeline.commit_log)).to_pyarrow_table(columns=["kind", "batch_id"])
    found: dict[str, list[int]] = {}
    for kind, batch in zip(rows["kind"].to_pylist(), rows["batch_id"].to_pylist(), strict=True):
        found.setdefault(kind, []).append(batch)
    return {kind: sorted(batches) for kind, batches in found.items()}


def test_killed_after_the_decision_with_a_delta_log(pipeline: Pipeline) -> None:
    pipeline.options["commitLogFormat"] = "delta"
    ids = produce_ids(pipeline.bootstrap, pipeline.input, 1200)

    process = pipeline.start("driver.after_decision=block@1")
    pipeline.wait_reached("driver.after_decision", process)
    kill_group(process)
    assert logged_batches(pipeline)["decision"] == [0, 1]
    assert logged_batches(pipeline)["completion"] == [0]
    outcome = pipeline.run()

    assert outcome.returncode == 0, outcome.error
    assert_exactly_once(pipeline, ids)
    logged = logged_batches(pipeline)
    assert logged["decision"] == logged["completion"]
    assert len(logged["decision"]) >= 3
