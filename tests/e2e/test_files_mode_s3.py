"""Files mode on the S3 server through real Spark: every input row in exactly one referenced
object, each object referenced once; bad input (a missing partition column, a time column of
the wrong type, a bucket that does not exist) fails the query with a clear error and references
nothing; and an S3 server that stops answering in the middle of a batch fails that batch with a
clear error, references nothing, and a restart after it is back writes every row exactly once."""

from __future__ import annotations

import io
import uuid
from collections import Counter
from typing import Any, cast
from urllib.parse import urlparse

import fastavro
import pytest

from kafka_txn_sink.files.references import parse_reference
from kafka_txn_sink.testing.topics import compare_ids, read_topic
from tests.conftest import S3
from tests.e2e.harness import Pipeline, finish, open_transactions, produce_events
from tests.e2e.test_files_mode import files_pipeline, logged_files

pytestmark = [pytest.mark.kafka, pytest.mark.spark, pytest.mark.s3]

__all__ = ["files_pipeline"]  # a fixture, used by name

S3_OPTIONS = {
    "s3.accessKeyId": "testing",
    "s3.secretAccessKey": "testing",
    "s3.region": "us-east-1",
}
FAILED = 3  # examples/pipeline.py's exit code when the query fails


@pytest.fixture
def s3_pipeline(files_pipeline: Pipeline, s3_endpoint: str, s3_client: Any) -> Pipeline:
    bucket = f"files-e2e-{uuid.uuid4().hex[:12]}"
    s3_client.create_bucket(Bucket=bucket)
    files_pipeline.options.update(
        {**S3_OPTIONS, "s3.endpoint": s3_endpoint, "path": f"s3://{bucket}/data"}
    )
    return files_pipeline


def references(pipeline: Pipeline) -> list[Any]:
    topic = pipeline.options["referencesTopic"]
    return [parse_reference(r.value or b"") for r in read_topic(pipeline.bootstrap, topic)]


def read_object(client: Any, location: str) -> list[dict[str, Any]]:
    parsed = urlparse(location)
    body = client.get_object(Bucket=parsed.netloc, Key=parsed.path.lstrip("/"))["Body"].read()
    return [cast(dict[str, Any], r) for r in fastavro.reader(io.BytesIO(body))]


def test_files_on_s3_referenced_exactly_once(s3_pipeline: Pipeline, s3_client: Any) -> None:
    ids = produce_events(s3_pipeline.bootstrap, s3_pipeline.input, 600, users=3)

    outcome = s3_pipeline.run()

    assert outcome.returncode == 0, outcome.error
    refs = references(s3_pipeline)
    named = Counter(ref.location for ref in refs)
    assert set(named.values()) == {1}, "an object is referenced more than once"
    root = s3_pipeline.options["path"]
    seen: list[str] = []
    for ref in refs:
        assert ref.location.startswith(f"{root}/{ref.partition_path}/"), ref.location
        records = read_object(s3_client, ref.location)
        assert len(records) == ref.records
        assert {r["user"] for r in records} == {ref.partition_values["user"]}
        seen.extend(r["id"] for r in records)
    report = compare_ids(ids, seen)
    assert report.exact, report.summary()
    assert logged_files(s3_pipeline) == sorted(named), "the log lists the referenced objects"
    assert open_transactions(s3_pipeline.bootstrap, s3_pipeline.sink_id) == []


@pytest.mark.parametrize(
    ("options", "expected"),
    [
        ({"partitionBy": "nosuchcolumn"}, ["partitionBy", "nosuchcolumn"]),
        ({"timePartitionColumn": "payload"}, ["timePartitionColumn", "payload"]),
        pytest.param(
            {"path": "s3://bucket-that-does-not-exist/x"},
            ["bucket-that-does-not-exist"],
            id="bucket-does-not-exist",
            marks=pytest.mark.full,  # 60 s
        ),
    ],
    ids=["missing-partition-column", "time-column-not-a-timestamp", "bucket-does-not-exist"],
)
def test_bad_input_fails_clearly_and_references_nothing(
    s3_pipeline: Pipeline, options: dict[str, str], expected: list[str]
) -> None:
    produce_events(s3_pipeline.bootstrap, s3_pipeline.input, 60, users=2)
    s3_pipeline.options.update(options)

    outcome = s3_pipeline.run()

    assert outcome.returncode == FAILED, outcome.error
    error = str(outcome.result.get("error", ""))
    assert all(word in error for word in expected), error[:3000]
    assert references(s3_pipeline) == []
    assert open_transactions(s3_pipeline.bootstrap, s3_pipeline.sink_id) == []


# -- the S3 server stops answering in the middle of a batch ----------------------------------


def bucket_objects(client: Any, root: str) -> list[str]:
    """Every object under `root` (an s3:// prefix), as s3:// locations."""
    parsed = urlparse(root)
    bucket, prefix = parsed.netloc, parsed.path.strip("/") + "/"
    pages = client.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=prefix)
    keys = [item["Key"] for page in pages for item in page.get("Contents", [])]
    return sorted(f"s3://{bucket}/{key}" for key in keys)


@pytest.mark.full
def test_s3_paused_mid_batch_fails_it_clearly_and_a_restart_writes_exactly_once(
    s3_pipeline: Pipeline, s3_server: S3, s3_client: Any
) -> None:
    # One file per row, so each task uploads its first file before the failpoint after its
    # first row; S3 timeouts of 1 s per call (commitLogTimeoutMs / 3 attempts / 2).
    s3_pipeline.options.update({"maxRecordsPerFile": "1", "commitLogTimeoutMs": "6000"})
    s3_pipeline.max_offsets = 10_000  # one batch
    ids = produce_events(s3_pipeline.bootstrap, s3_pipeline.input, 40, users=2)
    bucket = urlparse(s3_pipeline.options["path"]).netloc

    # Two attempts per task: Spark's retry fails too while the server is paused.
    process = s3_pipeline.start("task.after_produce=block@0", master="local[2,2]")
    s3_pipeline.wait_reached("task.after_produce", process)
    s3_server.pause()
    try:
        s3_pipeline.release("task.after_produce")
        outcome = finish(process, timeout_s=180)
    finally:
        s3_server.resume()

    assert outcome.returncode == FAILED, outcome.error
    error = str(outcome.result.get("error", ""))
    endpoint = s3_pipeline.options["s3.endpoint"]
    expected = (
        "failed 2 times",  # Spark's words: the retry failed too
        f"cannot upload s3://{bucket}/data/",
        f"S3 endpoint {endpoint} failed",
    )
    for fragment in expected:
        assert fragment in error, f"{fragment!r} not in the query's error:\n{error[:3000]}"
    assert references(s3_pipeline) == [], "nothing of the failed batch is referenced"
    assert s3_pipeline.open_log().decided_batches() == []
    assert open_transactions(s3_pipeline.bootstrap, s3_pipeline.sink_id) == []
    assert bucket_objects(s3_client, s3_pipeline.options["path"]), "uploads began before the pause"

    restarted = s3_pipeline.run()

    assert restarted.returncode == 0, restarted.error
    refs = references(s3_pipeline)
    named = Counter(ref.location for ref in refs)
    assert set(named.values()) == {1}, "an object is referenced more than once"
    seen = [r["id"] for ref in refs for r in read_object(s3_client, ref.location)]
    report = compare_ids(ids, seen)
    assert report.exact, report.summary()
    assert logged_files(s3_pipeline) == sorted(named)
    assert open_transactions(s3_pipeline.bootstrap, s3_pipeline.sink_id) == []
    stored = bucket_objects(s3_client, s3_pipeline.options["path"])
    assert set(named) < set(stored), "the failed attempts' objects stay, unreferenced"
