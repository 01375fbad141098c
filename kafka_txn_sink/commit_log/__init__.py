"""The commit log: the durable truth about which batches were decided and completed.

A decision record, created put-if-absent, is the commit point of a batch; a completion marker
follows once every participant is settled. `JsonCommitLog` keeps them as JSON objects in a
directory or an S3 prefix; a Delta implementation will keep the same records as table rows.
"""

from __future__ import annotations

from typing import Protocol

from kafka_txn_sink.commit_log.json_log import JsonCommitLog
from kafka_txn_sink.records import Completion, Decision, SinkMeta
from kafka_txn_sink.storage import S3Settings, open_storage

__all__ = ["CommitLog", "JsonCommitLog", "open_commit_log"]


class CommitLog(Protocol):
    """What the driver, the tasks and the tools need from a commit log, whatever its format."""

    @property
    def uri(self) -> str: ...

    def sink_meta(self) -> SinkMeta | None: ...

    def create(self, meta: SinkMeta) -> SinkMeta:
        """Claim the log for a sink; the existing claim if it is the same sink, else an error."""
        ...

    def put_decision(self, decision: Decision) -> None:
        """Put-if-absent; an identical existing decision is success, a different one a conflict.

        Raises:
            CommitLogConflictError: a different decision exists for the batch; nothing changed.
            CommitLogError: the existing record is unreadable; nothing changed.
        """
        ...

    def decision(self, batch_id: int) -> Decision | None: ...

    def has_decision(self, batch_id: int) -> bool:
        """Existence only, without reading the record."""
        ...

    def put_completion(self, completion: Completion) -> Completion:
        """Put-if-absent; returns the marker that is in the log afterwards."""
        ...

    def completion(self, batch_id: int) -> Completion | None: ...

    def decided_batches(self, after: int | None = None) -> list[int]: ...

    def latest_decision(self) -> Decision | None: ...

    def incomplete_batches(self) -> list[int]:
        """Decided batches without a completion marker (above the hint), ascending."""
        ...

    def write_hint(self, batch_id: int) -> None:
        """Best effort, never raises: every batch up to `batch_id` is complete."""
        ...

    def max_partition_count(self) -> int:
        """Largest number of transactional ids used by recent batches (0 for an empty log)."""
        ...


def open_commit_log(uri: str, s3: S3Settings | None = None) -> CommitLog:
    """The JSON commit log at `uri`: `s3://bucket/prefix`, `file:///path` or a local path."""
    return JsonCommitLog(open_storage(uri, s3))
