"""What vacuum deletes: old data files (and multipart uploads) of decided batches that their
decisions do not list, nothing else."""

from __future__ import annotations

import pytest

from kafka_txn_sink.errors import ConfigError
from kafka_txn_sink.files.naming import FileNaming
from kafka_txn_sink.files.vacuum import DecidedFiles, VacuumPlan, check_retention, plan_vacuum
from kafka_txn_sink.storage.files import PendingUpload, StoredFile

NOW_S = 1_800_000_000.0
HOUR = 3600.0
TIMEOUT_MS = 900_000
ROOT = "s3://bucket/data"
DECIDED = frozenset({0, 1, 2, 3})  # batches 0-3 decided; 4 and above not yet


def location(name: str) -> str:
    return f"{ROOT}/{name}"


def data(directory: str, batch: int, partition: int = 0, attempt: int = 0) -> str:
    """A data file's stored name, as a task names it."""
    name = FileNaming(batch, partition, attempt, token="0a1b2c3d").name(0)
    return f"{directory}/{name}" if directory else name


def stored(name: str, age_h: float, size: int = 100) -> StoredFile:
    return StoredFile(name, size, NOW_S - age_h * HOUR)


def plan(
    referenced: set[str],
    files: list[StoredFile],
    retention_h: float = 24.0,
    pending: list[PendingUpload] | None = None,
    decided: frozenset[int] = DECIDED,
) -> VacuumPlan:
    return plan_vacuum(
        DecidedFiles(decided, frozenset(referenced)),
        files,
        location,
        now_s=NOW_S,
        retention_s=retention_h * HOUR,
        transaction_timeout_ms=TIMEOUT_MS,
        pending=pending or [],
    )


def test_referenced_files_are_kept_however_old() -> None:
    old = stored(data("user=a", 0), age_h=1000)

    result = plan({location(old.name)}, [old])

    assert result.delete == [] and result.referenced == 1


def test_young_orphans_are_kept() -> None:
    young = stored(data("user=a", 1, attempt=1), age_h=23.9)

    result = plan(set(), [young])

    assert result.delete == [] and result.young == 1


def test_old_orphans_are_deleted_with_their_bytes() -> None:
    kept = stored(data("user=a", 1), age_h=30)
    orphans = [
        stored(data("user=a", 1, attempt=1), 30, 70),
        stored(data("user=b", 2, partition=1, attempt=1), 25, 5),
    ]

    result = plan({location(kept.name)}, [kept, *orphans])

    assert result.delete == orphans
    assert result.delete_bytes == 75


def test_schemas_and_foreign_files_are_kept() -> None:
    files = [stored("_schemas/abc123.avsc", 500), stored("README.txt", 500)]

    result = plan(set(), files)

    assert result.delete == [] and result.other == 2


def test_a_local_temporary_left_by_a_crash_is_an_orphan() -> None:
    temp = stored(f"user=a/.{data('', 1)}.0123456789ab.tmp", 48)
    other_hidden = stored("user=a/.keep", 48)

    result = plan(set(), [temp, other_hidden])

    assert result.delete == [temp] and result.other == 1


def test_only_stale_multipart_uploads_are_aborted() -> None:
    stale = PendingUpload(data("user=a", 3), "u1", NOW_S - 48 * HOUR)
    live = PendingUpload(data("user=a", 3, attempt=1), "u2", NOW_S - 60)
    in_flight = PendingUpload(data("user=a", 4), "u3", NOW_S - 48 * HOUR)  # batch 4 undecided

    result = plan(set(), [], pending=[stale, live, in_flight])

    assert result.abort == [stale]


def test_retention_shorter_than_the_transaction_timeout_is_refused() -> None:
    with pytest.raises(ConfigError, match="shorter than the transaction timeout"):
        plan(set(), [], retention_h=0.2)  # 12 min < 15 min


def test_retention_equal_to_the_transaction_timeout_is_allowed() -> None:
    check_retention(TIMEOUT_MS / 1000, TIMEOUT_MS)
    orphan = stored(data("x", 1), age_h=0.3)

    assert plan(set(), [orphan], retention_h=0.25).delete == [orphan]


def test_files_of_a_batch_not_decided_yet_are_kept_however_old() -> None:
    # A files-only task uploads as its files roll and opens its transaction only at close():
    # a long task's first files are older than any retention before its batch is decided.
    in_flight = [stored(data("user=a", 4), 1000), stored(data("user=b", 9, partition=3), 48)]
    orphan = stored(data("user=a", 3, attempt=1), 48)

    result = plan(set(), [*in_flight, orphan])

    assert result.delete == [orphan]
    assert result.undecided == 2


def test_a_batch_below_the_last_decided_one_without_a_decision_keeps_its_files() -> None:
    gap = stored(data("user=a", 2), 48)

    result = plan(set(), [gap], decided=frozenset({0, 1, 3}))

    assert result.delete == [] and result.undecided == 1


def test_a_data_file_whose_name_does_not_parse_is_never_deleted() -> None:
    foreign = [stored("user=a/part-0-0-0-0.avro", 1000), stored("user=a/.x.avro.0a.tmp", 1000)]

    result = plan(set(), foreign)

    assert result.delete == [] and result.undecided == 2
