"""The commit log: the durable truth about which batches were decided and completed.

A decision record, created put-if-absent, is the commit point of a batch; a completion marker
follows once every participant is settled. `CommitLog` (base.py) is the contract every format
keeps. `JsonCommitLog` (json_log.py) keeps the records as JSON objects in a directory or an S3
prefix; `DeltaCommitLog` (delta_log.py) keeps the same records as rows of a Delta table there
(option commitLogFormat=delta). `open_commit_log` opens either; `detect_format` tells them apart.
"""

from __future__ import annotations

from typing import Literal, get_args

from kafka_txn_sink.commit_log.base import CommitLog
from kafka_txn_sink.commit_log.json_log import JsonCommitLog
from kafka_txn_sink.errors import ConfigError
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
