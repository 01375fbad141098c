"""Files mode under the failures of the records-mode tests, on a real broker and real Spark.

A task that fails after uploading its files and preparing its references is retried; the query's
process group is killed at each step of the driver's commit and restarted. Each test checks that
its failpoint fired, that every input row is in exactly one file read_committed references, that
each file is referenced once, and that the files of failed attempts exist but are never
referenced (readers that follow references or the commit log never see them).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.e2e.harness import Pipeline, kill_group, produce_events
from tests.e2e.test_files_mode import assert_files_exactly_once, files_pipeline, stored_files

pytestmark = [pytest.mark.kafka, pytest.mark.spark]

__all__ = ["files_pipeline"]  # a fixture, used by name

# part-<batch>-<partition>-<attempt>-<seq>-<token>.avro
FILE_NAME = re.compile(r"part-(\d{10})-(\d{5})-(\d{3})-\d{5}-[0-9a-f]{8}\.avro")


def batch_partition_attempt(location: str) -> tuple[int, int, int]:
    found = FILE_NAME.fullmatch(Path(location).name)
    assert found is not None, location
    batch, partition, attempt = (int(g) for g in found.groups())
    return batch, partition, attempt


def orphans(pipeline: Pipeline, referenced: set[str]) -> list[str]:
    """Files under `path` that no reference names: the uploads of failed attempts."""
    return [f for f in stored_files(pipeline) if f not in referenced]


@pytest.mark.full  # CI: the crash suite kills tasks of files mode on S3
def test_task_failing_after_its_upload_is_retried_and_its_files_never_referenced(
    files_pipeline: Pipeline,
) -> None:
    files_pipeline.max_offsets = 10_000  # one batch
    ids = produce_events(files_pipeline.bootstrap, files_pipeline.input, 300, users=3)

    # The first task attempt to finish uploads its files, produces their references in its
    # transaction, prepares it, then fails; Spark runs the task again.
    outcome = files_pipeline.run("task.after_flush=raise-once@0")

    assert outcome.returncode == 0, outcome.error
    assert files_pipeline.reached_batches("task.after_flush") == [0]
    named = assert_files_exactly_once(files_pipeline, ids)
    left = orphans(files_pipeline, set(named))
    assert left, "the failed attempt uploaded files before it failed"
    failed = {batch_partition_attempt(f) for f in left}
    assert len(failed) == 1, failed
    [(batch, partition, attempt)] = failed
    assert (batch, attempt) == (0, 0)
    referenced = [batch_partition_attempt(f) for f in named]
    retried = {a for _, p, a in referenced if p == partition}
    assert retried == {1}, "the partition's referenced files are the retry's"


# One query run per kill: killed at a step of batch k's commit, then restarted from the same
# checkpoint, which recovers batch k and goes on until the next kill (or the end).
KILLS = [
    ("driver.before_decision", 1),  # tasks prepared (files uploaded), no decision
    ("driver.after_first_endtxn", 2),  # decided, some reference transactions committed
    ("driver.after_completion", 3),  # complete, Spark's commits/3 not written
]


def assert_state_after_kill(pipeline: Pipeline, point: str, batch: int) -> None:
    """What the commit log and the checkpoint hold when the process died at `point`."""
    commit_log = pipeline.open_log()
    decided = commit_log.decision(batch) is not None
    completed = commit_log.completion(batch) is not None
    expected = {
        "driver.before_decision": (False, False),
        "driver.after_first_endtxn": (True, False),
        "driver.after_completion": (True, True),
    }[point]
    assert (decided, completed) == expected, (point, batch)
    assert not (pipeline.checkpoint / "commits" / str(batch)).exists()


@pytest.mark.full
def test_killed_at_each_driver_failpoint_then_restarted(files_pipeline: Pipeline) -> None:
    files_pipeline.max_offsets = 90  # about 5 batches of 500 rows
    ids = produce_events(files_pipeline.bootstrap, files_pipeline.input, 500, users=3)

    for point, batch in KILLS:
        process = files_pipeline.start(f"{point}=block@{batch}")
        files_pipeline.wait_reached(point, process)
        kill_group(process)
        assert files_pipeline.reached_batches(point) == [batch]
        assert_state_after_kill(files_pipeline, point, batch)
    outcome = files_pipeline.run()

    assert outcome.returncode == 0, outcome.error
    assert files_pipeline.open_log().decided_batches()[-1] >= 4
    named = assert_files_exactly_once(files_pipeline, ids)
    left = orphans(files_pipeline, set(named))
    assert left, "the attempt killed before its decision uploaded files"
    assert {batch_partition_attempt(f)[0] for f in left} == {1}, left
