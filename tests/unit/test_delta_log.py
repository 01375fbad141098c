"""What only the Delta log does, on a local directory: its table, rows, compaction, what it makes
of tables it did not write, processes racing; and choosing a format (the contract:
test_commit_log_contract)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake

from kafka_txn_sink import cli
from kafka_txn_sink.commit_log import JsonCommitLog, detect_format, open_commit_log
from kafka_txn_sink.commit_log import delta_log as delta_module
from kafka_txn_sink.commit_log.delta_log import APP_IDS, TABLE_PROPERTIES, DeltaCommitLog
from kafka_txn_sink.commit_log.delta_rows import SCHEMA, row_of
from kafka_txn_sink.errors import CommitLogConflictError, CommitLogError, ConfigError
from kafka_txn_sink.options import parse_options
from kafka_txn_sink.protocol.messages import Completion, LostParticipant, Triple
from kafka_txn_sink.protocol.run_records import SinkMeta
from kafka_txn_sink.storage import LocalStorage, S3Settings
from tests.commit_log_races import check_different_race, check_identical_race, make_decision

OPTIONS = {"kafka.bootstrap.servers": "127.0.0.1:9092", "sinkId": "orders", "commitLog": "/tmp/l"}
LOST = LostParticipant(Triple("orders-1", 4001, 3), 1, 10, {"events_out": {1: (30, 39)}}, "aborted")


@pytest.fixture
def delta(tmp_path: Path) -> DeltaCommitLog:
    return DeltaCommitLog(str(tmp_path / "log"))


def rows(path: Path) -> list[dict[str, Any]]:
    """The table's rows as delta-rs reads them, sink row first, then by kind and batch."""
    found = DeltaTable(str(path)).to_pyarrow_table().to_pylist()
    order = {"sink": 0, "decision": 1, "completion": 2, "republish_0": 3}
    return sorted(found, key=lambda row: (order[row["kind"]], row["batch_id"] or 0))


# -- choosing the format ------------------------------------------------------------------------


def test_open_commit_log_picks_the_format(tmp_path: Path) -> None:
    assert isinstance(open_commit_log(str(tmp_path / "a")), JsonCommitLog)
    assert isinstance(open_commit_log(str(tmp_path / "a"), None, "json"), JsonCommitLog)
    delta = open_commit_log(str(tmp_path / "b"), S3Settings(), "delta")
    assert isinstance(delta, DeltaCommitLog) and delta.uri == (tmp_path / "b").as_uri()
    assert isinstance(open_commit_log((tmp_path / "b").as_uri(), None, "delta"), DeltaCommitLog)
    with pytest.raises(ConfigError, match="unknown commit log format 'avro'"):
        open_commit_log(str(tmp_path / "c"), None, "avro")  # type: ignore[arg-type]
    with pytest.raises(CommitLogError, match="hdfs://nn/log"):
        open_commit_log("hdfs://nn/log", None, "delta")


def test_detect_format(tmp_path: Path) -> None:
    assert detect_format(str(tmp_path / "nothing")) == "json"
    JsonCommitLog(LocalStorage(tmp_path / "j")).create(SinkMeta("orders", 1))
    assert detect_format(str(tmp_path / "j")) == "json"
    DeltaCommitLog(str(tmp_path / "d")).create(SinkMeta("orders", 1))
    assert detect_format(str(tmp_path / "d")) == "delta"


@pytest.mark.parametrize(
    ("given", "chosen"), [(None, "json"), ("json", "json"), (" DELTA ", "delta")]
)
def test_commit_log_format_option(given: str | None, chosen: str) -> None:
    extra = {} if given is None else {"commitLogFormat": given}
    assert parse_options({**OPTIONS, **extra}).commit_log_format == chosen


def test_unknown_commit_log_format_names_the_option() -> None:
    with pytest.raises(ConfigError) as info:
        parse_options({**OPTIONS, "commitLogFormat": "parquet"})
    assert str(info.value) == "option commitLogFormat must be one of json, delta, got 'parquet'"


def test_cli_reads_a_delta_log(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    log = DeltaCommitLog(str(tmp_path / "log"))
    log.create(SinkMeta("orders", created_at_ms=1))
    for batch_id in range(3):
        log.put_decision(make_decision(batch_id))
    log.put_completion(Completion("orders", 0, completed_at_ms=5, lost=(LOST,)))

    for given in ([], ["--log-format", "delta"]):
        assert cli.main(["--json", "log", "list", "--log", str(tmp_path / "log"), *given]) == 0
        body = json.loads(capsys.readouterr().out)
        assert (body["sink_id"], body["decided"]) == ("orders", 3)
        assert [(b["batch"], b["completed"], b["lost_rows"]) for b in body["batches"]] == [
            (0, True, 10),
            (1, False, 0),
            (2, False, 0),
        ]

    assert cli.main(["log", "show", "1", "--log", str(tmp_path / "log"), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["decision"]["batch_id"] == 1

    assert cli.main(["log", "list", "--log", str(tmp_path / "log"), "--log-format", "json"]) == 2
    assert "no commit log at" in capsys.readouterr().err


# -- the Delta table itself ---------------------------------------------------------------------


def test_table_rows_match_the_batches_written(delta: DeltaCommitLog, tmp_path: Path) -> None:
    delta.create(SinkMeta("orders", created_at_ms=1))
    for batch_id in range(3):
        delta.put_decision(make_decision(batch_id, decided_at_ms=100 + batch_id))
    delta.put_completion(Completion("orders", 0, completed_at_ms=200))
    delta.put_completion(Completion("orders", 1, completed_at_ms=201, lost=(LOST,)))

    found = rows(tmp_path / "log")
    assert [(r["kind"], r["batch_id"]) for r in found] == [
        ("sink", None),
        ("decision", 0),
        ("decision", 1),
        ("decision", 2),
        ("completion", 0),
        ("completion", 1),
    ]
    sink, decisions, completions = found[0], found[1:4], found[4:]
    assert sink["record"] == SinkMeta("orders", created_at_ms=1).to_json().decode()
    for row in decisions:
        decision = make_decision(row["batch_id"], decided_at_ms=100 + row["batch_id"])
        assert row["record"] == decision.to_json().decode()
        assert (row["sink_id"], row["query_id"], row["recorded_at_ms"]) == (
            "orders",
            "query-1",
            decision.decided_at_ms,
        )
        assert (row["tasks"], row["rows"], row["lost"], row["lost_rows"]) == (2, 20, None, None)
        assert row["participants"] == [
            {
                "partition": p.partition,
                "attempt": p.attempt,
                "transactional_id": p.triple.transactional_id,
                "producer_id": p.triple.producer_id,
                "producer_epoch": p.triple.producer_epoch,
                "rows": p.rows,
            }
            for p in decision.participants
        ]
    assert [(r["lost_rows"], r["query_id"]) for r in completions] == [(0, None), (10, None)]
    assert completions[1]["lost"] == [
        {
            "partition": 1,
            "transactional_id": "orders-1",
            "producer_id": 4001,
            "producer_epoch": 3,
            "rows": 10,
            "reason": "aborted",
        }
    ]
    assert json.loads(completions[1]["record"])["lost"][0]["reason"] == "aborted"


def test_table_layout(delta: DeltaCommitLog, tmp_path: Path) -> None:
    delta.create(SinkMeta("orders", created_at_ms=1))
    table = DeltaTable(str(tmp_path / "log"))
    assert pa.schema(table.schema().to_arrow()).names == SCHEMA.names
    assert table.metadata().partition_columns == ["kind"]
    assert table.metadata().configuration == TABLE_PROPERTIES


def test_app_versions_are_the_highest_batch_recorded(delta: DeltaCommitLog, tmp_path: Path) -> None:
    for batch_id in (0, 1, 4):
        delta.put_decision(make_decision(batch_id))
    delta.put_decision(make_decision(2))
    delta.put_completion(Completion("orders", 0, completed_at_ms=1))
    table = DeltaTable(str(tmp_path / "log"))
    assert table.transaction_version(APP_IDS["decision"]) == 4
    assert table.transaction_version(APP_IDS["completion"]) == 0
    assert delta.latest_decision() == make_decision(4)


def test_a_concurrent_writer_of_the_same_batch_wins_and_ours_is_compared(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ours read the table before theirs committed: our commit fails, we read again, compare."""
    ours, theirs = DeltaCommitLog(str(tmp_path / "log")), DeltaCommitLog(str(tmp_path / "log"))
    ours.put_decision(make_decision(0))
    commits = interleave(monkeypatch, lambda: theirs.put_decision(make_decision(1, "query-2")))
    with pytest.raises(CommitLogConflictError, match="query-2"):
        ours.put_decision(make_decision(1, "query-1"))
    assert commits == ["theirs", "ours refused"]
    assert ours.decision(1) == make_decision(1, "query-2")

    commits = interleave(monkeypatch, lambda: theirs.put_decision(make_decision(2, "query-1")))
    ours.put_decision(make_decision(2, "query-1", decided_at_ms=5))
    assert commits == ["theirs", "ours refused"]
    assert [r["batch_id"] for r in rows(tmp_path / "log")] == [0, 1, 2]


def interleave(monkeypatch: pytest.MonkeyPatch, theirs: Any) -> list[str]:
    """Make `theirs` commit between our snapshot and our first commit; record what happened."""
    real = delta_module.write_deltalake
    commits: list[str] = []

    def write(table: Any, data: Any, **kwargs: Any) -> None:
        if not commits:
            monkeypatch.setattr(delta_module, "write_deltalake", real)
            theirs()
            commits.append("theirs")
            try:
                real(table, data, **kwargs)
            except Exception:
                commits.append("ours refused")
                raise
            commits.append("ours")
            return
        real(table, data, **kwargs)

    monkeypatch.setattr(delta_module, "write_deltalake", write)
    return commits


def test_compaction_keeps_the_table_small_and_the_records_whole(tmp_path: Path) -> None:
    # Nothing is kept for older snapshots here, so vacuum and log clean-up show at once.
    properties = {
        **TABLE_PROPERTIES,
        "delta.deletedFileRetentionDuration": "interval 0 seconds",
        "delta.logRetentionDuration": "interval 0 seconds",
    }
    log = DeltaCommitLog(str(tmp_path / "log"), compact_every=10, table_properties=properties)
    log.create(SinkMeta("orders", created_at_ms=1))
    for batch_id in range(25):
        log.put_decision(make_decision(batch_id))
        log.put_completion(Completion("orders", batch_id, completed_at_ms=batch_id))

    table = DeltaTable(str(tmp_path / "log"))
    # Batches 0-19 in one file per kind, 20-24 one file per record, and the sink row.
    assert len(table.file_uris()) == 2 + 2 * 5 + 1
    data_files = [p for p in (tmp_path / "log").rglob("*.parquet") if "_delta_log" not in p.parts]
    assert len(data_files) == len(table.file_uris())
    assert len(list((tmp_path / "log" / "_delta_log").iterdir())) < 20
    assert log.decided_batches() == list(range(25))
    assert log.incomplete_batches() == []
    assert all(log.decision(b) == make_decision(b) for b in (0, 19, 24))
    assert [r["batch_id"] for r in rows(tmp_path / "log") if r["kind"] == "completion"] == list(
        range(25)
    )


def test_a_failed_compaction_does_not_fail_the_batch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    log = DeltaCommitLog(str(tmp_path / "log"), compact_every=1)

    def broken(self: DeltaCommitLog) -> dict[str, Any]:
        raise CommitLogError("disk full")

    monkeypatch.setattr(DeltaCommitLog, "compact", broken)
    log.put_decision(make_decision(0))
    completion = Completion("orders", 0, completed_at_ms=1)
    assert log.put_completion(completion) == completion
    assert "could not compact the commit log" in caplog.text and "disk full" in caplog.text


# -- what is not a commit log table -------------------------------------------------------------


@pytest.fixture
def location(tmp_path: Path) -> Iterator[Path]:
    path = tmp_path / "log"
    path.mkdir()
    yield path


@pytest.mark.parametrize(
    ("name", "content"),
    [("00000000000000000000.json", b"garbage"), ("00000000000000000000.json", b""), ("x", b"1")],
)
def test_garbage_in_delta_log_is_a_clear_error(location: Path, name: str, content: bytes) -> None:
    (location / "_delta_log").mkdir()
    (location / "_delta_log" / name).write_bytes(content)
    log = DeltaCommitLog(str(location))
    for action in (log.sink_meta, lambda: log.put_decision(make_decision(0))):
        with pytest.raises(CommitLogError) as info:
            action()
        assert location.as_uri() in str(info.value)
    assert (location / "_delta_log" / name).read_bytes() == content


def test_a_foreign_delta_table_is_a_clear_error(location: Path) -> None:
    write_deltalake(str(location), pa.table({"id": [1], "name": ["x"]}))
    log = DeltaCommitLog(str(location))
    with pytest.raises(CommitLogError) as info:
        log.sink_meta()
    message = str(info.value)
    assert f"{location.as_uri()} is a Delta table, but not a kafka_txn_sink commit log" in message
    assert "batch_id" in message and "record" in message
    with pytest.raises(CommitLogError, match="not a kafka_txn_sink commit log"):
        log.put_decision(make_decision(0))
    assert DeltaTable(str(location)).version() == 0


def test_our_columns_without_the_partitioning_are_refused(location: Path) -> None:
    DeltaTable.create(str(location), SCHEMA)
    with pytest.raises(CommitLogError, match=r"partitioned by \[\], expected \['kind'\]"):
        DeltaCommitLog(str(location)).sink_meta()


def test_a_json_log_at_the_location_is_named(location: Path) -> None:
    JsonCommitLog(LocalStorage(location)).create(SinkMeta("orders", 1))
    with pytest.raises(CommitLogError, match=r"holds a JSON commit log .* commitLogFormat=json"):
        DeltaCommitLog(str(location)).sink_meta()


def test_a_malformed_record_is_an_error_and_is_kept(delta: DeltaCommitLog, tmp_path: Path) -> None:
    delta.put_decision(make_decision(0))
    bad = pa.Table.from_pylist(
        [{"kind": "decision", "batch_id": 1, "record": '{"kind":"decision"}'}], schema=SCHEMA
    )
    write_deltalake(str(tmp_path / "log"), bad, mode="append")
    with pytest.raises(CommitLogError, match="decision of batch 1") as info:
        delta.decision(1)
    assert not isinstance(info.value, CommitLogConflictError)
    with pytest.raises(CommitLogError):
        delta.put_decision(make_decision(1))


def test_two_different_rows_for_one_batch_are_an_error(
    delta: DeltaCommitLog, tmp_path: Path
) -> None:
    delta.put_decision(make_decision(0))
    other = make_decision(0, query_id="query-2")
    write_deltalake(str(tmp_path / "log"), row_of(other)[2], mode="append")
    with pytest.raises(CommitLogError, match="a second, different decision row for batch 0"):
        delta.decision(0)


# -- processes racing for the same batches ------------------------------------------------------


def test_processes_racing_identical_decisions_both_succeed(tmp_path: Path) -> None:
    check_identical_race(str(tmp_path / "log"), None, rounds=25, fmt="delta")
    assert one_row_per_batch(tmp_path / "log") == list(range(25))


def test_processes_racing_different_decisions_one_wins(tmp_path: Path) -> None:
    check_different_race(str(tmp_path / "log"), None, rounds=25, fmt="delta")
    assert one_row_per_batch(tmp_path / "log") == list(range(25))


def one_row_per_batch(path: Path) -> list[int]:
    batch_ids = [r["batch_id"] for r in rows(path) if r["kind"] == "decision"]
    assert len(batch_ids) == len(set(batch_ids)), batch_ids
    return batch_ids
