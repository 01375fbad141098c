"""The CLI on a local commit log: `log list`, `log show`, JSON output, clear errors."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from kafka_txn_sink import cli
from kafka_txn_sink.commit_log import JsonCommitLog
from kafka_txn_sink.protocol.messages import (
    Abort,
    Completion,
    Decision,
    LostParticipant,
    Participant,
    Triple,
)
from kafka_txn_sink.protocol.run_records import SinkMeta
from kafka_txn_sink.storage import LocalStorage

ROOT = Path(__file__).resolve().parents[2]
DECIDED_AT_MS = 1_700_000_000_000


def participant(batch_id: int, partition: int) -> Participant:
    return Participant(
        partition=partition,
        attempt=1 if partition == 2 else 0,
        triple=Triple(f"orders-{partition}", 4000 + partition, batch_id),
        rows=10,
        offsets={"events_out": {partition: (batch_id * 10, batch_id * 10 + 9)}},
    )


def decision(batch_id: int) -> Decision:
    return Decision(
        sink_id="orders",
        query_id="query-1",
        batch_id=batch_id,
        participants=tuple(participant(batch_id, p) for p in range(3)),
        tasks=3,
        rows=30,
        decided_at_ms=DECIDED_AT_MS + batch_id * 1000,
    )


def lost(batch_id: int, partition: int) -> LostParticipant:
    p = participant(batch_id, partition)
    return LostParticipant(
        p.triple,
        p.partition,
        p.rows,
        p.offsets,
        reason="InvalidProducerEpochError",
    )


@pytest.fixture
def log_dir(tmp_path: Path) -> Path:
    """Batches 0-2 decided; 0 complete, 1 complete with one participant lost, 2 incomplete."""
    path = tmp_path / "log"
    commit_log = JsonCommitLog(LocalStorage(path))
    commit_log.create(SinkMeta("orders", created_at_ms=1))
    for batch_id in range(3):
        commit_log.put_decision(decision(batch_id))
    commit_log.put_completion(Completion("orders", 0, DECIDED_AT_MS + 500))
    commit_log.put_completion(Completion("orders", 1, DECIDED_AT_MS + 1500, lost=(lost(1, 1),)))
    return path


def run_json(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, object]:
    code = cli.main(["--json", *args])
    return code, json.loads(capsys.readouterr().out)


def test_log_list_json(log_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, body = run_json(capsys, "log", "list", "--log", str(log_dir))

    assert code == 0
    assert isinstance(body, dict)
    assert body["sink_id"] == "orders"
    assert body["decided"] == 3
    assert [
        (b["batch"], b["rows"], b["participants"], b["completed"], b["lost_rows"])
        for b in body["batches"]
    ] == [(0, 30, 3, True, 0), (1, 30, 3, True, 10), (2, 30, 3, False, 0)]


def test_log_list_limit_shows_the_newest(log_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = cli.main(["log", "list", "--log", str(log_dir), "--limit", "1", "--json"])
    body = json.loads(capsys.readouterr().out)

    assert code == 0
    assert [b["batch"] for b in body["batches"]] == [2]
    assert body["decided"] == 3


def test_log_list_table(log_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = cli.main(["log", "list", "--log", log_dir.as_uri()])
    out = capsys.readouterr().out

    assert code == 0
    assert "sink orders: 3 decided batch(es)" in out
    assert "2023-11-14T22:13:20Z" in out  # batch 0's decision time
    lines = [line for line in out.splitlines() if line.startswith("│")]
    assert len(lines) == 3
    assert "no" in lines[2].split("│")[6]  # batch 2 is not completed


def test_log_show_json(log_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, body = run_json(capsys, "log", "show", "1", "--log", str(log_dir))

    assert code == 0
    assert isinstance(body, dict)
    assert Decision.from_json(json.dumps(body["decision"]).encode()) == decision(1)
    completion = Completion.from_json(json.dumps(body["completion"]).encode())
    assert completion.lost == (lost(1, 1),)


def test_log_show_incomplete_batch(log_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = cli.main(["log", "show", "2", "--log", str(log_dir)])
    out = capsys.readouterr().out

    assert code == 0
    assert "batch 2 of sink orders" in out
    assert "orders-2" in out and "4002" in out
    assert "events_out[2] 20-29" in out
    assert "completed at │ no" in " ".join(out.split())


def test_log_show_unknown_batch(log_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = cli.main(["log", "show", "7", "--log", str(log_dir)])
    captured = capsys.readouterr()

    assert code == 1
    assert captured.out == ""
    assert captured.err == f"kafka-txn-sink: error: batch 7 has no decision in {log_dir.as_uri()}\n"


def test_log_show_names_the_aborted_rounds_before_a_decision(
    log_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    commit_log = JsonCommitLog(LocalStorage(log_dir))
    commit_log.put_abort(Abort("orders", 3, 0, (), DECIDED_AT_MS, run=0))
    cli.main(["log", "show", "3", "--log", str(log_dir)])
    refused = capsys.readouterr().err
    commit_log.put_decision(replace(decision(3), round=1, run=1))

    code, body = run_json(capsys, "log", "show", "3", "--log", str(log_dir))
    listed = cli.main(["log", "list", "--log", str(log_dir), "--json"])

    assert "batch 3 has no decision" in refused and "round(s) 0-0 were aborted" in refused
    assert code == 0 and isinstance(body, dict)
    assert body["decision"]["round"] == 1
    assert [(a["round"], a["run"]) for a in body["aborted_rounds"]] == [(0, 0)]
    assert listed == 0
    assert [b["batch"] for b in json.loads(capsys.readouterr().out)["batches"]] == [0, 1, 2, 3]


@pytest.mark.parametrize("command", [["log", "list"], ["log", "show", "0"]])
def test_wrong_log_path_is_one_clear_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], command: list[str]
) -> None:
    code = cli.main([*command, "--log", str(tmp_path / "nothing")])
    captured = capsys.readouterr()

    assert code == 2
    assert captured.out == ""
    assert captured.err.count("\n") == 1
    assert captured.err.startswith("kafka-txn-sink: error: no commit log at ")
    assert "_sink.json" in captured.err


def test_unsupported_location_is_a_clear_error(capsys: pytest.CaptureFixture[str]) -> None:
    code = cli.main(["log", "list", "--log", "hdfs://namenode/log"])
    err = capsys.readouterr().err

    assert code == 2
    assert err.startswith("kafka-txn-sink: error: unsupported commit log location")


def test_usage_error_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["log", "show", "--log", "x"]) == 2
    assert "BATCH" in capsys.readouterr().err


def test_status_refuses_another_sinks_log(
    log_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # The log is checked before any broker is contacted (the address is unreachable on purpose).
    code = cli.main(
        ["status", "--log", str(log_dir), "--bootstrap", "127.0.0.1:1", "--sink-id", "payments"]
    )

    assert code == 2
    assert "belongs to sink orders, not payments" in capsys.readouterr().err


def test_module_help_runs_as_a_subprocess() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "kafka_txn_sink", "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
        check=False,
    )

    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("usage: kafka-txn-sink")
    for command in ("log", "status", "recover"):
        assert command in done.stdout
