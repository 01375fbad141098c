"""Files mode: a decided batch whose transactions the coordinator aborted is republished.

The driver is held between the decision and the EndTxns of batch 1 until the coordinator's
timeout has aborted every participant; recovery then publishes those files' references again.
Each input row must end up in exactly one file that read_committed references name, each file
named once, also when the driver is killed in the middle of republishing.
"""

from __future__ import annotations

import subprocess
import uuid
from collections import Counter
from pathlib import Path
from typing import Any, cast

import fastavro
import pytest

from kafka_txn_sink.files.references import parse_reference
from kafka_txn_sink.protocol.messages import Decision
from kafka_txn_sink.testing.topics import compare_ids, read_topic
from tests.e2e.harness import (
    Pipeline,
    create_topics,
    finish,
    kill_group,
    open_transactions,
    produce_events,
    wait_until_aborted,
)

pytestmark = [pytest.mark.kafka, pytest.mark.spark]

EVENTS = 500  # batch 0 of 400 rows (maxOffsetsPerTrigger), batch 1 of the rest


@pytest.fixture
def republishing(pipeline: Pipeline) -> Pipeline:
    references = f"refs_{uuid.uuid4().hex[:8]}"
    create_topics(pipeline.bootstrap, 3, references)
    pipeline.output = ""  # files mode alone: nothing but references is lost with a transaction
    pipeline.select = [
        "CAST(key AS STRING) AS id",
        "get_json_object(CAST(value AS STRING), '$.user') AS user",
        "CAST(value AS STRING) AS payload",
    ]
    pipeline.options.update(
        {
            "path": str(pipeline.workdir / "files"),
            "referencesTopic": references,
            "partitionBy": "user",
            "payloadColumn": "payload",
            # Short enough for the coordinator to abort a held batch within the test; the
            # margin (21.3 s, margin.py) leaves the slow first batch time to pass its check:
            # 23.7 s (at 35 s, a loaded CI machine's first batch took 13.8 s and failed it).
            "transactionTimeoutMs": "45000",
            # Also the fate probe's deadline: at 1 s a probe on a loaded CI machine (stop 30)
            # found the aborted record "not settled yet" and failed the batch; the probe opens
            # two fresh consumers.
            "commitTimeoutMs": "5000",
            "commitLogTimeoutMs": "1000",
            "clockSkewMs": "0",
        }
    )
    return pipeline


def hold_until_aborted(pipeline: Pipeline, also_block: str = "") -> subprocess.Popen[str]:
    """Start with batch 1 held after its decision until the coordinator aborted all of it."""
    spec = "driver.after_decision=block@1" + (f";{also_block}=block@1" if also_block else "")
    process = pipeline.start(spec)
    pipeline.wait_reached("driver.after_decision", process)
    decision = pipeline.open_log().decision(1)
    assert decision is not None and decision.participants
    txn_ids = [p.transactional_id for p in decision.participants]
    wait_until_aborted(pipeline.bootstrap, txn_ids, "the coordinator's timeout abort of batch 1")
    pipeline.release("driver.after_decision")
    return process


def test_aborted_references_are_republished_and_the_query_goes_on(
    republishing: Pipeline,
) -> None:
    ids = produce_events(republishing.bootstrap, republishing.input, EVENTS)

    outcome = finish(hold_until_aborted(republishing))

    assert outcome.returncode == 0, outcome.error
    assert republishing.reached_batches("driver.after_decision") == [1]
    assert_republished_exactly_once(republishing, ids)


@pytest.mark.full
def test_a_driver_killed_while_republishing_duplicates_nothing(republishing: Pipeline) -> None:
    ids = produce_events(republishing.bootstrap, republishing.input, EVENTS)

    process = hold_until_aborted(republishing, also_block="driver.republish_recorded")
    republishing.wait_reached("driver.republish_recorded", process)
    kill_group(process)

    assert republishing.reached_batches("driver.republish_recorded") == [1]
    assert republishing.open_log().completion(1) is None
    restarted = republishing.run()
    assert restarted.returncode == 0, restarted.error
    assert_republished_exactly_once(republishing, ids)


def assert_republished_exactly_once(pipeline: Pipeline, ids: list[str]) -> None:
    commit_log = pipeline.open_log()
    decision, completion = commit_log.decision(1), commit_log.completion(1)
    assert decision is not None and completion is not None
    assert completion.lost == ()
    assert completion.republished == tuple(sorted(p.partition for p in decision.participants))
    round0 = commit_log.republish(1, 0)
    assert round0 is not None and round0.references == sum(
        len(p.files) for p in decision.participants
    )
    named, found = referenced(pipeline)
    assert set(named.values()) == {1}, f"files referenced more than once: {named}"
    decided = {f.location for d in decisions(pipeline) for p in d.participants for f in p.files}
    assert set(named) == decided
    report = compare_ids(ids, found)
    assert report.exact, report.summary()
    assert open_transactions(pipeline.bootstrap, pipeline.sink_id) == []


def decisions(pipeline: Pipeline) -> list[Decision]:
    commit_log = pipeline.open_log()
    found = [commit_log.decision(b) for b in commit_log.decided_batches()]
    return [d for d in found if d is not None]


def referenced(pipeline: Pipeline) -> tuple[Counter[str], list[str]]:
    """How often read_committed references name each file, and the ids in those files."""
    topic = pipeline.options["referencesTopic"]
    refs = [parse_reference(r.value or b"") for r in read_topic(pipeline.bootstrap, topic)]
    found: list[str] = []
    for ref in {r.location: r for r in refs}.values():
        with Path(ref.location).open("rb") as avro:
            found.extend(str(cast(dict[str, Any], row)["id"]) for row in fastavro.reader(avro))
    return Counter(r.location for r in refs), found
