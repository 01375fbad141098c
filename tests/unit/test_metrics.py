"""The sink's metrics from a commit log: counted once per batch, whatever reads come between,
with the decision's statistics, and nothing left standing from a guard reading that ended."""

from __future__ import annotations

import json
import os
import stat
from dataclasses import replace
from pathlib import Path

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from kafka_txn_sink import cli
from kafka_txn_sink.commit_log import JsonCommitLog
from kafka_txn_sink.errors import ConfigError, KafkaUnavailableError
from kafka_txn_sink.kafka.admin_api import ONGOING, TxnState
from kafka_txn_sink.metrics.batches import LogReader
from kafka_txn_sink.metrics.exporter import SinkMetrics
from kafka_txn_sink.metrics.guard import DECIDED, STRAY, GuardReading, OpenTxn
from kafka_txn_sink.protocol import causes
from kafka_txn_sink.protocol.messages import Abort, Completion, Decision, FileRef
from kafka_txn_sink.protocol.run_records import SinkMeta
from kafka_txn_sink.protocol.stats import BatchStats, CompletionStats, TaskCost, batch_stats
from kafka_txn_sink.protocol.stuck import HeldBack
from kafka_txn_sink.storage import LocalStorage
from tests.unit.test_cli import DECIDED_AT_MS, decision, lost


def samples(metrics: SinkMetrics) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of a scrape, by name and labels: what Prometheus would store."""
    text = generate_latest(metrics.registry).decode()
    found = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            found[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return found


def value(metrics: SinkMetrics, name: str, **labels: str) -> float | None:
    return samples(metrics).get((name, tuple(sorted({"sink_id": "orders", **labels}.items()))))


@pytest.fixture
def commit_log(tmp_path: Path) -> JsonCommitLog:
    found = JsonCommitLog(LocalStorage(tmp_path / "log"))
    found.create(SinkMeta("orders", created_at_ms=1))
    return found


def with_stats(batch_id: int) -> Decision:
    stats = BatchStats(
        bytes=1000 + batch_id, slowest_task_ms=800, decide_ms=40, margin_left_ms=52_000
    )
    return replace(decision(batch_id), stats=stats)


def test_stats_survive_the_log_and_do_not_make_a_decision_different(
    commit_log: JsonCommitLog,
) -> None:
    ours = with_stats(0)
    commit_log.put_decision(ours)
    assert commit_log.decision(0) == ours
    # A repeated write of the same decision whose statistics were measured again is ours.
    assert ours.stats is not None
    commit_log.put_decision(replace(ours, stats=replace(ours.stats, decide_ms=99)))
    assert commit_log.decision(0) == ours  # the first one stays
    completion = Completion("orders", 0, DECIDED_AT_MS, stats=CompletionStats(None, 75))
    assert commit_log.put_completion(completion) == completion
    assert commit_log.completion(0) == completion
    assert Decision.from_json(decision(0).to_json()).stats is None  # a record without reads so


def test_batch_stats_from_the_tasks() -> None:
    tasks = [TaskCost(1_000, 1_900, 300), TaskCost(1_100, 1_500, 200), TaskCost(0, 1_950, 7)]
    stats = batch_stats(tasks, decided_at_ms=2_000, margin_left_ms=58_000)
    assert stats == BatchStats(bytes=507, slowest_task_ms=900, decide_ms=50, margin_left_ms=58_000)
    assert batch_stats([], 2_000, None) == BatchStats(0, 0, 0, None)


def test_each_batch_counts_once_across_reads(commit_log: JsonCommitLog) -> None:
    metrics = SinkMetrics("orders", LogReader(commit_log), guard=None)
    metrics.refresh()  # the baseline: the log is empty
    commit_log.put_decision(with_stats(0))
    commit_log.put_decision(with_stats(1))
    completed = CompletionStats(decision_write_ms=30, settle_ms=120)
    commit_log.put_completion(Completion("orders", 0, DECIDED_AT_MS + 500, stats=completed))
    metrics.refresh()
    metrics.refresh()  # nothing new: nothing added
    assert value(metrics, "kafka_txn_sink_batches_total") == 2
    assert value(metrics, "kafka_txn_sink_rows_total") == 60
    assert value(metrics, "kafka_txn_sink_transactions_total") == 6
    assert value(metrics, "kafka_txn_sink_record_bytes_total") == 2001
    assert value(metrics, "kafka_txn_sink_incomplete_batches") == 1
    assert value(metrics, "kafka_txn_sink_completion_seconds_count") == 1
    assert value(metrics, "kafka_txn_sink_completion_seconds_sum") == 0.5
    assert value(metrics, "kafka_txn_sink_margin_left_seconds") == 52
    assert value(metrics, "kafka_txn_sink_decision_write_seconds_sum") == 0.03
    assert value(metrics, "kafka_txn_sink_settle_seconds_sum") == 0.12
    assert value(metrics, "kafka_txn_sink_decide_seconds_sum") == 0.08  # two batches' 40 ms
    assert value(metrics, "kafka_txn_sink_log_up") == 1

    # Batch 1 completes with a participant lost; batch 2 arrives without statistics.
    commit_log.put_completion(Completion("orders", 1, DECIDED_AT_MS + 3000, lost=(lost(1, 1),)))
    commit_log.put_decision(decision(2))
    metrics.refresh()
    assert value(metrics, "kafka_txn_sink_batches_total") == 3
    assert value(metrics, "kafka_txn_sink_rows_total") == 90
    assert value(metrics, "kafka_txn_sink_record_bytes_total") == 2001
    assert value(metrics, "kafka_txn_sink_lost_transactions_total") == 1
    assert value(metrics, "kafka_txn_sink_lost_rows_total") == 10
    assert value(metrics, "kafka_txn_sink_completion_seconds_count") == 2
    assert value(metrics, "kafka_txn_sink_last_decided_batch") == 2
    assert value(metrics, "kafka_txn_sink_incomplete_batches") == 1


def test_files_and_the_rounds_aborted_before_a_decision(commit_log: JsonCommitLog) -> None:
    file = FileRef(
        "s3://b/k.avro", "d=1", {"d": "1"}, records=10, bytes=4096, schema_fingerprint="f"
    )
    batch = decision(0)
    first = replace(batch.participants[0], files=(file, file))
    for round_ in (0, 1):
        commit_log.put_abort(Abort("orders", 0, round_, (), DECIDED_AT_MS))
    commit_log.put_decision(replace(batch, participants=(first, *batch.participants[1:]), round=2))
    metrics = SinkMetrics("orders", LogReader(commit_log, history=1), guard=None)
    metrics.refresh()
    assert value(metrics, "kafka_txn_sink_files_total") == 2
    assert value(metrics, "kafka_txn_sink_file_bytes_total") == 8192
    assert value(metrics, "kafka_txn_sink_aborted_rounds_total") == 2


def test_the_first_read_is_a_baseline_or_starts_history_batches_back(
    commit_log: JsonCommitLog,
) -> None:
    """An exporter (re)started on a log counts from its start: a restart adds nothing to
    what Prometheus counted before; `history` starts its counters that many batches back."""
    for batch_id in range(10):
        commit_log.put_decision(decision(batch_id))
    commit_log.put_abort(Abort("orders", 10, 0, (), DECIDED_AT_MS, cause="ConfigError"))
    fresh = SinkMetrics("orders", LogReader(commit_log), guard=None)
    back = SinkMetrics("orders", LogReader(commit_log, history=3), guard=None)
    fresh.refresh()
    back.refresh()
    assert value(fresh, "kafka_txn_sink_batches_total") == 0
    assert value(fresh, "kafka_txn_sink_last_decided_batch") == 9  # the gauges are current
    assert value(fresh, "kafka_txn_sink_failed_attempts_total", cause="ConfigError") is None
    assert value(back, "kafka_txn_sink_batches_total") == 3
    commit_log.put_decision(replace(decision(10), round=1))
    fresh.refresh()
    back.refresh()
    assert value(fresh, "kafka_txn_sink_batches_total") == 1
    assert value(back, "kafka_txn_sink_batches_total") == 4
    assert value(fresh, "kafka_txn_sink_aborted_rounds_total") == 1


def test_an_unreadable_log_says_so_and_changes_nothing(
    commit_log: JsonCommitLog, tmp_path: Path
) -> None:
    metrics = SinkMetrics("orders", LogReader(commit_log, history=1), guard=None)
    commit_log.put_decision(decision(0))
    metrics.refresh()
    (tmp_path / "log" / "decisions").rename(tmp_path / "elsewhere")
    (tmp_path / "log" / "decisions").write_text("not a folder")
    metrics.refresh()
    assert value(metrics, "kafka_txn_sink_log_up") == 0
    assert value(metrics, "kafka_txn_sink_batches_total") == 1


def _txn(name: str, start_ms: int) -> TxnState:
    return TxnState(name, ONGOING, 7, 0, 60_000, start_ms, (("out", 0),))


def test_the_guard_shows_the_newest_reading_only() -> None:
    readings: list[GuardReading | Exception] = [
        GuardReading(
            at_ms=100_000,
            transactions=(
                OpenTxn(_txn("orders-0-0", 70_000), DECIDED, age_ms=30_000, left_ms=30_000),
                OpenTxn(_txn("orders-0-1", 90_000), STRAY, age_ms=10_000, left_ms=50_000),
            ),
            partitions=(HeldBack("out", 0, 125, 100, 70_000, ("orders-0-0",)),),
        ),
        GuardReading(
            at_ms=130_000, transactions=(), partitions=(HeldBack("out", 0, 125, 125, None, ()),)
        ),
        KafkaUnavailableError("no broker"),
    ]

    def guard(latest: Decision | None) -> GuardReading:
        reading = readings.pop(0)
        if isinstance(reading, Exception):
            raise reading
        return reading

    metrics = SinkMetrics("orders", LogReader(_empty_log()), guard)
    metrics.refresh()
    assert value(metrics, "kafka_txn_sink_open_transactions", state="decided") == 1
    assert value(metrics, "kafka_txn_sink_open_transactions", state="stray") == 1
    assert value(metrics, "kafka_txn_sink_open_transactions", state="live") == 0
    assert value(metrics, "kafka_txn_sink_oldest_open_transaction_age_seconds") == 30
    assert value(metrics, "kafka_txn_sink_oldest_open_transaction_timeout_left_seconds") == 30
    assert value(metrics, "kafka_txn_sink_partition_lso_lag", topic="out", partition="0") == 25
    assert value(metrics, "kafka_txn_sink_partition_held_seconds", topic="out", partition="0") == 30

    metrics.refresh()  # the transactions ended: their series are gone, the partition caught up
    assert value(metrics, "kafka_txn_sink_open_transactions", state="decided") == 0
    assert value(metrics, "kafka_txn_sink_oldest_open_transaction_age_seconds") is None
    assert value(metrics, "kafka_txn_sink_partition_lso_lag", topic="out", partition="0") == 0
    assert (
        value(metrics, "kafka_txn_sink_partition_held_seconds", topic="out", partition="0") is None
    )
    assert value(metrics, "kafka_txn_sink_guard_up") == 1

    metrics.refresh()  # the brokers cannot be asked: no guard series at all, and it says so
    assert value(metrics, "kafka_txn_sink_guard_up") == 0
    assert value(metrics, "kafka_txn_sink_open_transactions", state="decided") is None


def _empty_log() -> JsonCommitLog:
    import tempfile

    found = JsonCommitLog(LocalStorage(Path(tempfile.mkdtemp()) / "log"))
    found.create(SinkMeta("orders", created_at_ms=1))
    return found


def test_failed_attempts_count_once_by_cause_while_failing_and_once_decided(
    commit_log: JsonCommitLog,
) -> None:
    metrics = SinkMetrics("orders", LogReader(commit_log), guard=None)
    commit_log.put_decision(decision(0))
    metrics.refresh()  # the baseline: batch 0
    # Batch 1 fails twice before it is decided: its commit was refused once, its tasks failed
    # once (no cause).
    commit_log.put_abort(Abort("orders", 1, 0, (), DECIDED_AT_MS, cause="TransactionTooOldError"))
    metrics.refresh()
    assert (
        value(metrics, "kafka_txn_sink_failed_attempts_total", cause="TransactionTooOldError") == 1
    )
    commit_log.put_abort(Abort("orders", 1, 1, (), DECIDED_AT_MS))
    metrics.refresh()
    commit_log.put_decision(replace(decision(1), round=2))
    metrics.refresh()
    metrics.refresh()
    assert (
        value(metrics, "kafka_txn_sink_failed_attempts_total", cause="TransactionTooOldError") == 1
    )
    assert value(metrics, "kafka_txn_sink_failed_attempts_total", cause="none") == 1
    assert value(metrics, "kafka_txn_sink_aborted_rounds_total") == 2
    assert value(metrics, "kafka_txn_sink_batches_total") == 1  # batch 1; 0 was the baseline


def test_commit_leaves_its_error_kind_for_abort_and_only_the_kind() -> None:
    secret = ConfigError("sasl.password=hunter2 is wrong")
    causes.leave("orders", 3, 7, secret)
    assert causes.take("orders", 4, 7) is None  # another run's abort of the batch
    assert causes.take("orders", 3, 7) == "ConfigError"
    assert causes.take("orders", 3, 7) is None  # taken once
    causes.leave("orders", 3, 8, KeyError("x"))
    assert causes.take("orders", 3, 8) == causes.OTHER
    abort = Abort("orders", 7, 0, (), DECIDED_AT_MS, cause="ConfigError")
    assert Abort.from_json(abort.to_json()) == abort
    assert b"cause" not in replace(abort, cause=None).to_json()


def test_the_command_prints_one_scrape_and_says_the_brokers_were_not_reached(
    commit_log: JsonCommitLog, capsys: pytest.CaptureFixture[str]
) -> None:
    commit_log.put_decision(with_stats(0))
    where = commit_log.uri.removeprefix("file://")
    args = ["metrics", "--log", where, "--bootstrap", "127.0.0.1:9", "--timeout-ms", "1000"]
    assert cli.main([*args, "--once", "--history", "1"]) == 1  # the brokers were not read
    out = capsys.readouterr().out
    assert 'kafka_txn_sink_rows_total{sink_id="orders"} 30.0' in out
    assert 'kafka_txn_sink_guard_up{sink_id="orders"} 0.0' in out
    assert "kafka_txn_sink_open_transactions" not in out  # no guess while it cannot look

    assert cli.main([*args, "--listen", "9464"]) == 2
    assert "--listen must be HOST:PORT, not '9464'" in capsys.readouterr().err
    assert cli.main([*args, "--history", "-1"]) == 2
    assert "--history must be 0 or more" in capsys.readouterr().err


def test_causes_stay_in_a_folder_of_the_users_own_and_follow_no_link(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("tempfile.gettempdir", lambda: str(tmp_path))
    folder = tmp_path / f"kafka_txn_sink-causes-{os.getuid()}"
    target = tmp_path / "target"
    target.write_text("keep")
    causes.leave("orders", 1, 1, ConfigError("x"))  # makes the folder, 0700
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    (folder / causes._key("orders", 1, 2)).symlink_to(target)
    causes.leave("orders", 1, 2, ConfigError("x"))
    assert target.read_text() == "keep"  # the link was not followed
    assert causes.take("orders", 1, 2) is None
    folder.chmod(0o777)  # a folder of ours others may enter is closed first
    assert causes.take("orders", 1, 1) == "ConfigError"
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700


def test_statistics_a_version_cannot_read_leave_the_record_readable() -> None:
    body = json.loads(with_stats(0).to_json())
    body["stats"] = {"bytes": None, "renamed": 1}
    assert Decision.from_json(json.dumps(body).encode()).stats is None
    body["stats"] = "not an object"
    assert Decision.from_json(json.dumps(body).encode()) == decision(0)
