"""S3Storage and JsonCommitLog against a real S3-compatible HTTP server (moto's server mode)."""

from __future__ import annotations

import os
import pickle
import time
import traceback
from collections.abc import Iterator
from typing import Any

import pytest
from botocore.awsrequest import AWSResponse, HTTPHeaders

from kafka_txn_sink.commit_log import JsonCommitLog, open_commit_log
from kafka_txn_sink.commit_log.json_log import decision_name
from kafka_txn_sink.errors import CommitLogConflictError, CommitLogError
from kafka_txn_sink.protocol.messages import Completion
from kafka_txn_sink.storage import S3Settings, open_storage
from kafka_txn_sink.storage.s3 import S3Storage
from kafka_txn_sink.testing.processes import free_port
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
def storage(bucket: str, settings: S3Settings) -> S3Storage:
    return S3Storage(bucket, "sinks/orders/_log", settings)


def _secret_free(exc: BaseException) -> None:
    text = "".join(traceback.format_exception(exc))
    assert SECRET not in text


def test_put_if_absent_get_put_delete(storage: S3Storage) -> None:
    assert storage.get("decisions/1.json") is None
    assert not storage.exists("decisions/1.json")
    assert storage.put_if_absent("decisions/1.json", b"first") is True
    assert storage.put_if_absent("decisions/1.json", b"second") is False
    assert storage.get("decisions/1.json") == b"first"
    assert storage.exists("decisions/1.json")
    storage.put("_hints/last.json", b"1")
    storage.put("_hints/last.json", b"2")
    assert storage.get("_hints/last.json") == b"2"
    storage.delete("decisions/1.json")
    assert storage.get("decisions/1.json") is None


def test_objects_live_under_the_prefix(storage: S3Storage, bucket: str) -> None:
    storage.put_if_absent("decisions/1.json", b"x")
    client = storage._client
    keys = [o["Key"] for o in client.list_objects_v2(Bucket=bucket)["Contents"]]
    assert keys == ["sinks/orders/_log/decisions/1.json"]
    assert storage.uri == f"s3://{bucket}/sinks/orders/_log"


def test_list_pages_sorts_and_starts_after(bucket: str, settings: S3Settings) -> None:
    storage = S3Storage(bucket, "log", settings, list_page_size=2)
    for name in ["d/3.json", "d/1.json", "d/2.json", "d/sub/9.json", "c/1.json", "d0.json"]:
        storage.put_if_absent(name, b"x")
    assert storage.list("d/") == ["d/1.json", "d/2.json", "d/3.json", "d/sub/9.json"]
    assert storage.list("d/", start_after="d/1.json") == ["d/2.json", "d/3.json", "d/sub/9.json"]
    assert storage.list("") == [
        "c/1.json",
        "d/1.json",
        "d/2.json",
        "d/3.json",
        "d/sub/9.json",
        "d0.json",
    ]
    assert storage.list("missing/") == []


def test_probe_passes_on_an_endpoint_with_conditional_writes(storage: S3Storage) -> None:
    storage.probe_conditional_writes()
    assert storage.list("_probe/") == []


def test_probe_fails_when_the_condition_is_ignored(storage: S3Storage) -> None:
    # The header is dropped before sending: the server then behaves like one that ignores it.
    def drop_condition(params: dict[str, Any], **kwargs: Any) -> None:
        params.pop("IfNoneMatch", None)

    storage._client.meta.events.register("provide-client-params.s3.PutObject", drop_condition)
    with pytest.raises(CommitLogError) as info:
        storage.probe_conditional_writes()
    message = str(info.value)
    assert f"S3 endpoint {storage.endpoint} does not honour If-None-Match" in message
    assert "conditional writes are required for exactly-once" in message
    assert storage.list("_probe/") == []
    _secret_free(info.value)


def test_conflict_409_is_retried(storage: S3Storage) -> None:
    """Fault injection: S3 answers 409 to a conditional write while another one is in flight."""
    refusals = {"left": 2}

    def conflict(**kwargs: Any) -> AWSResponse | None:
        if refusals["left"] == 0:
            return None
        refusals["left"] -= 1
        return _response(409, "ConditionalRequestConflict")

    storage._client.meta.events.register("before-send.s3.PutObject", conflict)
    assert storage.put_if_absent("decisions/1.json", b"x") is True
    assert refusals["left"] == 0
    assert storage.get("decisions/1.json") == b"x"


def test_conflict_409_that_persists_is_an_error(storage: S3Storage) -> None:
    storage._client.meta.events.register(
        "before-send.s3.PutObject", lambda **kwargs: _response(409, "ConditionalRequestConflict")
    )
    with pytest.raises(CommitLogError, match="409 ConditionalRequestConflict") as info:
        storage.put_if_absent("decisions/1.json", b"x")
    assert storage.uri in str(info.value)


class _Raw:
    def __init__(self, body: bytes) -> None:
        self.body = body

    def stream(self, **kwargs: Any) -> Iterator[bytes]:
        yield self.body


def _response(status: int, code: str) -> AWSResponse:
    return _answer(status, f"<Error><Code>{code}</Code><Message>injected</Message></Error>")


def _answer(status: int, body: str) -> AWSResponse:
    return AWSResponse("http://injected", status, HTTPHeaders(), _Raw(body.encode()))


def test_missing_bucket_is_a_clear_error(settings: S3Settings) -> None:
    storage = S3Storage("no-such-bucket-here", "log", settings)
    for action in (
        lambda: storage.put_if_absent("decisions/1.json", b"x"),
        lambda: storage.get("decisions/1.json"),
        lambda: storage.exists("decisions/1.json"),
        lambda: storage.list("decisions/"),
        storage.probe_conditional_writes,
    ):
        with pytest.raises(CommitLogError) as info:
            action()
        assert "bucket 'no-such-bucket-here' does not exist" in str(info.value)
        _secret_free(info.value)


def _lagging_listing(**kwargs: Any) -> AWSResponse:
    """A listing that does not show a write yet, as stores whose listing lags answer."""
    return _answer(200, "<ListBucketResult><IsTruncated>false</IsTruncated></ListBucketResult>")


def test_existence_is_seen_right_after_the_write_whatever_the_listing_says(
    storage: S3Storage,
) -> None:
    storage._client.meta.events.register("before-send.s3.ListObjectsV2", _lagging_listing)
    assert storage.put_if_absent("decisions/7.json", b"decided") is True
    assert storage.exists("decisions/7.json")
    assert not storage.exists("decisions/8.json")
    assert not storage.exists("decisions/7")  # a prefix of a key is no key
    storage.put("_hints/empty", b"")
    assert storage.exists("_hints/empty")  # no byte to read, but there


def test_a_bucket_deleted_under_a_storage_is_an_error_naming_it(
    bucket: str, settings: S3Settings
) -> None:
    storage = S3Storage(bucket, "gone/_log", settings)
    assert not storage.exists("decisions/1.json")
    storage._client.delete_bucket(Bucket=bucket)
    with pytest.raises(CommitLogError, match=f"bucket '{bucket}' does not exist") as info:
        storage.exists("decisions/1.json")
    _secret_free(info.value)


def _bare_404(**kwargs: Any) -> AWSResponse:
    return _answer(404, "")


def test_a_404_without_an_error_code_asks_the_bucket(storage: S3Storage) -> None:
    """A proxy or store answering a bare 404: a missing key only once the bucket is there."""
    storage._client.meta.events.register("before-send.s3.GetObject", _bare_404)
    assert not storage.exists("decisions/1.json")
    gone = S3Storage("no-such-bucket-here", "log", storage.settings)
    gone._client.meta.events.register("before-send.s3.GetObject", _bare_404)
    with pytest.raises(CommitLogError, match="bucket 'no-such-bucket-here' does not exist"):
        gone.exists("decisions/1.json")


def test_unreachable_endpoint_is_a_clear_error() -> None:
    endpoint = f"http://127.0.0.1:{free_port()}"
    settings = S3Settings(
        endpoint_url=endpoint,
        region="us-east-1",
        access_key_id="testing",
        secret_access_key=SECRET,
        connect_timeout_s=1,
        read_timeout_s=1,
        max_attempts=1,
    )
    storage = S3Storage("bucket", "log", settings)
    started = time.monotonic()
    with pytest.raises(CommitLogError) as info:
        storage.put_if_absent("decisions/1.json", b"x")
    assert time.monotonic() - started < 10
    assert endpoint in str(info.value) and "s3://bucket/log/decisions/1.json" in str(info.value)
    _secret_free(info.value)


def test_secret_never_shows(storage: S3Storage, settings: S3Settings) -> None:
    assert SECRET not in repr(settings) and SECRET not in str(settings)
    assert SECRET not in repr(storage)
    assert SECRET not in repr(JsonCommitLog(storage))


def test_storage_pickles_for_the_executors(storage: S3Storage) -> None:
    storage.put_if_absent("decisions/1.json", b"x")
    copy = pickle.loads(pickle.dumps(storage))
    assert copy.uri == storage.uri and copy.get("decisions/1.json") == b"x"


def test_open_storage_and_commit_log(bucket: str, settings: S3Settings) -> None:
    uri = f"s3://{bucket}/sinks/orders/_log"
    storage = open_storage(uri, settings)
    assert isinstance(storage, S3Storage) and storage.uri == uri
    log = open_commit_log(uri, settings)
    log.put_decision(make_decision(0))
    assert log.has_decision(0) and log.decision(0) == make_decision(0)


def test_hint_on_s3_lists_from_the_hinted_batch(storage: S3Storage) -> None:
    log = JsonCommitLog(storage)
    for batch_id in range(5):
        log.put_decision(make_decision(batch_id))
    for batch_id in range(3):
        log.put_completion(make_completion(batch_id))
    log.write_hint(2)
    assert log.last_completed_hint() == 2
    assert log.incomplete_batches() == [3, 4]
    assert storage.list("decisions/", start_after=decision_name(2)) == [
        decision_name(3),
        decision_name(4),
    ]


def make_completion(batch_id: int) -> Completion:
    return Completion("orders", batch_id, completed_at_ms=batch_id)


@pytest.mark.parametrize("garbage", [b"", b"{not json"])
def test_corrupt_existing_decision_is_kept(storage: S3Storage, garbage: bytes) -> None:
    storage.put(decision_name(3), garbage)
    with pytest.raises(CommitLogError) as info:
        JsonCommitLog(storage).put_decision(make_decision(3))
    assert not isinstance(info.value, CommitLogConflictError)
    assert storage.get(decision_name(3)) == garbage


def test_processes_racing_identical_decisions_both_succeed(
    bucket: str, settings: S3Settings
) -> None:
    check_identical_race(f"s3://{bucket}/log", settings, rounds=30)


def test_processes_racing_different_decisions_one_wins(bucket: str, settings: S3Settings) -> None:
    check_different_race(f"s3://{bucket}/log", settings, rounds=30)


def test_environment_is_not_needed_for_explicit_settings(
    bucket: str, settings: S3Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_DEFAULT_REGION"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", os.devnull)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", os.devnull)
    assert S3Storage(bucket, "log", settings).put_if_absent("x.json", b"x")
