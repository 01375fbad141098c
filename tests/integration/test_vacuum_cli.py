"""`kafka-txn-sink vacuum` on a local directory and on the S3 server: a dry run deletes nothing,
`--execute` deletes only data files of decided batches that their decisions do not list, older
than the retention; files of a batch not decided yet stay however old."""

from __future__ import annotations

import json
import os
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import boto3
import pytest

from kafka_txn_sink import cli
from kafka_txn_sink.cli.common import CANNOT_RUN, REFUSED
from kafka_txn_sink.commit_log import JsonCommitLog
from kafka_txn_sink.files.naming import FileNaming
from kafka_txn_sink.protocol.messages import Decision, FileRef, Participant, Triple
from kafka_txn_sink.protocol.run_records import SinkMeta
from kafka_txn_sink.storage import LocalStorage, S3Settings, open_file_sink
from kafka_txn_sink.storage.files import FileSink, LocalFileSink

HOUR_S = 3600


def data(directory: str, batch: int, partition: int, attempt: int) -> str:
    """A data file's stored name, as a task of `batch` names it."""
    return f"{directory}/{FileNaming(batch, partition, attempt, token='5e7a11ed').name(0)}"


A, B, C = "user=a/date=2026-11-21", "user=b/date=2026-11-21", "user=c/date=2026-11-21"
REFERENCED = [data(A, 0, 0, 0), data(B, 1, 1, 0)]  # batches 0 and 1 are decided with these
ORPHANS = [data(A, 0, 0, 1), data(C, 1, 2, 0)]  # files of failed attempts of batches 0 and 1
YOUNG_ORPHAN = data(A, 1, 0, 1)
IN_FLIGHT = data(B, 2, 0, 0)  # batch 2 is not decided yet: kept however old
SCHEMA = "_schemas/0123abcd.avsc"


def file_ref(location: str) -> FileRef:
    return FileRef(location, "user=a/date=2026-11-21", {"user": "a"}, 1, 10, "0123abcd")


def write_log(path: Path, sink: FileSink) -> Path:
    """A commit log whose batches 0 and 1 reference the REFERENCED files."""
    commit_log = JsonCommitLog(LocalStorage(path))
    commit_log.create(SinkMeta("logs", created_at_ms=1))
    for batch_id, name in enumerate(REFERENCED):
        participant = Participant(
            partition=batch_id,
            attempt=0,
            triple=Triple(f"logs-{batch_id}", 7000 + batch_id, 0),
            rows=1,
            offsets={},
            files=(file_ref(sink.location(name)),),
        )
        commit_log.put_decision(
            Decision("logs", "query-1", batch_id, (participant,), 1, 1, decided_at_ms=1)
        )
    return path


def vacuum(
    capsys: pytest.CaptureFixture[str], log: Path, path: str, *extra: str
) -> tuple[int, dict[str, Any]]:
    code = cli.main(["--json", "vacuum", "--log", str(log), "--path", path, *extra])
    captured = capsys.readouterr()
    return code, json.loads(captured.out) if captured.out else {"stderr": captured.err}


def names(sink: FileSink) -> list[str]:
    return [f.name for f in sink.list()]


# -- local directory ---------------------------------------------------------------------------


@pytest.fixture
def local_sink(tmp_path: Path) -> LocalFileSink:
    sink = LocalFileSink(tmp_path / "files", durable=False)
    old_s = time.time() - 48 * HOUR_S
    for name in [*REFERENCED, *ORPHANS, YOUNG_ORPHAN, IN_FLIGHT, SCHEMA]:
        path = sink.root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"x" * 10)
        if name != YOUNG_ORPHAN:
            os.utime(path, (old_s, old_s))
    return sink


def test_local_dry_run_then_execute(
    local_sink: LocalFileSink, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    log = write_log(tmp_path / "log", local_sink)
    before = names(local_sink)

    code, dry = vacuum(capsys, log, local_sink.uri)

    assert code == 0, dry
    assert names(local_sink) == before
    assert dry["mode"] == "dry-run"
    assert sorted(f["name"] for f in dry["delete"]["files"]) == ORPHANS
    assert dry["delete"]["bytes"] == 20
    assert dry["kept"] == {"referenced": 2, "undecided": 1, "young": 1, "other": 1}

    code, done = vacuum(capsys, log, local_sink.uri, "--execute")

    assert code == 0, done
    assert done["result"] == {"ok": True, "deleted": 2, "aborted": 0, "errors": []}
    assert names(local_sink) == sorted([*REFERENCED, YOUNG_ORPHAN, IN_FLIGHT, SCHEMA])


def test_local_retention_below_the_transaction_timeout_is_refused(
    local_sink: LocalFileSink, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    log = write_log(tmp_path / "log", local_sink)
    before = names(local_sink)

    args = ["--path", local_sink.uri, "--retention-hours", "0.1", "--execute"]
    code = cli.main(["vacuum", "--log", str(log), *args])

    assert code == CANNOT_RUN
    assert "shorter than the transaction timeout 900000 ms" in capsys.readouterr().err
    assert names(local_sink) == before


def test_local_wrong_path_deletes_nothing(
    local_sink: LocalFileSink, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    log = write_log(tmp_path / "log", LocalFileSink(tmp_path / "elsewhere"))
    before = names(local_sink)

    code, body = vacuum(capsys, log, local_sink.uri, "--execute")

    assert code == REFUSED
    assert "is --path the sink's path option?" in body["warning"]
    assert "result" not in body
    assert names(local_sink) == before


# -- S3 ----------------------------------------------------------------------------------------


@pytest.fixture
def client(s3_endpoint: str) -> Any:
    return boto3.client("s3", endpoint_url=s3_endpoint, region_name="us-east-1")


@pytest.mark.s3
def test_s3_dry_run_then_execute_with_a_later_clock(
    s3_endpoint: str, client: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bucket = f"vacuum-{uuid.uuid4().hex[:12]}"
    client.create_bucket(Bucket=bucket)
    path = f"s3://{bucket}/data"
    sink = open_file_sink(path, S3Settings(endpoint_url=s3_endpoint, region="us-east-1"))
    put(client, bucket, [*REFERENCED, *ORPHANS, IN_FLIGHT, SCHEMA])
    stale = client.create_multipart_upload(Bucket=bucket, Key=f"data/{data(C, 1, 3, 0)}")
    client.create_multipart_upload(Bucket=bucket, Key=f"data/{data(C, 2, 3, 0)}")  # in flight
    log = write_log(tmp_path / "log", sink)
    # S3 sets LastModified itself: move the clock forward instead.
    later_ms = int((time.time() + 48 * HOUR_S) * 1000)
    args = ("--s3-endpoint", s3_endpoint, "--s3-region", "us-east-1", "--now-ms", str(later_ms))

    code, dry = vacuum(capsys, log, path, *args)

    assert code == 0, dry
    assert sorted(f["name"] for f in dry["delete"]["files"]) == ORPHANS
    assert [u["upload_id"] for u in dry["abort_uploads"]] == [stale["UploadId"]]
    assert names(sink) == sorted([*REFERENCED, *ORPHANS, IN_FLIGHT, SCHEMA])

    code, done = vacuum(capsys, log, path, *args, "--execute")

    assert code == 0, done
    assert done["result"] == {"ok": True, "deleted": 2, "aborted": 1, "errors": []}
    assert names(sink) == sorted([*REFERENCED, IN_FLIGHT, SCHEMA])
    uploads = client.list_multipart_uploads(Bucket=bucket).get("Uploads", [])
    assert [u["Key"] for u in uploads] == [f"data/{data(C, 2, 3, 0)}"]


def put(client: Any, bucket: str, keys: Sequence[str]) -> None:
    for key in keys:
        client.put_object(Bucket=bucket, Key=f"data/{key}", Body=b"x" * 10)
