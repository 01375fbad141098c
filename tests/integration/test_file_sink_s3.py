"""S3FileSink and FileSet against a real S3-compatible HTTP server (moto's server mode)."""

from __future__ import annotations

import os
import pickle
import time
import traceback
import uuid
from pathlib import Path
from typing import Any

import fastavro
import pytest
from pyspark.sql.types import LongType, StringType, StructField, StructType

from kafka_txn_sink.errors import ConfigError, StagingError
from kafka_txn_sink.files.naming import FileNaming
from kafka_txn_sink.files.plan import plan_files
from kafka_txn_sink.files.references import store_schema
from kafka_txn_sink.files.writer import FileSet
from kafka_txn_sink.storage import S3Settings, open_file_sink
from kafka_txn_sink.storage.files import LocalFileSink, MiB
from kafka_txn_sink.storage.s3 import S3FileSink
from tests.conftest import S3_TEST_SECRET

pytestmark = pytest.mark.s3

SECRET = S3_TEST_SECRET
SCHEMA = StructType([StructField("id", LongType(), False), StructField("user", StringType())])


@pytest.fixture
def settings(s3_settings: S3Settings) -> S3Settings:
    return s3_settings


@pytest.fixture
def client(s3_client: Any) -> Any:
    return s3_client


@pytest.fixture
def bucket(s3_bucket: str) -> str:
    return s3_bucket


def local_file(path: Path, size: int) -> Path:
    path.write_bytes(os.urandom(size))
    return path


def test_small_upload_list_delete(
    tmp_path: Path, client: Any, bucket: str, settings: S3Settings
) -> None:
    sink = S3FileSink(bucket, "/sinks/logs/", settings)
    data = local_file(tmp_path / "f", 1234)
    location = sink.upload(data, "user=ann/part-1.avro")
    assert location == f"s3://{bucket}/sinks/logs/user=ann/part-1.avro"
    body = client.get_object(Bucket=bucket, Key="sinks/logs/user=ann/part-1.avro")
    assert body["Body"].read() == data.read_bytes()
    assert "-" not in body["ETag"]  # one PUT

    sink.upload(local_file(tmp_path / "g", 10), "user=bob/part-2.avro")
    listed = sink.list()
    assert [(f.name, f.bytes) for f in listed] == [
        ("user=ann/part-1.avro", 1234),
        ("user=bob/part-2.avro", 10),
    ]
    assert abs(listed[0].modified_s - time.time()) < 300
    assert [f.name for f in sink.list("user=bob/")] == ["user=bob/part-2.avro"]
    sink.delete("user=ann/part-1.avro")
    sink.delete("user=ann/part-1.avro")  # missing: no error
    assert [f.name for f in sink.list()] == ["user=bob/part-2.avro"]


def test_multipart_upload_above_threshold(
    tmp_path: Path, client: Any, bucket: str, settings: S3Settings
) -> None:
    sink = S3FileSink(bucket, "big", settings, multipart_threshold=5 * MiB)
    data = local_file(tmp_path / "big", 12 * MiB + 17)
    sink.upload(data, "part-big.avro")
    head = client.head_object(Bucket=bucket, Key="big/part-big.avro")
    assert head["ETag"].strip('"').endswith("-3")  # 5 + 5 + 2 MiB parts
    assert head["ContentLength"] == data.stat().st_size
    body = client.get_object(Bucket=bucket, Key="big/part-big.avro")["Body"].read()
    assert body == data.read_bytes()
    assert client.list_multipart_uploads(Bucket=bucket).get("Uploads", []) == []


def test_put_text_is_put_if_absent(bucket: str, settings: S3Settings, client: Any) -> None:
    sink = S3FileSink(bucket, "p", settings)
    assert sink.put_text("_schemas/a.avsc", '{"type": "string"}') is True
    assert sink.put_text("_schemas/a.avsc", "other") is False
    body = client.get_object(Bucket=bucket, Key="p/_schemas/a.avsc")["Body"].read()
    assert body == b'{"type": "string"}'
    schema = plan_files(SCHEMA).avro_schema()
    name = store_schema(sink, schema)
    assert store_schema(sink, schema) == name
    assert [f.name for f in sink.list("_schemas/")] == sorted(["_schemas/a.avsc", name])


def test_file_sets_of_two_attempts_never_collide(
    bucket: str, settings: S3Settings, client: Any
) -> None:
    sink = open_file_sink(f"s3://{bucket}/sinks/t", settings)
    assert isinstance(sink, S3FileSink)
    plan = plan_files(SCHEMA, partition_by=["user"], codec="snappy", max_records_per_file=40)
    rows = [(i, f"u{i % 3}") for i in range(200)]
    written = []
    for attempt in (0, 1):
        with FileSet(plan, sink, FileNaming(5, 1, attempt)) as files:
            for row in rows:
                files.add(row)
            written.append(files.close())
    names = [w.name for batch in written for w in batch]
    assert len(names) == len(set(names)) == 2 * 6
    stored = {f.name: f.bytes for f in sink.list()}
    assert set(stored) == set(names)
    for batch in written:
        ids = []
        for w in batch:
            assert w.ref.location == f"s3://{bucket}/sinks/t/{w.name}"
            assert stored[w.name] == w.ref.bytes
            body = client.get_object(Bucket=bucket, Key=f"sinks/t/{w.name}")["Body"]
            records = list(fastavro.reader(body))
            assert len(records) == w.ref.records
            ids.extend(r["id"] for r in records)
        assert sorted(ids) == list(range(200))
    # Same rows, same seq: the same bytes, under different names.
    assert written[0][0].ref.bytes == written[1][0].ref.bytes


def test_missing_bucket_is_a_clear_error(tmp_path: Path, settings: S3Settings) -> None:
    sink = S3FileSink(f"missing-{uuid.uuid4().hex[:8]}", "x", settings)
    with pytest.raises(StagingError) as info:
        sink.upload(local_file(tmp_path / "f", 10), "a.avro")
    message = str(info.value)
    assert sink.bucket in message and "does not exist" in message
    assert SECRET not in "".join(traceback.format_exception(info.value))
    with pytest.raises(StagingError, match="does not exist"):
        sink.list()


def test_paused_server_fails_in_bounded_time(
    tmp_path: Path, bucket: str, s3_endpoint: str, s3_server: Any
) -> None:
    quick = S3Settings(
        endpoint_url=s3_endpoint,
        region="us-east-1",
        access_key_id="testing",
        secret_access_key=SECRET,
        connect_timeout_s=1,
        read_timeout_s=1,
        max_attempts=2,
    )
    sink = S3FileSink(bucket, "paused", quick)
    data = local_file(tmp_path / "f", 2048)
    s3_server.pause()
    try:
        started = time.monotonic()
        with pytest.raises(StagingError) as info:
            sink.upload(data, "a.avro")
        elapsed = time.monotonic() - started
    finally:
        s3_server.resume()
    message = str(info.value)
    assert f"s3://{bucket}/paused/a.avro" in message and s3_endpoint in message
    assert SECRET not in "".join(traceback.format_exception(info.value))
    assert elapsed < 10, elapsed  # 2 attempts of at most ~2 s each, plus backoff
    sink.upload(data, "a.avro")  # the server is back: the retry succeeds
    assert [f.name for f in sink.list()] == ["a.avro"]


def test_sink_pickles_for_executors(bucket: str, settings: S3Settings, tmp_path: Path) -> None:
    sink = S3FileSink(bucket, "pk", settings, multipart_threshold=8 * MiB)
    copy = pickle.loads(pickle.dumps(sink))
    assert isinstance(copy, S3FileSink)
    assert (copy.uri, copy.multipart_threshold, copy.endpoint) == (
        sink.uri,
        8 * MiB,
        sink.endpoint,
    )
    copy.upload(local_file(tmp_path / "f", 3), "x.avro")
    assert [f.name for f in sink.list()] == ["x.avro"]


def test_open_file_sink_locations(tmp_path: Path) -> None:
    assert isinstance(open_file_sink(str(tmp_path)), LocalFileSink)
    local = open_file_sink(f"file://{tmp_path}")
    assert isinstance(local, LocalFileSink) and local.root == tmp_path
    with pytest.raises(ConfigError, match="unsupported files location"):
        open_file_sink("hdfs://nn/x")
    with pytest.raises(ConfigError, match="invalid S3 files location"):
        open_file_sink("s3:///no-bucket")
    with pytest.raises(StagingError, match="below S3's smallest part"):
        S3FileSink("b", multipart_threshold=MiB)


def test_paused_server_during_multipart_leaves_pending_uploads_to_abort(
    tmp_path: Path, bucket: str, s3_endpoint: str, s3_server: Any
) -> None:
    quick = S3Settings(
        endpoint_url=s3_endpoint,
        region="us-east-1",
        connect_timeout_s=1,
        read_timeout_s=1,
        max_attempts=2,
    )
    sink = S3FileSink(bucket, "mpu", quick, multipart_threshold=5 * MiB)
    data = local_file(tmp_path / "big", 11 * MiB)
    s3_server.pause()
    try:
        started = time.monotonic()
        with pytest.raises(StagingError, match=f"cannot upload s3://{bucket}/mpu/big.avro"):
            sink.upload(data, "big.avro")
        assert time.monotonic() - started < 15
    finally:
        s3_server.resume()
    # Requests that timed out on the client may still be carried out once the server runs.
    time.sleep(0.5)
    for upload in sink.pending_uploads():
        assert upload.name == "big.avro"
        sink.abort_upload(upload)
        sink.abort_upload(upload)  # already gone: no error
    assert sink.pending_uploads() == []
    sink.upload(data, "big.avro")
    assert [(f.name, f.bytes) for f in sink.list()] == [("big.avro", 11 * MiB)]
    assert sink.pending_uploads() == []
