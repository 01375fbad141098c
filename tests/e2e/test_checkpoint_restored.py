"""An older copy of the checkpoint restored under the same query id (issue 39, the residual of
the 2026-11-27 review): Spark would plan the batches after the copy's newest anew, with other
input ranges, and the tasks would skip every batch the commit log decided, dropping their new
rows silently. The sink refuses such a checkpoint at the batch's start, naming what happened.
"""

from __future__ import annotations

import shutil

import pytest

from tests.e2e.harness import Pipeline, committed_report, finish, produce_ids

pytestmark = [pytest.mark.kafka, pytest.mark.spark]

N = 500  # batch 0 of 400 rows (maxOffsetsPerTrigger), batch 1 of 100


def test_a_checkpoint_older_than_the_commit_log_is_refused(pipeline: Pipeline) -> None:
    ids = produce_ids(pipeline.bootstrap, pipeline.input, N)
    process = pipeline.start("driver.after_completion=block@0")
    pipeline.wait_reached("driver.after_completion", process)
    older = pipeline.workdir / "checkpoint-after-batch-0-began"
    shutil.copytree(pipeline.checkpoint, older)  # offsets/0, before Spark's commits/0
    pipeline.release("driver.after_completion")
    first = finish(process)
    assert first.returncode == 0, first.error
    assert first.result["batches"] == [0, 1]
    more = produce_ids(pipeline.bootstrap, pipeline.input, 300)
    shutil.rmtree(pipeline.checkpoint)
    shutil.copytree(older, pipeline.checkpoint)

    restored = pipeline.run()

    assert restored.returncode != 0, "the restored older checkpoint was accepted"
    assert "is older than the sink's commit log" in restored.error, restored.error
    assert "decided batch 1" in restored.error, restored.error
    # Nothing was skipped silently: batch 0 and 1 as they were, the new rows not yet written.
    report = committed_report(pipeline.bootstrap, pipeline.output, ids + more)
    assert sorted(report.missing) == sorted(more) and not report.duplicated, report.summary()
