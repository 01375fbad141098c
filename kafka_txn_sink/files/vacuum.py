"""What `kafka-txn-sink vacuum` may delete under a files-mode `path`.

A task uploads its files before its batch is decided, and a failed or retried attempt leaves
its files behind unreferenced. Such a file is garbage once no decision can name it any more: a
task's transaction starts before its files are uploaded and the broker aborts it after the
transaction timeout, so a file older than that timeout that no decided batch lists never will
be. The retention therefore can never be shorter than the longest transaction timeout.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from kafka_txn_sink.commit_log import CommitLog
from kafka_txn_sink.errors import ConfigError
from kafka_txn_sink.files.naming import is_data_file
from kafka_txn_sink.storage.files import PendingUpload, StoredFile


@dataclass(frozen=True)
class VacuumPlan:
    """What to delete and, for the report, why the rest stays."""

    delete: list[StoredFile]
    abort: list[PendingUpload]
    referenced: int  # stored files a decided batch lists
    young: int  # unreferenced, but younger than the retention
    other: int  # schemas and files that are not the sink's data files

    @property
    def delete_bytes(self) -> int:
        """The bytes the deletions free."""
        return sum(f.bytes for f in self.delete)


def check_retention(retention_s: float, transaction_timeout_ms: int) -> None:
    """Raises ConfigError when the retention is shorter than the transaction timeout."""
    if transaction_timeout_ms <= 0:
        raise ConfigError(f"transaction timeout must be positive, not {transaction_timeout_ms} ms")
    if retention_s * 1000 < transaction_timeout_ms:
        raise ConfigError(
            f"retention {retention_s / 3600:g} h is shorter than the transaction timeout "
            f"{transaction_timeout_ms} ms ({transaction_timeout_ms / 3_600_000:g} h): a task's "
            "file is uploaded before its batch is decided, so a younger unreferenced file may "
            "still be referenced"
        )


def plan_vacuum(
    referenced: Iterable[str],
    stored: Sequence[StoredFile],
    location: Callable[[str], str],
    *,
    now_s: float,
    retention_s: float,
    transaction_timeout_ms: int,
    pending: Sequence[PendingUpload] = (),
) -> VacuumPlan:
    """The data files and multipart uploads to remove.

    `referenced`: the locations every decided batch lists; `location` maps a stored name to the
    same form (`FileSink.location`). Only data files (`.avro`, and left-over temporaries of a
    local sink) older than the retention and not referenced are deleted; `_schemas/` stays.

    Raises:
        ConfigError: the retention is shorter than the transaction timeout.
    """
    check_retention(retention_s, transaction_timeout_ms)
    cutoff = now_s - retention_s
    named = set(referenced)
    delete: list[StoredFile] = []
    counts = {"referenced": 0, "young": 0, "other": 0}
    for item in stored:
        if not is_data_file(item.name):
            counts["other"] += 1
        elif location(item.name) in named:
            counts["referenced"] += 1
        elif item.modified_s >= cutoff:
            counts["young"] += 1
        else:
            delete.append(item)
    abort = [u for u in pending if u.initiated_s < cutoff]
    return VacuumPlan(delete, abort, **counts)


def referenced_locations(commit_log: CommitLog) -> set[str]:
    """Every file location a decided batch of the log lists."""
    found: set[str] = set()
    for batch in commit_log.decided_batches():
        decision = commit_log.decision(batch)
        if decision is not None:
            found.update(f.location for p in decision.participants for f in p.files)
    return found
