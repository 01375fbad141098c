"""What vacuum deletes: old unreferenced data files and multipart uploads, nothing else."""

from __future__ import annotations

import pytest

from kafka_txn_sink.errors import ConfigError
from kafka_txn_sink.files.vacuum import VacuumPlan, check_retention, plan_vacuum
from kafka_txn_sink.storage.files import PendingUpload, StoredFile

NOW_S = 1_800_000_000.0
HOUR = 3600.0
TIMEOUT_MS = 900_000
ROOT = "s3://bucket/data"


def location(name: str) -> str:
    return f"{ROOT}/{name}"


def stored(name: str, age_h: float, size: int = 100) -> StoredFile:
    return StoredFile(name, size, NOW_S - age_h * HOUR)


def plan(
    referenced: set[str],
    files: list[StoredFile],
    retention_h: float = 24.0,
    pending: list[PendingUpload] | None = None,
) -> VacuumPlan:
    return plan_vacuum(
        referenced,
        files,
        location,
        now_s=NOW_S,
        retention_s=retention_h * HOUR,
        transaction_timeout_ms=TIMEOUT_MS,
        pending=pending or [],
    )


def test_referenced_files_are_kept_however_old() -> None:
    old = stored("user=a/part-0-0-0-0.avro", age_h=1000)

    result = plan({location(old.name)}, [old])

    assert result.delete == [] and result.referenced == 1


def test_young_orphans_are_kept() -> None:
    young = stored("user=a/part-1-0-1-0.avro", age_h=23.9)

    result = plan(set(), [young])

    assert result.delete == [] and result.young == 1


def test_old_orphans_are_deleted_with_their_bytes() -> None:
    kept = stored("user=a/part-1-0-0-0.avro", age_h=30)
    orphans = [
        stored("user=a/part-1-0-1-0.avro", 30, 70),
        stored("user=b/part-2-1-1-0.avro", 25, 5),
    ]

    result = plan({location(kept.name)}, [kept, *orphans])

    assert result.delete == orphans
    assert result.delete_bytes == 75


def test_schemas_and_foreign_files_are_kept() -> None:
    files = [stored("_schemas/abc123.avsc", 500), stored("README.txt", 500)]

    result = plan(set(), files)

    assert result.delete == [] and result.other == 2


def test_a_local_temporary_left_by_a_crash_is_an_orphan() -> None:
    temp = stored("user=a/.part-1-0-0-0.avro.0123456789ab.tmp", 48)
    other_hidden = stored("user=a/.keep", 48)

    result = plan(set(), [temp, other_hidden])

    assert result.delete == [temp] and result.other == 1


def test_only_stale_multipart_uploads_are_aborted() -> None:
    stale = PendingUpload("user=a/part-3-0-0-0.avro", "u1", NOW_S - 48 * HOUR)
    live = PendingUpload("user=a/part-4-0-0-0.avro", "u2", NOW_S - 60)

    result = plan(set(), [], pending=[stale, live])

    assert result.abort == [stale]


def test_retention_shorter_than_the_transaction_timeout_is_refused() -> None:
    with pytest.raises(ConfigError, match="shorter than the transaction timeout"):
        plan(set(), [], retention_h=0.2)  # 12 min < 15 min


def test_retention_equal_to_the_transaction_timeout_is_allowed() -> None:
    check_retention(TIMEOUT_MS / 1000, TIMEOUT_MS)
    orphan = stored("x/part-1-0-0-0.avro", age_h=0.3)

    assert plan(set(), [orphan], retention_h=0.25).delete == [orphan]
