"""LocalStorage: put-if-absent that never leaves a partial record, even when the process dies."""

from __future__ import annotations

import multiprocessing
import os
import stat
from pathlib import Path

import pytest

from kafka_txn_sink.errors import CommitLogError
from kafka_txn_sink.storage import LocalStorage, S3Settings, open_storage
from kafka_txn_sink.storage.s3 import S3Storage

RECORD = b'{"kind":"decision","batch_id":7}'


@pytest.fixture
def storage(tmp_path: Path) -> LocalStorage:
    return LocalStorage(tmp_path / "log")


def test_put_if_absent_creates_once_and_never_overwrites(storage: LocalStorage) -> None:
    assert storage.put_if_absent("decisions/7.json", RECORD) is True
    assert storage.put_if_absent("decisions/7.json", b"another record") is False
    assert storage.get("decisions/7.json") == RECORD


def test_put_if_absent_creates_parent_directories(storage: LocalStorage) -> None:
    assert storage.put_if_absent("a/b/c/record.json", RECORD)
    assert (storage.root / "a" / "b" / "c" / "record.json").read_bytes() == RECORD


def test_get_and_exists_of_missing_name(storage: LocalStorage) -> None:
    assert storage.get("decisions/1.json") is None
    assert storage.exists("decisions/1.json") is False
    storage.put_if_absent("decisions/1.json", RECORD)
    assert storage.exists("decisions/1.json") is True


def test_put_overwrites(storage: LocalStorage) -> None:
    storage.put("_hints/last.json", b"1")
    storage.put("_hints/last.json", b"2")
    assert storage.get("_hints/last.json") == b"2"
    assert storage.list("_hints/") == ["_hints/last.json"]


def test_list_is_sorted_relative_recursive_and_starts_after(storage: LocalStorage) -> None:
    for name in ["d/3.json", "d/1.json", "d/2.json", "c/1.json", "d/sub/9.json", "top.json"]:
        storage.put_if_absent(name, RECORD)
    assert storage.list("d/") == ["d/1.json", "d/2.json", "d/3.json", "d/sub/9.json"]
    assert storage.list("d/", start_after="d/1.json") == ["d/2.json", "d/3.json", "d/sub/9.json"]
    assert storage.list("d/2") == ["d/2.json"]
    assert storage.list("") == sorted(storage.list("c/") + storage.list("d/") + ["top.json"])
    assert storage.list("missing/") == []


def test_leftover_temp_file_is_ignored_and_does_not_block_the_next_put(
    storage: LocalStorage,
) -> None:
    directory = storage.root / "decisions"
    directory.mkdir(parents=True)
    (directory / ".7.json.0123abcd.tmp").write_bytes(RECORD[:5])

    assert storage.list("decisions/") == []
    assert storage.get("decisions/7.json") is None
    assert storage.put_if_absent("decisions/7.json", RECORD) is True
    assert storage.get("decisions/7.json") == RECORD
    assert storage.list("decisions/") == ["decisions/7.json"]


def _put_and_die_at(root: str, crash_point: str) -> None:
    """Run in a child process: die abruptly (no clean-up, no flush) at `crash_point`."""

    def die(*args: object, **kwargs: object) -> None:
        os._exit(3)

    setattr(os, crash_point, die)
    LocalStorage(Path(root)).put_if_absent("decisions/7.json", RECORD)


def _crash(root: Path, crash_point: str) -> None:
    # Existing directories, so the first fsync is the record's own.
    (root / "decisions").mkdir(parents=True)
    process = multiprocessing.get_context("spawn").Process(
        target=_put_and_die_at, args=(str(root), crash_point)
    )
    process.start()
    process.join(60)
    assert process.exitcode == 3


@pytest.mark.parametrize("crash_point", ["fsync", "link"])
def test_crash_before_the_link_leaves_no_final_record(
    storage: LocalStorage, crash_point: str
) -> None:
    _crash(storage.root, crash_point)

    leftovers = os.listdir(storage.root / "decisions")
    assert leftovers and all(name.startswith(".") for name in leftovers)
    assert storage.get("decisions/7.json") is None
    assert storage.list("decisions/") == []
    assert storage.put_if_absent("decisions/7.json", RECORD) is True
    assert storage.get("decisions/7.json") == RECORD


def test_crash_after_the_link_leaves_the_complete_record(storage: LocalStorage) -> None:
    _crash(storage.root, "unlink")

    assert len(os.listdir(storage.root / "decisions")) == 2
    assert storage.list("decisions/") == ["decisions/7.json"]
    assert storage.get("decisions/7.json") == RECORD
    assert storage.put_if_absent("decisions/7.json", b"another record") is False


def test_failed_write_leaves_neither_record_nor_temp_file(
    storage: LocalStorage, monkeypatch: pytest.MonkeyPatch
) -> None:
    storage.put_if_absent("decisions/1.json", RECORD)

    def failing_fsync(fd: int) -> None:
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(os, "fsync", failing_fsync)
    with pytest.raises(CommitLogError, match="Input/output error"):
        storage.put_if_absent("decisions/7.json", RECORD)
    assert os.listdir(storage.root / "decisions") == ["1.json"]


def test_record_and_directory_are_fsynced(
    storage: LocalStorage, monkeypatch: pytest.MonkeyPatch
) -> None:
    storage.put_if_absent("decisions/0.json", RECORD)
    synced: list[str] = []
    real_fsync = os.fsync

    def recording_fsync(fd: int) -> None:
        synced.append("dir" if stat.S_ISDIR(os.fstat(fd).st_mode) else "file")
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", recording_fsync)
    storage.put_if_absent("decisions/7.json", RECORD)
    assert synced == ["file", "dir"]


@pytest.mark.parametrize("name", ["", "../escape.json", "a//b", "decisions/.hidden", "./x"])
def test_invalid_names_are_refused(storage: LocalStorage, name: str) -> None:
    with pytest.raises(CommitLogError, match="invalid object name"):
        storage.put_if_absent(name, RECORD)


def test_delete(storage: LocalStorage) -> None:
    storage.put_if_absent("decisions/1.json", RECORD)
    storage.delete("decisions/1.json")
    storage.delete("decisions/1.json")
    assert storage.get("decisions/1.json") is None


def test_open_storage_local_forms(tmp_path: Path) -> None:
    plain = open_storage(str(tmp_path / "log"))
    as_uri = open_storage((tmp_path / "log").as_uri())
    assert isinstance(plain, LocalStorage) and isinstance(as_uri, LocalStorage)
    assert plain.root == as_uri.root == tmp_path / "log"
    assert plain.uri == (tmp_path / "log").as_uri()


def test_open_storage_s3_form_builds_without_network() -> None:
    storage = open_storage("s3://my-bucket/sinks/orders/_log/", S3Settings(region="us-east-1"))
    assert isinstance(storage, S3Storage)
    assert (storage.bucket, storage.prefix) == ("my-bucket", "sinks/orders/_log")
    assert storage.uri == "s3://my-bucket/sinks/orders/_log"


@pytest.mark.parametrize(
    "uri",
    ["hdfs://namenode/sinks/_log", "s3a://bucket/log", "gs://b/x", "s3://", "file://host/x", " "],
)
def test_open_storage_refuses_other_locations(uri: str) -> None:
    with pytest.raises(CommitLogError) as info:
        open_storage(uri)
    assert repr(uri) in str(info.value)


def test_s3_settings_never_show_the_secret() -> None:
    settings = S3Settings(
        endpoint_url="http://127.0.0.1:9000", access_key_id="AKIA", secret_access_key="s3cr3t-XYZ"
    )
    assert "s3cr3t-XYZ" not in repr(settings)
    assert "s3cr3t-XYZ" not in str(settings)
    assert "s3cr3t-XYZ" not in repr(S3Storage("bucket", "p", settings))
    assert settings.use_path_style is True
    assert S3Settings().use_path_style is False
    assert S3Settings(endpoint_url="http://x", path_style=False).use_path_style is False
