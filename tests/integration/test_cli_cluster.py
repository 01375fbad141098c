"""The CLI against a real broker: `status` sees a sink's open transactions, `recover` settles them.

Transactions are opened by tests/integration/prepare_and_exit.py, a separate process that exits
without closing its producer, as a Spark task does.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import boto3
import pytest

from kafka_txn_sink import cli
from kafka_txn_sink.commit_log import JsonCommitLog, open_commit_log
from kafka_txn_sink.kafka.txn_admin import TxnAdmin
from kafka_txn_sink.protocol.messages import Completion, Decision, Participant, Triple
from kafka_txn_sink.protocol.run_records import SinkMeta
from kafka_txn_sink.storage import LocalStorage, S3Settings
from kafka_txn_sink.testing.topics import read_topic
from tests.e2e.harness import create_topics

pytestmark = pytest.mark.kafka

HERE = Path(__file__).parent
ROWS = 5


@dataclass(frozen=True)
class Sink:
    sink_id: str
    topic: str
    log: JsonCommitLog
    log_dir: Path
    bootstrap: str

    def args(self, *command: str) -> list[str]:
        return [
            "--json",
            *command,
            "--log",
            str(self.log_dir),
            "--bootstrap",
            self.bootstrap,
            "--sink-id",
            self.sink_id,
        ]


@pytest.fixture
def sink(kafka_bootstrap: str, tmp_path: Path, unique: Callable[[str], str]) -> Sink:
    sink_id, topic = unique("clisink"), unique("cli_out")
    create_topics(kafka_bootstrap, 3, topic)
    commit_log = JsonCommitLog(LocalStorage(tmp_path / "log"))
    commit_log.create(SinkMeta(sink_id, created_at_ms=int(time.time() * 1000)))
    return Sink(sink_id, topic, commit_log, tmp_path / "log", kafka_bootstrap)


def prepare(sink: Sink, txn_id: str, timeout_ms: int = 60_000) -> Participant:
    """Open a transaction of ROWS rows under `txn_id` in another process, left Ongoing."""
    script = str(HERE / "prepare_and_exit.py")
    done = subprocess.run(
        [sys.executable, script, sink.bootstrap, txn_id, sink.topic, str(ROWS), str(timeout_ms)],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    body = json.loads(done.stdout.strip().splitlines()[-1])
    offsets = {
        topic: {int(p): (r[0], r[1]) for p, r in parts.items()}
        for topic, parts in body["offsets"].items()
    }
    partition = int(txn_id.rsplit("-", 1)[1])
    triple = Triple(txn_id, body["producer_id"], body["producer_epoch"])
    return Participant(partition, 0, triple, ROWS, offsets)


def run(capsys: pytest.CaptureFixture[str], args: list[str]) -> tuple[int, dict[str, Any]]:
    code = cli.main(args)
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err
    return code, json.loads(captured.out) if captured.out.strip() else {}


def status(sink: Sink, capsys: pytest.CaptureFixture[str]) -> dict[str, Any]:
    code, body = run(capsys, sink.args("status"))
    assert code == 0
    return body


def open_ids(body: dict[str, Any]) -> list[str]:
    return [t["transactional_id"] for t in body["open_transactions"]]


def visible(sink: Sink, txn_id: str) -> int:
    prefix = f"{txn_id}:".encode()
    return sum(
        1 for r in read_topic(sink.bootstrap, sink.topic) if (r.value or b"").startswith(prefix)
    )


def abort_quietly(bootstrap: str, *triples: Triple) -> None:
    with TxnAdmin(bootstrap, {}) as txn_admin:
        txn_admin.end_transactions(triples, commit=False, deadline_s=30)


def test_status_shows_the_sinks_open_transaction_only(
    sink: Sink, capsys: pytest.CaptureFixture[str]
) -> None:
    ours = prepare(sink, f"{sink.sink_id}-0")
    # Shares the prefix, belongs to another sink: never shown, never touched.
    other = prepare(sink, f"{sink.sink_id}_b-0")
    try:
        body = status(sink, capsys)
        assert cli.main(sink.args("status")[1:]) == 0
        table = capsys.readouterr().out
    finally:
        abort_quietly(sink.bootstrap, ours.triple, other.triple)

    assert body["last_decided"] is None
    assert body["incomplete"] == []
    (txn,) = body["open_transactions"]
    assert txn["transactional_id"] == f"{sink.sink_id}-0"
    assert (txn["producer_id"], txn["producer_epoch"]) == (
        ours.triple.producer_id,
        ours.triple.producer_epoch,
    )
    assert 0 <= txn["age_s"] < 120
    assert txn["held_by_batch"] is None
    assert f"{sink.sink_id}-0" in table and "undecided" in table
    assert f"{sink.sink_id}_b-0" not in table


def test_status_shows_the_partitions_an_open_transaction_holds_back_until_it_ends(
    sink: Sink, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 41's guard: an open transaction of the sink keeps its partition's last stable
    offset at its first record, so read_committed consumers stop there; status names the
    partition, how far it trails the high watermark, since when and by which id. Once the
    transaction ends, nothing is held back."""
    opened = prepare(sink, f"{sink.sink_id}-0")
    firsts = {(t, p): r[0] for t, parts in opened.offsets.items() for p, r in parts.items()}
    try:
        before = status(sink, capsys)
    finally:
        abort_quietly(sink.bootstrap, opened.triple)
    cli.main(sink.args("status")[1:])
    capsys.readouterr()
    after = status(sink, capsys)

    (txn,) = before["open_transactions"]
    assert txn["partitions"] == [f"{t}-{p}" for t, p in sorted(firsts)]
    assert {(h["topic"], h["partition"]) for h in before["held_back"]} == set(firsts)
    for held in before["held_back"]:
        first = firsts[(held["topic"], held["partition"])]
        assert held["last_stable_offset"] == first
        assert held["behind"] == held["high_watermark"] - first > 0
        assert held["transactional_ids"] == [f"{sink.sink_id}-0"]
        assert 0 <= held["age_s"] < 120
    assert after["open_transactions"] == [] and after["held_back"] == []


def test_recover_dry_run_changes_nothing_and_execute_force_aborts(
    sink: Sink, capsys: pytest.CaptureFixture[str]
) -> None:
    txn_id = f"{sink.sink_id}-0"
    opened = prepare(sink, txn_id)
    try:
        code, plan = run(capsys, sink.args("recover"))
        after_dry_run = status(sink, capsys)
        refused, _ = run(capsys, sink.args("recover", "--execute"))
        after_refusal = status(sink, capsys)
        code_forced, forced = run(capsys, sink.args("recover", "--execute", "--force"))
        after_force = status(sink, capsys)
    finally:
        abort_quietly(sink.bootstrap, opened.triple)

    assert code == 0
    assert plan["mode"] == "dry-run"
    # No run of the sink is recorded and the transaction is within its own timeout: it may be
    # a live query's, so only --force aborts it.
    assert plan["abort"] == []
    assert [t["transactional_id"] for t in plan["live"]] == [txn_id]
    assert plan["roll_forward"] == []
    assert f"transaction {txn_id} is live" in plan["alive_because"]
    assert "timeout left" in plan["alive_because"]
    assert open_ids(after_dry_run) == [txn_id]
    assert refused == 1
    assert open_ids(after_refusal) == [txn_id]
    assert code_forced == 0
    assert forced["result"] == {
        "ok": True,
        "completed": [],
        "aborted": [{"transaction": str(opened.triple), "error": None}],
        "error": None,
    }
    assert open_ids(after_force) == []
    assert visible(sink, txn_id) == 0


def test_recover_commits_the_decided_and_aborts_the_rest(
    sink: Sink, capsys: pytest.CaptureFixture[str]
) -> None:
    decided, undecided = prepare(sink, f"{sink.sink_id}-0"), prepare(sink, f"{sink.sink_id}-1")
    # A driver (run 0) crashed after writing batch 0's decision and before its EndTxns. The
    # undecided transaction's id has no slot (the oldest run's): run 0's decision supersedes it.
    sink.log.put_decision(
        Decision(
            sink_id=sink.sink_id,
            query_id="query-1",
            batch_id=0,
            participants=(decided,),
            tasks=2,
            rows=ROWS,
            decided_at_ms=int(time.time() * 1000) - 60_000,
            run=0,
        )
    )
    timeout = ["--transaction-timeout-ms", "1000"]
    try:
        before = status(sink, capsys)
        code_plan, plan = run(capsys, [*sink.args("recover"), *timeout])
        code, done = run(capsys, [*sink.args("recover", "--execute"), *timeout])
        after = status(sink, capsys)
    finally:
        abort_quietly(sink.bootstrap, undecided.triple)

    held = {t["transactional_id"]: t["held_by_batch"] for t in before["open_transactions"]}
    assert held == {decided.transactional_id: 0, undecided.transactional_id: None}
    assert before["incomplete"] == [0]
    assert code_plan == 0 and plan["alive_because"] is None
    assert [b["batch"] for b in plan["roll_forward"]] == [0]
    assert [t["transactional_id"] for t in plan["abort"]] == [undecided.transactional_id]
    assert "superseded: run 0 decided batch 0" in plan["abort"][0]["why"]
    assert code == 0, done
    assert done["result"]["completed"] == [{"batch": 0, "lost_rows": 0}]
    assert done["result"]["aborted"] == [{"transaction": str(undecided.triple), "error": None}]
    assert after["incomplete"] == [] and after["last_completed"] == 0
    assert after["open_transactions"] == []
    assert sink.log.completion(0) is not None
    assert visible(sink, decided.transactional_id) == ROWS
    assert visible(sink, undecided.transactional_id) == 0


@pytest.mark.parametrize("command", ["status", "recover"])
def test_unreachable_broker_is_one_clear_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], command: str
) -> None:
    JsonCommitLog(LocalStorage(tmp_path / "log")).create(SinkMeta("orders", created_at_ms=1))
    args = [command, "--log", str(tmp_path / "log"), "--bootstrap", "127.0.0.1:1"]
    args += ["--timeout-ms", "2000", "--kafka", "sasl.password=hunter2"]

    started = time.monotonic()
    code = cli.main(args)
    captured = capsys.readouterr()

    assert code == 2
    assert time.monotonic() - started < 30
    assert captured.out == ""
    assert captured.err.count("\n") == 1
    assert captured.err.startswith("kafka-txn-sink: error: cannot reach Kafka at ")
    assert "127.0.0.1:1" in captured.err
    assert "hunter2" not in captured.err


@pytest.mark.s3
def test_log_list_on_s3(s3_endpoint: str, capsys: pytest.CaptureFixture[str]) -> None:
    bucket = f"cli-{uuid.uuid4().hex[:12]}"
    boto3.client("s3", endpoint_url=s3_endpoint, region_name="us-east-1").create_bucket(
        Bucket=bucket
    )
    uri = f"s3://{bucket}/sinks/orders/_log"
    commit_log = open_commit_log(uri, S3Settings(endpoint_url=s3_endpoint, region="us-east-1"))
    commit_log.create(SinkMeta("orders", created_at_ms=1))
    s3 = ["--s3-endpoint", s3_endpoint, "--s3-region", "us-east-1"]

    code, body = run(capsys, ["--json", "log", "list", "--log", uri, *s3])
    missing = cli.main(["log", "list", "--log", f"s3://{bucket}-gone/x", *s3])
    err = capsys.readouterr().err

    assert code == 0
    assert body == {"log": uri, "sink_id": "orders", "decided": 0, "batches": []}
    assert missing == 2
    assert err.count("\n") == 1
    assert "does not exist" in err


def log_files(sink: Sink) -> dict[str, bytes]:
    return {
        str(path.relative_to(sink.log_dir)): path.read_bytes()
        for path in sorted(sink.log_dir.rglob("*"))
        if path.is_file()
    }


def test_recover_on_a_clean_log_changes_nothing(
    sink: Sink, capsys: pytest.CaptureFixture[str]
) -> None:
    # Batch 0 went through as the sink does it: decided, committed, marked complete.
    done = prepare(sink, f"{sink.sink_id}-0")
    decided_at = int(time.time() * 1000) - 60_000
    sink.log.put_decision(
        Decision(sink.sink_id, "query-1", 0, (done,), 1, ROWS, decided_at_ms=decided_at)
    )
    with TxnAdmin(sink.bootstrap, {}) as txn_admin:
        [result] = txn_admin.end_transactions([done.triple], commit=True, deadline_s=30)
    assert result.ok
    sink.log.put_completion(Completion(sink.sink_id, 0, decided_at + 1000))
    before = log_files(sink)
    timeout = ["--transaction-timeout-ms", "1000"]

    code_plan, plan = run(capsys, [*sink.args("recover"), *timeout])
    code, executed = run(capsys, [*sink.args("recover", "--execute"), *timeout])
    table_code = cli.main([*sink.args("recover", "--execute")[1:], *timeout])
    table = capsys.readouterr().out
    after = status(sink, capsys)

    assert code_plan == code == table_code == 0
    assert plan["roll_forward"] == [] and plan["abort"] == []
    assert executed["result"] == {"ok": True, "completed": [], "aborted": [], "error": None}
    assert "nothing to roll forward" in table and "nothing to abort" in table
    assert log_files(sink) == before  # not one record written, not even a hint
    assert after["incomplete"] == [] and after["last_completed"] == 0
    assert after["open_transactions"] == []
    assert visible(sink, done.transactional_id) == ROWS
