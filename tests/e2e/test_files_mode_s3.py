"""Files mode on the S3 server through real Spark: every input row in exactly one referenced
object, each object referenced once; and bad input (a missing partition column, a time column of
the wrong type, a bucket that does not exist) fails the query with a clear error and references
nothing."""

from __future__ import annotations

import io
import uuid
from collections import Counter
from typing import Any, cast
from urllib.parse import urlparse

import fastavro
import pytest

from kafka_txn_sink.files_mode import parse_reference
from kafka_txn_sink.verify import compare_ids, read_topic
from tests.e2e.harness import Pipeline, open_transactions, produce_events
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
        ({"path": "s3://bucket-that-does-not-exist/x"}, ["bucket-that-does-not-exist"]),
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
