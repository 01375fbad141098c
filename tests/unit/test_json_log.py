"""JsonCommitLog on a local directory: records written once, conflicts refused, hints optional."""

from __future__ import annotations

import multiprocessing
import queue
import time
from pathlib import Path
from typing import Any

import pytest

from kafka_txn_sink.commit_log import CommitLog, JsonCommitLog, LogFormat, open_commit_log
from kafka_txn_sink.commit_log.json_log import HINT, completion_name, decision_name
from kafka_txn_sink.errors import CommitLogConflictError, CommitLogError
from kafka_txn_sink.protocol.messages import (
    Completion,
    Decision,
    LostParticipant,
    Participant,
    SinkMeta,
)
from kafka_txn_sink.storage import LocalStorage, S3Settings


def make_decision(
    batch_id: int,
    query_id: str = "query-1",
    decided_at_ms: int = 1_000,
    partitions: tuple[int, ...] = (0, 1),
    tasks: int | None = None,
) -> Decision:
    participants = tuple(
        Participant(
            partition=p,
            attempt=0,
            transactional_id=f"orders-{p}",
            producer_id=4000 + p,
            producer_epoch=batch_id,
            rows=10,
            offsets={"events_out": {p: (batch_id * 10, batch_id * 10 + 9)}},
        )
        for p in partitions
    )
    return Decision(
        sink_id="orders",
        query_id=query_id,
        batch_id=batch_id,
        participants=participants,
        tasks=len(partitions) if tasks is None else tasks,
        rows=10 * len(partitions),
        decided_at_ms=decided_at_ms,
    )


class SpyStorage:
    """A LocalStorage that records how it is listed, and can refuse to write."""

    def __init__(self, inner: LocalStorage, fail_puts: bool = False) -> None:
        self.inner = inner
        self.fail_puts = fail_puts
        self.lists: list[tuple[str, str | None]] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def put(self, name: str, data: bytes) -> None:
        if self.fail_puts:
            raise OSError(28, "No space left on device")
        self.inner.put(name, data)

    def list(self, prefix: str, start_after: str | None = None) -> list[str]:
        self.lists.append((prefix, start_after))
        return self.inner.list(prefix, start_after)


@pytest.fixture
def storage(tmp_path: Path) -> LocalStorage:
    return LocalStorage(tmp_path / "log")


@pytest.fixture
def log(storage: LocalStorage) -> JsonCommitLog:
    return JsonCommitLog(storage)


def test_satisfies_the_protocol(log: JsonCommitLog) -> None:
    as_protocol: CommitLog = log
    assert as_protocol.uri == log.storage.uri


def test_create_claims_the_log_once(log: JsonCommitLog) -> None:
    assert log.sink_meta() is None
    first = log.create(SinkMeta("orders", created_at_ms=1))
    again = log.create(SinkMeta("orders", created_at_ms=2))
    assert first == again == log.sink_meta() == SinkMeta("orders", created_at_ms=1)


def test_create_refuses_a_log_of_another_sink(log: JsonCommitLog) -> None:
    log.create(SinkMeta("orders", created_at_ms=1))
    with pytest.raises(CommitLogError) as info:
        log.create(SinkMeta("payments", created_at_ms=2))
    assert str(info.value) == f"commit log {log.uri} belongs to sink orders, not payments"


def test_decision_round_trip(log: JsonCommitLog) -> None:
    decision = make_decision(3)
    assert not log.has_decision(3)
    log.put_decision(decision)
    assert log.has_decision(3)
    assert log.decision(3) == decision
    assert log.decision(4) is None


def test_repeated_identical_decision_succeeds_and_keeps_the_first(log: JsonCommitLog) -> None:
    log.put_decision(make_decision(3, decided_at_ms=1_000))
    log.put_decision(make_decision(3, decided_at_ms=2_000))
    assert log.decision(3) == make_decision(3, decided_at_ms=1_000)


def test_different_decision_is_a_conflict_and_overwrites_nothing(
    log: JsonCommitLog, storage: LocalStorage
) -> None:
    log.put_decision(make_decision(3, query_id="query-1"))
    before = storage.get(decision_name(3))
    with pytest.raises(CommitLogConflictError) as info:
        log.put_decision(make_decision(3, query_id="query-2", partitions=(0, 1, 2)))
    message = str(info.value)
    assert "batch 3" in message and "query-1" in message and "query-2" in message
    assert "2 participant(s)" in message and "3 participant(s)" in message
    assert storage.get(decision_name(3)) == before


@pytest.mark.parametrize(
    "garbage",
    [
        b"",
        b"{not json",
        b'{"kind":"completion"}',
        b'{"kind":"decision"}',
        b'{"kind":"decision","version":"x"}',
        b"\xff\xfe",
    ],
)
def test_corrupt_existing_decision_is_an_error_and_is_kept(
    log: JsonCommitLog, storage: LocalStorage, garbage: bytes
) -> None:
    storage.put(decision_name(3), garbage)
    with pytest.raises(CommitLogError) as info:
        log.put_decision(make_decision(3))
    assert not isinstance(info.value, CommitLogConflictError)
    assert decision_name(3) in str(info.value)
    assert storage.get(decision_name(3)) == garbage
    with pytest.raises(CommitLogError):
        log.decision(3)


def test_decision_stored_under_another_batch_is_an_error(
    log: JsonCommitLog, storage: LocalStorage
) -> None:
    storage.put(decision_name(5), make_decision(4).to_json())
    with pytest.raises(CommitLogError, match="holds the decision of batch 4"):
        log.decision(5)


def test_completion_is_written_once(log: JsonCommitLog) -> None:
    first = Completion("orders", batch_id=3, completed_at_ms=10)
    lost = LostParticipant("orders-1", 4001, 3, 1, 10, {"events_out": {1: (30, 39)}}, "aborted")
    second = Completion("orders", batch_id=3, completed_at_ms=20, lost=(lost,))
    assert log.completion(3) is None
    assert log.put_completion(first) == first
    assert log.put_completion(second) == first
    assert log.completion(3) == first


def test_decided_and_latest(log: JsonCommitLog) -> None:
    assert log.decided_batches() == []
    assert log.latest_decision() is None
    for batch_id in [0, 1, 2, 10, 11]:
        log.put_decision(make_decision(batch_id))
    assert log.decided_batches() == [0, 1, 2, 10, 11]
    assert log.decided_batches(after=2) == [10, 11]
    assert log.decided_batches(after=-1) == [0, 1, 2, 10, 11]
    assert log.latest_decision() == make_decision(11)


def test_stray_files_are_not_batches(log: JsonCommitLog, storage: LocalStorage) -> None:
    log.put_decision(make_decision(1))
    storage.put("decisions/README.txt", b"hello")
    storage.put("decisions/1.json", b"{}")
    assert log.decided_batches() == [1]


def _complete(log: JsonCommitLog, *batch_ids: int) -> None:
    for batch_id in batch_ids:
        log.put_decision(make_decision(batch_id))
        log.put_completion(Completion("orders", batch_id, completed_at_ms=batch_id))


def test_hint_makes_listing_start_after_it(storage: LocalStorage) -> None:
    spy = SpyStorage(storage)
    log = JsonCommitLog(spy)
    _complete(log, 0, 1, 2, 3)
    log.put_decision(make_decision(4))
    log.write_hint(3)

    spy.lists.clear()
    assert log.latest_decision() == make_decision(4)
    assert spy.lists == [("decisions/", decision_name(3))]

    spy.lists.clear()
    assert log.incomplete_batches() == [4]
    assert set(spy.lists) == {
        ("decisions/", decision_name(3)),
        ("completions/", completion_name(3)),
    }


def test_latest_decision_is_the_hinted_one_when_nothing_follows(storage: LocalStorage) -> None:
    spy = SpyStorage(storage)
    log = JsonCommitLog(spy)
    _complete(log, 0, 1, 2)
    log.write_hint(2)
    assert log.latest_decision() == make_decision(2)
    assert log.incomplete_batches() == []
    assert all(start_after is not None for _, start_after in spy.lists)


@pytest.mark.parametrize(
    "hint",
    [None, b"", b"garbage", b'{"last_completed": "3"}', b'{"last_completed": -1}', b"[3]", 99],
)
def test_unusable_hint_means_listing_from_the_start(
    storage: LocalStorage, hint: bytes | int | None
) -> None:
    spy = SpyStorage(storage)
    log = JsonCommitLog(spy)
    _complete(log, 0, 1, 2)
    log.put_decision(make_decision(3))
    if isinstance(hint, int):
        log.write_hint(hint)  # a batch that never completed
    elif hint is not None:
        storage.put(HINT, hint)

    spy.lists.clear()
    assert log.latest_decision() == make_decision(3)
    assert log.incomplete_batches() == [3]
    assert {start_after for _, start_after in spy.lists} == {None}


def test_write_hint_never_raises(storage: LocalStorage) -> None:
    log = JsonCommitLog(SpyStorage(storage, fail_puts=True))
    _complete(log, 0)
    log.write_hint(0)
    assert log.last_completed_hint() is None


def test_max_partition_count(storage: LocalStorage) -> None:
    log = JsonCommitLog(storage, recent=3)
    assert log.max_partition_count() == 0
    log.put_decision(make_decision(0, partitions=(0, 1, 2, 3, 4, 5, 6, 7, 8, 9)))
    log.put_decision(make_decision(1, partitions=(0, 5), tasks=3))
    log.put_decision(make_decision(2, partitions=(1,), tasks=4))
    log.put_decision(make_decision(3, partitions=(2,), tasks=3))
    # Batch 0 is older than the 3 most recent: largest of 5 + 1, 4 and 3 tasks.
    assert log.max_partition_count() == 6


def test_open_commit_log(tmp_path: Path) -> None:
    log = open_commit_log(str(tmp_path / "log"), None)
    log.put_decision(make_decision(0))
    assert open_commit_log((tmp_path / "log").as_uri(), S3Settings()).decision(0) is not None
    with pytest.raises(CommitLogError, match="hdfs://nn/log"):
        open_commit_log("hdfs://nn/log", None)


# Two processes racing put_decision for the same batches; shared with the S3 and Delta tests.


def race_worker(
    uri: str,
    settings: S3Settings | None,
    rounds: int,
    query_id: str,
    decided_at_ms: int,
    barrier: Any,
    results: Any,
    fmt: LogFormat = "json",
) -> None:
    log = open_commit_log(uri, settings, fmt)
    outcomes = []
    for batch_id in range(rounds):
        barrier.wait(60)
        try:
            log.put_decision(make_decision(batch_id, query_id, decided_at_ms))
            outcomes.append("ok")
        except CommitLogConflictError:
            outcomes.append("conflict")
        except Exception as exc:
            outcomes.append(f"error: {exc!r}")
    results.put((query_id, decided_at_ms, outcomes))


def race(
    uri: str,
    settings: S3Settings | None,
    rounds: int,
    writers: list[tuple[str, int]],
    fmt: LogFormat = "json",
) -> list[tuple[str, int, list[str]]]:
    """Run one spawned process per (query id, decision time); their outcomes, in that order."""
    context = multiprocessing.get_context("spawn")
    barrier = context.Barrier(len(writers))
    results = context.Queue()
    processes = [
        context.Process(
            target=race_worker, args=(uri, settings, rounds, query, at, barrier, results, fmt)
        )
        for query, at in writers
    ]
    for process in processes:
        process.start()
    try:
        found = _collect(results, processes)
        for process in processes:
            process.join(60)
            assert process.exitcode == 0
    finally:
        for process in processes:
            if process.is_alive():
                process.terminate()
    return sorted(found, key=lambda result: writers.index(result[:2]))


def _collect(results: Any, processes: list[Any], timeout_s: float = 180) -> list[Any]:
    """Every worker's result; fails at once if a worker died instead of reporting."""
    found: list[Any] = []
    deadline = time.monotonic() + timeout_s
    while len(found) < len(processes):
        try:
            found.append(results.get(timeout=0.5))
        except queue.Empty:
            died = [p.exitcode for p in processes if p.exitcode not in (None, 0)]
            assert not died, f"a race worker died with exit code(s) {died}"
            assert time.monotonic() < deadline, "the race workers did not finish in time"
    return found


def check_identical_race(
    uri: str, settings: S3Settings | None, rounds: int, fmt: LogFormat = "json"
) -> None:
    results = race(uri, settings, rounds, [("query-1", 1), ("query-1", 2)], fmt)
    assert [outcomes for _, _, outcomes in results] == [["ok"] * rounds] * 2
    log = open_commit_log(uri, settings, fmt)
    for batch_id in range(rounds):
        stored = log.decision(batch_id)
        assert stored is not None and stored.same_decision(make_decision(batch_id))


def check_different_race(
    uri: str, settings: S3Settings | None, rounds: int, fmt: LogFormat = "json"
) -> None:
    results = race(uri, settings, rounds, [("query-1", 1), ("query-2", 2)], fmt)
    log = open_commit_log(uri, settings, fmt)
    for batch_id in range(rounds):
        outcomes = {query: outcomes[batch_id] for query, _, outcomes in results}
        assert sorted(outcomes.values()) == ["conflict", "ok"], (batch_id, outcomes)
        winner = next(query for query, outcome in outcomes.items() if outcome == "ok")
        stored = log.decision(batch_id)
        assert stored is not None and stored.query_id == winner, (batch_id, outcomes)


def test_processes_racing_identical_decisions_both_succeed(tmp_path: Path) -> None:
    check_identical_race(str(tmp_path / "log"), None, rounds=40)


def test_processes_racing_different_decisions_one_wins(tmp_path: Path) -> None:
    check_different_race(str(tmp_path / "log"), None, rounds=40)
