"""DeltaCommitLog against a real S3-compatible HTTP server (moto's server mode)."""

from __future__ import annotations

import socket
import time
import traceback

import boto3
import pytest
from deltalake import DeltaTable

from kafka_txn_sink.commit_log import detect_format, open_commit_log
from kafka_txn_sink.commit_log.delta_log import APP_IDS, DeltaCommitLog, storage_options
from kafka_txn_sink.errors import CommitLogError
from kafka_txn_sink.protocol.messages import Completion
from kafka_txn_sink.protocol.run_records import SinkMeta
from kafka_txn_sink.storage import S3Settings
from kafka_txn_sink.storage.s3 import S3Storage
from tests.commit_log_races import check_different_race, check_identical_race, make_decision
from tests.conftest import S3_TEST_SECRET

pytestmark = pytest.mark.s3

SECRET = S3_TEST_SECRET


@pytest.fixture
def settings(s3_settings: S3Settings) -> S3Settings:
    return s3_settings


@pytest.fixture
def bucket(s3_bucket: str) -> str:
    return s3_bucket


@pytest.fixture
def uri(bucket: str) -> str:
    return f"s3://{bucket}/sinks/orders/_log"


@pytest.fixture
def log(uri: str, settings: S3Settings) -> DeltaCommitLog:
    return DeltaCommitLog(uri, settings)


def read_back(uri: str, settings: S3Settings) -> list[tuple[str, int | None, str]]:
    table = DeltaTable(uri, storage_options=storage_options(settings))
    rows = table.to_pyarrow_table(columns=["kind", "batch_id", "record"]).to_pylist()
    return sorted((r["kind"], r["batch_id"], r["record"]) for r in rows)


def test_records_are_rows_of_the_table_on_s3(
    log: DeltaCommitLog, uri: str, settings: S3Settings
) -> None:
    log.create(SinkMeta("orders", created_at_ms=1))
    for batch_id in range(5):
        log.put_decision(make_decision(batch_id))
    for batch_id in range(3):
        log.put_completion(Completion("orders", batch_id, completed_at_ms=batch_id))

    expected: list[tuple[str, int | None, str]] = [
        ("completion", b, Completion("orders", b, b).to_json().decode()) for b in range(3)
    ]
    expected += [("decision", b, make_decision(b).to_json().decode()) for b in range(5)]
    expected += [("sink", None, SinkMeta("orders", 1).to_json().decode())]
    assert read_back(uri, settings) == sorted(expected, key=lambda r: (r[0], r[1] or 0))
    table = DeltaTable(uri, storage_options=storage_options(settings))
    assert table.transaction_version(APP_IDS["decision"]) == 4


def test_objects_live_under_the_prefix(log: DeltaCommitLog, bucket: str) -> None:
    log.put_decision(make_decision(0))
    client = boto3.client("s3", endpoint_url=log._s3.endpoint_url, region_name="us-east-1")
    keys = [o["Key"] for o in client.list_objects_v2(Bucket=bucket)["Contents"]]
    assert keys and all(key.startswith("sinks/orders/_log/") for key in keys)
    assert any(key.startswith("sinks/orders/_log/kind=decision/") for key in keys)
    assert any(key.startswith("sinks/orders/_log/_delta_log/") for key in keys)


def test_open_commit_log_and_detect_format(uri: str, settings: S3Settings) -> None:
    log = open_commit_log(uri, settings, "delta")
    assert isinstance(log, DeltaCommitLog)
    assert detect_format(uri, settings) == "json"
    log.create(SinkMeta("orders", created_at_ms=1))
    assert detect_format(uri, settings) == "delta"
    assert open_commit_log(uri, settings, "delta").sink_meta() == SinkMeta("orders", 1)


def test_compaction_on_s3(uri: str, settings: S3Settings) -> None:
    log = DeltaCommitLog(uri, settings, compact_every=5)
    for batch_id in range(12):
        log.put_decision(make_decision(batch_id))
        log.put_completion(Completion("orders", batch_id, completed_at_ms=batch_id))
    table = DeltaTable(uri, storage_options=storage_options(settings))
    # Batches 0-9 in one file per kind, then one file per record of batches 10 and 11.
    assert len(table.file_uris()) == 2 + 2 * 2
    assert log.decided_batches() == list(range(12)) and log.incomplete_batches() == []


def test_garbage_in_delta_log_is_a_clear_error(uri: str, bucket: str, settings: S3Settings) -> None:
    S3Storage(bucket, "sinks/orders/_log", settings).put(
        "_delta_log/00000000000000000000.json", b"garbage"
    )
    with pytest.raises(CommitLogError) as info:
        DeltaCommitLog(uri, settings).sink_meta()
    assert uri in str(info.value)
    _secret_free(info.value)


def test_a_json_log_at_the_location_is_named(uri: str, bucket: str, settings: S3Settings) -> None:
    open_commit_log(uri, settings, "json").create(SinkMeta("orders", 1))
    with pytest.raises(CommitLogError, match="commitLogFormat=json"):
        DeltaCommitLog(uri, settings).sink_meta()


def test_missing_bucket_is_a_clear_error(settings: S3Settings) -> None:
    log = DeltaCommitLog("s3://no-such-bucket-here/log", settings)
    for action in (log.sink_meta, lambda: log.put_decision(make_decision(0))):
        with pytest.raises(CommitLogError) as info:
            action()
        assert "s3://no-such-bucket-here/log" in str(info.value)
        _secret_free(info.value)


def test_unreachable_endpoint_fails_within_the_deadlines() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        endpoint = f"http://127.0.0.1:{sock.getsockname()[1]}"
    settings = S3Settings(
        endpoint_url=endpoint,
        region="us-east-1",
        access_key_id="testing",
        secret_access_key=SECRET,
        connect_timeout_s=1,
        read_timeout_s=1,
        max_attempts=2,
    )
    started = time.monotonic()
    with pytest.raises(CommitLogError) as info:
        DeltaCommitLog("s3://bucket/log", settings).put_decision(make_decision(0))
    assert time.monotonic() - started < 10
    assert "s3://bucket/log" in str(info.value)
    _secret_free(info.value)


def test_secret_never_shows(log: DeltaCommitLog) -> None:
    assert SECRET not in repr(log)


def _secret_free(exc: BaseException) -> None:
    assert SECRET not in "".join(traceback.format_exception(exc))


def test_processes_racing_identical_decisions_both_succeed(
    bucket: str, settings: S3Settings
) -> None:
    uri = f"s3://{bucket}/log"
    check_identical_race(uri, settings, rounds=15, fmt="delta")
    assert [b for kind, b, _ in read_back(uri, settings) if kind == "decision"] == list(range(15))


def test_processes_racing_different_decisions_one_wins(bucket: str, settings: S3Settings) -> None:
    uri = f"s3://{bucket}/log"
    check_different_race(uri, settings, rounds=15, fmt="delta")
    assert [b for kind, b, _ in read_back(uri, settings) if kind == "decision"] == list(range(15))
