"""Records mode when the protocol meets trouble, on a real broker, real Spark and a real S3 server.

Each test holds or kills the query's process at a named protocol step (a failpoint), injects
a fault there (a fencing producer, the coordinator's timeout abort, a lost driver), and checks
what a user sees: the error, what read_committed consumers see, what the commit log holds, that
no transaction of the sink is left open, and that a restart ends exactly once. Faults that fail
a query at its start (a deleted checkpoint, an S3 endpoint ignoring conditional writes) are in
test_records_bad_input.py, where one Spark session serves them all.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import boto3
import pytest
from confluent_kafka import Producer

from kafka_txn_sink.kafka.txn_admin import ONGOING, TxnAdmin
from kafka_txn_sink.protocol.messages import Abort, Triple
from kafka_txn_sink.protocol.txn_ids import transactional_id
from kafka_txn_sink.testing.topics import read_topic
from tests.e2e.harness import (
    PAST_TIMEOUT,
    Outcome,
    Pipeline,
    assert_exactly_once,
    committed_report,
    create_topics,
    describe,
    finish,
    kill_group,
    open_transactions,
    produce_ids,
    wait_until_aborted,
)

pytestmark = [pytest.mark.kafka, pytest.mark.spark]

N = 500  # batch 0 of 400 rows (the maxOffsetsPerTrigger of the harness), batch 1 of the rest

PREPARE_AND_EXIT = Path(__file__).resolve().parents[1] / "integration" / "prepare_and_exit.py"


# -- helpers ----------------------------------------------------------------------------------


def decision_file(pipeline: Pipeline, batch_id: int) -> Path:
    return pipeline.commit_log / "decisions" / f"{batch_id:020d}.json"


def completion_file(pipeline: Pipeline, batch_id: int) -> Path:
    return pipeline.commit_log / "completions" / f"{batch_id:020d}.json"


def read_json(path: Path) -> dict[str, Any]:
    body: dict[str, Any] = json.loads(path.read_text())
    return body


def assert_failed_with(outcome: Outcome, *fragments: str) -> None:
    assert outcome.returncode == 3, outcome.error
    for fragment in fragments:
        assert fragment in outcome.error, f"{fragment!r} not in the query's error:\n{outcome.error}"


def assert_only_earlier_batches_visible(pipeline: Pipeline, ids: list[str], batch_id: int) -> None:
    """read_committed sees exactly the rows of the batches before `batch_id`, each once."""
    expected_rows = sum(read_json(decision_file(pipeline, b))["rows"] for b in range(batch_id))
    report = committed_report(pipeline.bootstrap, pipeline.output, ids)
    # Spark's abort() closed the batch's round 0 with an abort record: nothing is decided.
    log = pipeline.open_log()
    assert log.decision(batch_id) is None
    assert isinstance(log.outcome(batch_id, 0), Abort)
    assert report.seen == expected_rows, report.summary()
    assert not report.duplicated and not report.unexpected, report.summary()


# -- a participant fenced before the decision ---------------------------------------------------


@pytest.mark.full  # CI: test_two_drivers late attempt, and the model
def test_fenced_participant_fails_the_batch_before_the_decision(pipeline: Pipeline) -> None:
    ids = produce_ids(pipeline.bootstrap, pipeline.input, N)
    process = pipeline.start("driver.before_prepare_check=block@1")
    pipeline.wait_reached("driver.before_prepare_check", process)

    # Another producer with the id of Spark partition 0 fences (and aborts) its transaction.
    fencer = Producer(
        {
            "bootstrap.servers": pipeline.bootstrap,
            "transactional.id": transactional_id(pipeline.sink_id, 0, slot=0),
        }
    )
    fencer.init_transactions(30)
    pipeline.release("driver.before_prepare_check")
    outcome = finish(process)

    assert pipeline.reached_batches("driver.before_prepare_check") == [1]
    assert_failed_with(
        outcome, "ParticipantNotCommittableError", "Spark partition 0", "no longer open"
    )
    assert_only_earlier_batches_visible(pipeline, ids, batch_id=1)
    assert open_transactions(pipeline.bootstrap, pipeline.sink_id) == []
    # Spark's abort() after the refused commit recorded why (the metrics count it by kind).
    closed = pipeline.open_log().outcome(1, 0)
    assert isinstance(closed, Abort) and closed.cause == "ParticipantNotCommittableError"

    restarted = pipeline.run()

    assert restarted.returncode == 0, restarted.error
    assert_exactly_once(pipeline, ids)


# -- too little time left at the prepare check ------------------------------------------------


def test_transaction_too_old_at_the_prepare_check_publishes_nothing(pipeline: Pipeline) -> None:
    # Margin 29 s of a 30 s transaction (clock skew 15.7 s + 9 commit-log requests of 1 s and
    # 2.3 s of their backoff + 2 EndTxn rounds of 1 s: margin.py): a batch held 2.5 s before the
    # check has less left, while the coordinator is still far from aborting it. Batch 0 is held:
    # the first batch of a query spends seconds starting Python workers between its first
    # record and the check, so with a margin this large no first batch could pass anyway.
    pipeline.options.update(
        {
            "transactionTimeoutMs": "30000",
            "commitTimeoutMs": "1000",
            "commitLogTimeoutMs": "1000",
            "clockSkewMs": "15700",
        }
    )
    ids = produce_ids(pipeline.bootstrap, pipeline.input, N)
    process = pipeline.start("driver.before_prepare_check=block@0")
    pipeline.wait_reached("driver.before_prepare_check", process)
    time.sleep(2.5)
    pipeline.release("driver.before_prepare_check")
    outcome = finish(process)

    assert pipeline.reached_batches("driver.before_prepare_check") == [0]
    assert_failed_with(
        outcome,
        "TransactionTooOldError",
        "batch 0 took too long",
        "maxOffsetsPerTrigger",
        "transaction.max.timeout.ms",
    )
    assert_only_earlier_batches_visible(pipeline, ids, batch_id=0)
    assert open_transactions(pipeline.bootstrap, pipeline.sink_id) == []

    pipeline.options.clear()  # the brokers' maximum timeout and the default margin
    restarted = pipeline.run()

    assert restarted.returncode == 0, restarted.error
    assert_exactly_once(pipeline, ids)


# -- a decided transaction aborted by the coordinator ---------------------------------------------


@pytest.mark.full  # CI: test_repair_shuffled.py's replays, each batch aborted by the timeout
def test_decided_transactions_aborted_by_timeout_are_written_again_by_the_replay(
    pipeline: Pipeline,
) -> None:
    # The settings of test_repair (a first batch, slow: its Python workers start between its
    # first record and the prepare check, passes the margin on a busy machine, and the fate
    # probe has time to read back); the driver then stalls after deciding batch 1 until the
    # coordinator has aborted every participant of it.
    pipeline.options.update(PAST_TIMEOUT)
    ids = produce_ids(pipeline.bootstrap, pipeline.input, N)
    process = pipeline.start("driver.after_decision=block@1")
    pipeline.wait_reached("driver.after_decision", process)
    decided = read_json(decision_file(pipeline, 1))["participants"]
    txn_ids = [p["transactional_id"] for p in decided]
    wait_until_aborted(pipeline.bootstrap, txn_ids, "the coordinator's timeout abort of batch 1")
    pipeline.release("driver.after_decision")
    outcome = finish(process)

    assert pipeline.reached_batches("driver.after_decision") == [1]
    assert_failed_with(
        outcome,
        "TransactionLostError",
        "batch 1 of sink",
        "its replay writes these rows again",
        *(f"Spark partition {p['partition']} ({p['transactional_id']}" for p in decided),
    )
    lost = read_json(completion_file(pipeline, 1))["lost"]
    assert sorted(x["transactional_id"] for x in lost) == sorted(txn_ids)
    lost_ids = written_at(pipeline, lost)
    assert len(lost_ids) == sum(x["rows"] for x in lost) > 0

    more = produce_ids(pipeline.bootstrap, pipeline.input, 200)
    restarted = pipeline.run()  # Spark replays batch 1: its tasks write the lost rows again

    assert restarted.returncode == 0, restarted.error
    assert read_json(completion_file(pipeline, 1))["lost"] == lost
    repair = pipeline.open_log().repair(1, 1)
    assert repair is not None and repair.refused == ()
    assert sorted(t.transactional_id for t in repair.repaired) == sorted(txn_ids)
    assert_exactly_once(pipeline, ids + more)


def written_at(pipeline: Pipeline, lost: list[dict[str, Any]]) -> set[str]:
    """Ids the lost transactions wrote (read_uncommitted still shows aborted records)."""
    ranges = [
        (int(partition), first, last)
        for x in lost
        for partition, (first, last) in x["offsets"][pipeline.output].items()
    ]
    records = read_topic(pipeline.bootstrap, pipeline.output, "read_uncommitted")
    return {
        (r.key or b"").decode()
        for r in records
        if any(r.partition == p and first <= r.offset <= last for p, first, last in ranges)
    }


# -- restart with fewer Spark partitions ------------------------------------------------------


@pytest.mark.full
def test_restart_with_fewer_partitions_aborts_the_ids_left_behind_only(
    pipeline: Pipeline,
) -> None:
    # A transaction of another sink whose id merely shares the prefix, on its own topic (its
    # open transaction would hold read_committed readers of the output back).
    other_topic = f"other_{uuid.uuid4().hex[:10]}"
    create_topics(pipeline.bootstrap, 1, other_topic)
    other = open_transaction_elsewhere(
        pipeline.bootstrap, f"{pipeline.sink_id}_other-0", other_topic
    )
    try:
        pipeline.partitions = 4
        ids = produce_ids(pipeline.bootstrap, pipeline.input, N)
        process = pipeline.start("driver.before_decision=block@1")
        pipeline.wait_reached("driver.before_decision", process)
        kill_group(process)
        left_behind = [transactional_id(pipeline.sink_id, p, slot=0) for p in range(4)]
        before = describe(pipeline.bootstrap, left_behind)
        assert {i: s.state for i, s in before.items()} == dict.fromkeys(left_behind, ONGOING)

        pipeline.partitions = 2
        outcome = pipeline.run()

        assert outcome.returncode == 0, outcome.error
        assert pipeline.reached_batches("driver.before_decision") == [1]
        after = describe(pipeline.bootstrap, left_behind[2:])
        assert all(s.state != ONGOING for s in after.values()), after
        state = describe(pipeline.bootstrap, [other.transactional_id])[other.transactional_id]
        assert (state.state, state.triple) == (ONGOING, other), "another sink's id was touched"
        assert_exactly_once(pipeline, ids)
    finally:
        with TxnAdmin(pipeline.bootstrap, {}) as txn_admin:
            txn_admin.end_transactions([other], commit=False, deadline_s=30)


def open_transaction_elsewhere(bootstrap: str, txn_id: str, topic: str) -> Triple:
    """A transaction with one record, left Ongoing by a process that exited (5 min timeout)."""
    done = subprocess.run(
        [sys.executable, str(PREPARE_AND_EXIT), bootstrap, txn_id, topic, "1", "300000"],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    body = json.loads(done.stdout.strip().splitlines()[-1])
    return Triple(body["transactional_id"], body["producer_id"], body["producer_epoch"])


# -- the commit log on S3 -------------------------------------------------------------------------


def use_s3_log(pipeline: Pipeline, endpoint: str) -> tuple[Any, str, str]:
    """Point the sink's commit log at a fresh bucket; returns (client, bucket, prefix)."""
    bucket = f"sinks-{uuid.uuid4().hex[:12]}"
    client = boto3.client(
        "s3",
        endpoint_url=endpoint,
        region_name="us-east-1",
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
    )
    client.create_bucket(Bucket=bucket)
    prefix = f"sinks/{pipeline.sink_id}/_log"
    pipeline.options.update(
        {
            "commitLog": f"s3://{bucket}/{prefix}",
            "s3.endpoint": endpoint,
            "s3.region": "us-east-1",
            "s3.accessKeyId": "testing",
            "s3.secretAccessKey": "testing",
        }
    )
    return client, bucket, prefix


def s3_keys(client: Any, bucket: str, prefix: str) -> list[str]:
    listed = client.list_objects_v2(Bucket=bucket, Prefix=prefix + "/")
    return sorted(item["Key"][len(prefix) + 1 :] for item in listed.get("Contents", []))


@pytest.mark.full
def test_commit_log_on_s3_survives_a_driver_kill_after_the_decision(
    pipeline: Pipeline, s3_endpoint: str
) -> None:
    client, bucket, prefix = use_s3_log(pipeline, s3_endpoint)
    ids = produce_ids(pipeline.bootstrap, pipeline.input, N)
    process = pipeline.start("driver.after_decision=block@1")
    pipeline.wait_reached("driver.after_decision", process)
    kill_group(process)
    assert "decisions/00000000000000000001.json" in s3_keys(client, bucket, prefix)
    assert "completions/00000000000000000001.json" not in s3_keys(client, bucket, prefix)

    outcome = pipeline.run()

    assert outcome.returncode == 0, outcome.error
    assert pipeline.reached_batches("driver.after_decision") == [1]
    assert_exactly_once(pipeline, ids)
    keys = s3_keys(client, bucket, prefix)
    decided = [k.removeprefix("decisions/") for k in keys if k.startswith("decisions/")]
    completed = [k.removeprefix("completions/") for k in keys if k.startswith("completions/")]
    assert len(decided) >= 2 and decided == completed, keys
    assert not pipeline.commit_log.exists(), "the local log path must not have been used"
