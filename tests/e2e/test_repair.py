"""Repair on a real broker: a driver killed after its decision and restarted after the
transaction timeout; Spark's replay writes again what the coordinators aborted.

Each test kills the query's whole process group at a driver failpoint of batch 1, waits until
the coordinators' timeout has aborted the batch's open transactions, and restarts the query.
The restart records the loss, Spark replays batch 1, and its tasks write the lost rows again
(protocol/repair.py); a read_committed consumer then sees every id once. A replay that does not
produce the same rows is refused, and the loss stays recorded.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest

from kafka_txn_sink import cli
from tests.e2e.harness import (
    PAST_TIMEOUT,
    Pipeline,
    assert_exactly_once,
    committed_report,
    kill_group,
    open_transactions,
    produce_ids,
    wait_until_aborted,
)

pytestmark = [pytest.mark.kafka, pytest.mark.spark]

N = 500  # batch 0 of 400 rows (maxOffsetsPerTrigger), batch 1 of 100


def kill_at_batch_1_and_wait_for_the_timeout(
    pipeline: Pipeline,
    failpoint: str,
    master: str = "local[2,4]",
    then_produce: Callable[[], object] | None = None,
) -> list[str]:
    """Run until `failpoint` of batch 1, SIGKILL the query, wait until the coordinators have
    aborted every transaction of the batch that was still open; the ids produced (then what
    `then_produce` adds to the input)."""
    pipeline.options.update(PAST_TIMEOUT)
    ids = produce_ids(pipeline.bootstrap, pipeline.input, N)
    if then_produce is not None:
        then_produce()
    process = pipeline.start(f"{failpoint}=block@1", master)
    pipeline.wait_reached(failpoint, process)
    kill_group(process)
    decision = pipeline.open_log().decision(1)
    assert decision is not None, "batch 1 was not decided before the kill"
    txn_ids = [p.transactional_id for p in decision.participants]
    wait_until_aborted(pipeline.bootstrap, txn_ids, "the coordinators' timeout abort of batch 1")
    return ids


@pytest.mark.full  # CI: test_repair_shuffled.py's replays, each batch aborted by the timeout
def test_a_batch_aborted_by_the_timeout_after_its_decision_is_repaired_by_the_replay(
    pipeline: Pipeline, capsys: pytest.CaptureFixture[str]
) -> None:
    ids = kill_at_batch_1_and_wait_for_the_timeout(pipeline, "driver.after_decision")

    restarted = pipeline.run()

    assert restarted.returncode == 0, restarted.error
    assert_exactly_once(pipeline, ids)
    log = pipeline.open_log()
    completion, repair = log.completion(1), log.repair(1, 1)
    assert completion is not None and repair is not None
    assert len(completion.lost) == len(repair.repaired) == len(repair.participants) > 0
    assert repair.refused == ()
    assert all(p.digest for p in repair.participants)
    # The tools: verify finds every id once and reports no loss; log show names the repair.
    verified, report = cli_json(capsys, "verify", *verify_args(pipeline))
    assert verified == 0, report
    assert report["log"]["recorded_losses"] == [], report["log"]
    shown, batch = cli_json(capsys, "log", "show", "--log", str(pipeline.commit_log), "1")
    assert shown == 0
    assert [r["repair"]["level"] for r in batch["repairs"]] == [1]
    assert batch["repairs"][0]["completion"]["lost"] == []


def verify_args(pipeline: Pipeline) -> list[str]:
    return [
        "--bootstrap",
        pipeline.bootstrap,
        "--input-topic",
        pipeline.input,
        "--output-topic",
        pipeline.output,
        "--log",
        str(pipeline.commit_log),
        "--checkpoint",
        str(pipeline.checkpoint),
    ]


def cli_json(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, dict[str, Any]]:
    """`kafka-txn-sink --json ARGS` in this process: its exit code and its JSON output."""
    capsys.readouterr()
    code = cli.main(["--json", *args])
    body: dict[str, Any] = json.loads(capsys.readouterr().out)
    return code, body


@pytest.mark.full
def test_a_partly_committed_batch_repairs_only_what_the_brokers_aborted(
    pipeline: Pipeline,
) -> None:
    ids = kill_at_batch_1_and_wait_for_the_timeout(pipeline, "driver.after_first_endtxn")
    decision = pipeline.open_log().decision(1)
    assert decision is not None and len(decision.participants) >= 2

    restarted = pipeline.run()

    assert restarted.returncode == 0, restarted.error
    assert_exactly_once(pipeline, ids)
    log = pipeline.open_log()
    completion, repair = log.completion(1), log.repair(1, 1)
    assert completion is not None and repair is not None
    first = decision.participants[0].triple  # committed by the first EndTxn before the kill
    assert first not in {x.triple for x in completion.lost}
    assert len(repair.participants) == len(decision.participants) - 1
    assert set(repair.repaired) == {p.triple for p in decision.participants[1:]}


@pytest.mark.full
def test_a_replay_with_other_rows_is_refused_and_the_loss_kept(pipeline: Pipeline) -> None:
    # Keys carry the ids; every run appends a new uuid to the values, so the replay's records
    # differ from the lost ones'.
    pipeline.select = ["key", "CONCAT(CAST(value AS STRING), uuid()) AS value"]
    ids = kill_at_batch_1_and_wait_for_the_timeout(pipeline, "driver.after_decision")

    refused = pipeline.run()

    assert refused.returncode == 3, refused.error
    assert "TransactionLostError" in refused.error
    assert "did not write the same records" in refused.error
    continued = pipeline.run()  # the loss stays recorded; the query goes on after it

    assert continued.returncode == 0, continued.error
    log = pipeline.open_log()
    repair = log.repair(1, 1)
    assert repair is not None and repair.participants == ()
    lost_rows = sum(x.rows for x in repair.refused)
    assert lost_rows > 0
    report = committed_report(pipeline.bootstrap, pipeline.output, ids)
    assert len(report.missing) == lost_rows, report.summary()
    assert not report.duplicated and not report.unexpected, report.summary()
    assert open_transactions(pipeline.bootstrap, pipeline.sink_id) == []
    assert log.repair(1, 2) is None
