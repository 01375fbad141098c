"""The commit margin bounds the path from the prepare check to the last EndTxn (options.py,
margin.py), and the start refuses a transaction timeout that does not exceed it (start.py).

The path is measured on the driver's real code (`Committer`, `Settler`, `JsonCommitLog` and
`S3Storage.put_if_absent`) with every step at its bound, on a virtual clock: each S3 request
takes commitLogTimeoutMs (the client's deadline for it), each EndTxn round commitTimeoutMs (its
deadline), and the decision's conditional PUT meets a concurrent write five times (409) before
it finds its own (412), the worst `put_if_absent` allows.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from typing import Any

import pytest

from kafka_txn_sink import margin
from kafka_txn_sink.commit_log import JsonCommitLog
from kafka_txn_sink.errors import ConfigError
from kafka_txn_sink.kafka.admin_api import EndTxnResult, TxnState
from kafka_txn_sink.options import SinkOptions, parse_options
from kafka_txn_sink.protocol.complete import Settler
from kafka_txn_sink.protocol.decide import Committer
from kafka_txn_sink.protocol.messages import Triple, now_ms
from kafka_txn_sink.protocol.runs import RunRef
from kafka_txn_sink.protocol.start import check_margin, resolve_against_cluster
from kafka_txn_sink.storage import S3Settings, s3
from kafka_txn_sink.storage.s3 import S3RequestError, S3Storage
from tests.unit.test_decide import SINK, FakeCluster, FakeTxnAdmin, prepared

LOG_MS, COMMIT_MS, SKEW_MS = 2_000, 3_000, 1_000
BASE = {"kafka.bootstrap.servers": "127.0.0.1:1", "sinkId": SINK, "commitLog": "s3://log/x"}


@dataclass
class Clock:
    """Virtual milliseconds, moved on by the slow parts; what the path's moments were."""

    ms: float = 0.0
    checked_at: float | None = None
    last_end_txn_at: float | None = None


class SlowS3(S3Storage):
    """S3Storage whose requests reach an in-memory bucket, each taking `request_ms`; the
    decision's conditional PUT meets a concurrent write (409) `conflicts` times, the first of
    which was its own and landed, so the last attempt answers 412."""

    def __init__(self, clock: Clock, request_ms: int, conflicts: int) -> None:
        super().__init__("log", "x", S3Settings(endpoint_url="http://127.0.0.1:9", region="r"))
        self.clock, self.request_ms, self.conflicts = clock, request_ms, conflicts
        self.objects: dict[str, bytes] = {}

    def _call(self, action: str, name: str, call: Callable[..., Any], **arguments: Any) -> Any:
        if getattr(call, "__name__", "") == "read":  # the body of a GET already answered
            return call()
        self.clock.ms += self.request_ms
        key = arguments.get("Key", "")
        if action == "create":
            return self._create(key, arguments["Body"])
        if action == "write":
            self.objects[key] = arguments["Body"]
            return {}
        if action == "read":
            if key not in self.objects:
                raise S3RequestError("no such key", 404, "NoSuchKey")
            body = self.objects[key]
            return {"Body": _Body(body)}
        if action == "list":
            prefix = self._key(name)
            keys = sorted(k for k in self.objects if k.startswith(prefix))
            return keys if "pages" in arguments else {"Contents": [{"Key": k} for k in keys]}
        raise AssertionError(f"unexpected S3 call {action} {name}")

    def _create(self, key: str, body: bytes) -> dict[str, Any]:
        if "decisions/" in key and self.conflicts > 0:
            self.objects.setdefault(key, body)  # our first attempt, in flight, lands
            self.conflicts -= 1
            raise S3RequestError("concurrent conditional write", 409, "ConditionalRequestConflict")
        if key in self.objects:
            raise S3RequestError("precondition failed", 412, "PreconditionFailed")
        self.objects[key] = body
        return {}


@dataclass
class _Body:
    data: bytes

    def read(self) -> bytes:
        return self.data


@dataclass
class SlowTxnAdmin(FakeTxnAdmin):
    """A coordinator whose EndTxn rounds each take their whole deadline."""

    clock: Clock = field(default_factory=Clock)

    def describe(self, txn_ids: Iterable[str]) -> dict[str, TxnState]:
        if self.clock.last_end_txn_at is None:  # not the clean-up's, after the commit
            self.clock.checked_at = self.clock.ms  # the prepare check reads its clock after this
        return super().describe(txn_ids)

    def end_transactions(
        self, triples: Iterable[Triple], commit: bool, deadline_s: float
    ) -> list[EndTxnResult]:
        self.clock.ms += deadline_s * 1000
        if commit:
            self.clock.last_end_txn_at = self.clock.ms
        return super().end_transactions(triples, commit, deadline_s)


def options_of(**extra: str) -> SinkOptions:
    given = {
        **BASE,
        "commitLogTimeoutMs": str(LOG_MS),
        "commitTimeoutMs": str(COMMIT_MS),
        "clockSkewMs": str(SKEW_MS),
        **extra,
    }
    parsed = parse_options(given)
    return parsed if parsed.transaction_timeout_ms else parsed.with_transaction_timeout(3_600_000)


def worst_path_ms(monkeypatch: pytest.MonkeyPatch, options: SinkOptions) -> float:
    """The virtual time from the prepare check to the last EndTxn(commit) of a batch of two
    participants, every step at its bound."""
    clock = Clock()
    monkeypatch.setattr(s3.time, "sleep", lambda s: setattr(clock, "ms", clock.ms + s * 1000))
    monkeypatch.setattr(s3.random, "random", lambda: 1.0)  # the longest backoff
    commit_log = JsonCommitLog(SlowS3(clock, options.commit_log_timeout_ms, conflicts=5))
    txn_admin = SlowTxnAdmin(clock=clock)
    settler = Settler(SINK, commit_log, txn_admin, FakeCluster(), options.client_timeout_s)
    committer = Committer(options, commit_log, txn_admin, settler, RunRef(0, 0))
    driver = _Driver(txn_admin)
    tasks = [prepared(driver, 0, p) for p in range(2)]  # type: ignore[arg-type]
    for task in tasks:
        txn_admin.open(task.prepared_triple, start_ms=now_ms(), timeout_ms=3_600_000)

    committer.commit(tasks, 0)

    assert commit_log.completion(0) is not None
    assert clock.checked_at is not None and clock.last_end_txn_at is not None
    return clock.last_end_txn_at - clock.checked_at


@dataclass
class _Driver:
    txn_admin: FakeTxnAdmin


def test_the_margin_bounds_the_path_from_the_prepare_check_to_the_last_end_txn(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    options = options_of()

    path_ms = worst_path_ms(monkeypatch, options)

    # The driver's clock may be behind the brokers' by clockSkewMs on top of the path.
    assert path_ms + SKEW_MS <= options.margin_ms
    old_margin_ms = LOG_MS + COMMIT_MS + SKEW_MS  # before issue 24: far short of the path
    assert path_ms + SKEW_MS > old_margin_ms


def test_the_margin_counts_the_retries_the_requesting_modules_make() -> None:
    from kafka_txn_sink.commit_log import delta_log

    assert margin.S3_CONFLICT_RETRIES == s3._CONFLICT_RETRIES
    assert round(s3._CONFLICT_BACKOFF_S * 1000) == margin.S3_CONFLICT_BACKOFF_MS
    assert margin.DELTA_COMMIT_ATTEMPTS == delta_log._COMMIT_ATTEMPTS


def test_the_margin_of_each_log_format_adds_up_its_steps() -> None:
    json_log, delta = options_of(), options_of(commitLogFormat="delta")

    # Skew + owner check + 6 PUTs, 1 GET and 2325 ms of backoff + completion check + 2 rounds.
    assert json_log.margin_ms == SKEW_MS + LOG_MS + 7 * LOG_MS + 2325 + LOG_MS + 2 * COMMIT_MS
    assert delta.margin_ms == SKEW_MS + LOG_MS + 5 * LOG_MS + LOG_MS + 2 * COMMIT_MS
    assert "decision write: up to 6 conditional PUTs" in json_log.explain_margin()
    assert "up to 5 Delta rounds" in delta.explain_margin()


@dataclass
class Facts:
    """The brokers' answers the start needs: every topic exists, and their maximum timeout."""

    max_timeout_ms: int = 900_000

    def topic_exists(self, topic: str) -> bool:
        return True

    def cached_max_transaction_timeout_ms(self) -> int:
        return self.max_timeout_ms

    def is_visible(self, topic: str, partition: int, offset: int) -> bool | None:
        raise AssertionError("the start probes nothing")


def test_the_start_refuses_a_timeout_that_does_not_exceed_the_margin_naming_both() -> None:
    given = options_of(transactionTimeoutMs="20000", topic="out")
    margin_ms = given.margin_ms

    with pytest.raises(ConfigError) as caught:
        resolve_against_cluster(given, Facts())

    message = str(caught.value)
    assert "the transaction timeout 20000 ms (option transactionTimeoutMs" in message
    assert f"commit margin of {margin_ms} ms" in message
    for option in ("commitLogTimeoutMs=2000", "commitTimeoutMs=3000", "clockSkewMs=1000"):
        assert option in message
    assert "commitLogFormat=json" in message


def test_the_start_refuses_the_brokers_maximum_when_it_does_not_exceed_the_margin() -> None:
    given = parse_options({**BASE, "topic": "out"})  # defaults: a margin of several minutes

    with pytest.raises(ConfigError, match=r"transaction timeout 60000 ms .* commit margin of"):
        resolve_against_cluster(given, Facts(max_timeout_ms=60_000))


def test_the_start_takes_a_timeout_above_the_margin() -> None:
    given = options_of(topic="out")
    timeout = given.margin_ms + 1

    resolved = resolve_against_cluster(replace(given, transaction_timeout_ms=timeout), Facts())

    assert resolved.transaction_timeout_ms == timeout
    check_margin(resolve_against_cluster(parse_options({**BASE, "topic": "out"}), Facts()))
