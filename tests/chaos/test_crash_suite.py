"""The crash suite in CI size: four trials through the same code as the 200-trial run.

One streaming query (records and files on S3, commit log on S3) is killed at a driver
failpoint, killed at a task failpoint, loses the Python worker of a task, and meets a frozen
S3 server (left out with an external S3 endpoint); after each fault it restarts with more
input. After a final drain, every input id must be seen exactly once by a read_committed
consumer of the records topic, and exactly once in the files the references name, each file
referenced once, with no transaction left open.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from rich.console import Console

from kafka_txn_sink.failpoints import DRIVER_POINTS, TASK_POINTS
from tests.chaos.bed import S3, Bed, Broker
from tests.chaos.group import group_offsets
from tests.chaos.schedule import short_schedule
from tests.chaos.suite import INITIAL_IDS, run_suite

pytestmark = [pytest.mark.kafka, pytest.mark.spark, pytest.mark.s3]

SEED = 7


def test_short_crash_suite_is_exactly_once(
    kafka_broker: Broker, s3_server: S3, tmp_path: Path
) -> None:
    bed = Bed(kafka_broker, s3_server, mirror_s3=False)
    schedule = short_schedule(SEED, s3=bed.can_pause_s3)

    outcome = run_suite(
        bed, tmp_path / "state", SEED, schedule, range(len(schedule)), Console(width=140)
    )

    struck = [(r["kind"], r["point"]) for r in outcome.ran if r["fired"]]
    assert len(struck) == len(schedule), [r.get("error") for r in outcome.ran]
    assert any(kind == "kill" and point in DRIVER_POINTS for kind, point in struck)
    assert any(kind == "kill" and point in TASK_POINTS for kind, point in struck)
    assert any(kind == "worker" for kind, _ in struck)
    assert all(r["outcome"] == "killed" for r in outcome.ran if r["kind"] == "kill")
    workers = [r for r in outcome.ran if r["kind"] == "worker"]
    assert all(r["task_retried"] for r in workers), "Spark did not retry the killed task"
    assert outcome.drain["ok"], outcome.drain
    report = outcome.report
    assert report.input_ids == INITIAL_IDS + sum(f.new_ids for f in schedule)
    assert report.records.seen == report.files.seen == report.input_ids
    anomalies = {name: items[:5] for name, items in report.anomalies().items() if items}
    assert anomalies == {}, anomalies
    assert outcome.verified["exit"] == 0, outcome.verified
    # The query's consumer group (option consumerGroup) has read every input record, and was at
    # a completed batch's end after every trial (the oracle's group check, empty above).
    group = group_offsets(bed.bootstrap, outcome.group)
    assert sum(o for parts in group.values() for o in parts.values()) == report.input_ids
    assert all(r.get("group") == "ok" for r in outcome.ran), [r.get("group") for r in outcome.ran]
