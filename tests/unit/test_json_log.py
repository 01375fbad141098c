"""What only the JSON log does, on a local directory: its object names, the hint, what it
makes of objects it did not write, and processes racing (the contract: test_commit_log_contract)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from kafka_txn_sink.commit_log import JsonCommitLog, json_log, open_commit_log
from kafka_txn_sink.commit_log.json_log import HINT, completion_name, decision_name
from kafka_txn_sink.errors import CommitLogConflictError, CommitLogError
from kafka_txn_sink.protocol.messages import Completion
from kafka_txn_sink.storage import LocalStorage, S3Settings
from tests.commit_log_races import check_different_race, check_identical_race, make_decision


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


def test_a_record_is_parsed_again_only_when_its_bytes_change(
    log: JsonCommitLog, storage: LocalStorage, monkeypatch: pytest.MonkeyPatch
) -> None:
    parsed: list[str] = []
    real_parse = json_log.parse_record

    def counting_parse(where: str, data: bytes, parse: Any) -> Any:
        parsed.append(where)
        return real_parse(where, data, parse)

    monkeypatch.setattr(json_log, "parse_record", counting_parse)
    written = make_decision(7)
    log.put_decision(written)
    assert log.decision(7) == written
    assert log.latest_decision() == written
    assert parsed == []  # kept from the write: read back, compared, not parsed

    other = make_decision(7, query_id="query-2")
    storage.put(decision_name(7), other.to_json())  # as if the log were replaced by hand
    assert log.decision(7) == other
    assert len(parsed) == 1
    storage.put(decision_name(7), b"{not json")
    with pytest.raises(CommitLogError):
        log.decision(7)


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


def test_open_commit_log(tmp_path: Path) -> None:
    log = open_commit_log(str(tmp_path / "log"), None)
    log.put_decision(make_decision(0))
    assert open_commit_log((tmp_path / "log").as_uri(), S3Settings()).decision(0) is not None
    with pytest.raises(CommitLogError, match="hdfs://nn/log"):
        open_commit_log("hdfs://nn/log", None)


def test_processes_racing_identical_decisions_both_succeed(tmp_path: Path) -> None:
    check_identical_race(str(tmp_path / "log"), None, rounds=40)


def test_processes_racing_different_decisions_one_wins(tmp_path: Path) -> None:
    check_different_race(str(tmp_path / "log"), None, rounds=40)
