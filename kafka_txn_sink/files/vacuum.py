"""What `kafka-txn-sink vacuum` may delete under a files-mode `path`.

A task uploads its files before its batch is decided, and a failed or retried attempt leaves
its files behind unreferenced. Such a file is garbage once no decision can name it any more.
Its age alone cannot tell: in files-only mode a task's transaction opens at its first reference
message, when the task closes, so a long task's first files may be far older than any
transaction timeout while its batch is still to be decided.

What tells is the batch in the file's name (files/naming.py). The decision of batch b is the
only record that ever names b's files; it is put-if-absent and never changes, and republishing
publishes again exactly the files it lists. So once b has a decision, a file of b it does not
list stays unlisted forever, and before that any file of b may still be listed. A completion
marker names no other file than the decision, so "decided" is the sound line and "completed"
would only keep garbage longer; it is checked per batch, so a batch below the last decided one
that has no decision keeps its files too. A file is therefore deleted only when its name parses,
its batch is decided, the decision does not list it, and it is older than the retention; a
name that does not parse is never deleted. The retention (never shorter than the transaction
timeout) stays as a second guard, for what the name cannot say.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from kafka_txn_sink.commit_log import CommitLog
from kafka_txn_sink.errors import ConfigError
from kafka_txn_sink.files.naming import is_data_file, parse_file_name
from kafka_txn_sink.storage.files import PendingUpload, StoredFile


@dataclass(frozen=True)
class DecidedFiles:
    """What the commit log says of files: the decided batches and every location they list."""

    batches: frozenset[int]
    locations: frozenset[str]

    def final(self, name: str) -> bool:
        """Whether no decision can ever list `name` other than as it does now: its name parses
        and its batch is decided."""
        parsed = parse_file_name(name)
        return parsed is not None and parsed.batch_id in self.batches


@dataclass(frozen=True)
class VacuumPlan:
    """What to delete and, for the report, why the rest stays."""

    delete: list[StoredFile]
    abort: list[PendingUpload]
    referenced: int  # stored files a decided batch lists
    undecided: int  # unreferenced, but of a batch not decided yet (or a name that does not parse)
    young: int  # unreferenced, of a decided batch, but younger than the retention
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
    decided: DecidedFiles,
    stored: Sequence[StoredFile],
    location: Callable[[str], str],
    *,
    now_s: float,
    retention_s: float,
    transaction_timeout_ms: int,
    pending: Sequence[PendingUpload] = (),
) -> VacuumPlan:
    """The data files and multipart uploads to remove.

    `decided`: the decided batches and the locations they list; `location` maps a stored name
    to the same form (`FileSink.location`). Only data files (`.avro`, and left-over temporaries
    of a local sink) of a decided batch, not listed by its decision and older than the retention
    are deleted, and multipart uploads of such files; `_schemas/` stays.

    Raises:
        ConfigError: the retention is shorter than the transaction timeout.
    """
    check_retention(retention_s, transaction_timeout_ms)
    cutoff = now_s - retention_s
    delete: list[StoredFile] = []
    counts = {"referenced": 0, "undecided": 0, "young": 0, "other": 0}
    for item in stored:
        if not is_data_file(item.name):
            counts["other"] += 1
        elif location(item.name) in decided.locations:
            counts["referenced"] += 1
        elif not decided.final(item.name):
            counts["undecided"] += 1
        elif item.modified_s >= cutoff:
            counts["young"] += 1
        else:
            delete.append(item)
    abort = [u for u in pending if u.initiated_s < cutoff and decided.final(u.name)]
    return VacuumPlan(delete, abort, **counts)


def decided_files(commit_log: CommitLog) -> DecidedFiles:
    """The batches the log has decided and every file location their decisions list."""
    batches: set[int] = set()
    found: set[str] = set()
    for decision in commit_log.decisions():
        batches.add(decision.batch_id)
        found.update(f.location for p in decision.participants for f in p.files)
    return DecidedFiles(frozenset(batches), frozenset(found))
