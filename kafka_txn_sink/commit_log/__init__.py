"""The commit log: the durable truth about which batches were decided and completed.

A decision record, created put-if-absent, is the commit point of a batch; a completion marker
follows once every participant is settled. `JsonCommitLog` keeps them as JSON objects in a
directory or an S3 prefix; `DeltaCommitLog` (delta_log.py) keeps the same records as rows of a
Delta table there (option commitLogFormat=delta).
"""

from __future__ import annotations

from typing import Literal, Protocol, get_args

from kafka_txn_sink.commit_log.json_log import JsonCommitLog
from kafka_txn_sink.errors import ConfigError
from kafka_txn_sink.protocol.messages import Completion, Decision, Republish, SinkMeta
from kafka_txn_sink.storage import S3Settings, open_storage

__all__ = [
    "LOG_FORMATS",
    "CommitLog",
    "JsonCommitLog",
    "LogFormat",
    "detect_format",
    "open_commit_log",
]

LogFormat = Literal["json", "delta"]
LOG_FORMATS: tuple[LogFormat, ...] = get_args(LogFormat)


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

    def put_republish(self, republish: Republish) -> Republish:
        """Put-if-absent per (batch, round); returns the record that is in the log afterwards."""
        ...

    def republish(self, batch_id: int, round_: int) -> Republish | None: ...

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


def open_commit_log(uri: str, s3: S3Settings | None = None, fmt: LogFormat = "json") -> CommitLog:
    """The commit log at `uri` (`s3://bucket/prefix`, `file:///path` or a local path) in `fmt`."""
    if fmt == "json":
        return JsonCommitLog(open_storage(uri, s3))
    if fmt == "delta":
        # Imported here: processes that use the JSON log never load delta-rs.
        from kafka_txn_sink.commit_log.delta_log import DeltaCommitLog

        return DeltaCommitLog(uri, s3)
    raise ConfigError(f"unknown commit log format {fmt!r}: use one of {', '.join(LOG_FORMATS)}")


def detect_format(uri: str, s3: S3Settings | None = None) -> LogFormat:
    """`delta` where the location holds a Delta table's `_delta_log` folder, else `json`."""
    storage = open_storage(uri, s3)
    # Commit 0 exists until the first checkpoint, _last_checkpoint from then on.
    markers = ("_delta_log/_last_checkpoint", "_delta_log/00000000000000000000.json")
    return "delta" if any(storage.exists(name) for name in markers) else "json"
