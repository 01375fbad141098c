"""Where the sink keeps what it writes, on a local file system or under an S3 prefix.

The commit log's `Storage` is a flat namespace of small objects with put-if-absent, the commit
point of the protocol: the final name never holds a partial record, and an existing record is
never replaced. Files mode's `FileSink` stores whole files. `open_storage` and `open_file_sink`
open either kind at a location a user gives; boto3 is imported only when it is an `s3://` one.

    settings.py  S3Settings: how to reach an S3 endpoint (no boto3)
    location.py  parsing `s3://bucket/prefix`, `file:///path` or a plain path
    local.py     LocalStorage, and the fsync helpers files mode shares
    files.py     the FileSink interface, LocalFileSink
    s3.py        everything boto3: S3Storage, S3FileSink
"""

from __future__ import annotations

from pathlib import Path
from typing import Protocol

from kafka_txn_sink.errors import CommitLogError, ConfigError
from kafka_txn_sink.storage.files import DEFAULT_MULTIPART_THRESHOLD, FileSink, LocalFileSink
from kafka_txn_sink.storage.local import LocalStorage
from kafka_txn_sink.storage.location import Location, parse_location
from kafka_txn_sink.storage.settings import S3Settings

__all__ = [
    "LocalStorage",
    "Location",
    "S3Settings",
    "Storage",
    "open_file_sink",
    "open_storage",
    "parse_location",
]


class Storage(Protocol):
    """A flat namespace of small objects under one root; names use `/` and are relative."""

    @property
    def uri(self) -> str:
        """The root as a URI (`file:///…` or `s3://bucket/prefix`), for messages."""
        ...

    def put_if_absent(self, name: str, data: bytes) -> bool:
        """Create `name` with `data`. True: we created it. False: something was already there."""
        ...

    def get(self, name: str) -> bytes | None:
        """The object's bytes, or None if it does not exist."""
        ...

    def exists(self, name: str) -> bool:
        """Whether the object exists, without reading it."""
        ...

    def put(self, name: str, data: bytes) -> None:
        """Plain overwrite: only for best-effort data such as hints."""
        ...

    def list(self, prefix: str, start_after: str | None = None) -> list[str]:
        """Every name starting with `prefix` and sorting after `start_after`, sorted."""
        ...

    def delete(self, name: str) -> None:
        """Remove the object; a missing one is no error."""
        ...


def open_storage(uri: str, s3: S3Settings | None = None) -> Storage:
    """`s3://bucket/prefix`, `file:///path` or a plain path; anything else is refused."""
    location = parse_location(uri, "commit log", CommitLogError)
    if location.scheme == "s3":
        # Imported here: a sink whose commit log is local never loads boto3.
        from kafka_txn_sink.storage.s3 import S3Storage

        return S3Storage(location.bucket, location.path, s3)
    return LocalStorage(Path(location.path))


def open_file_sink(
    uri: str,
    s3: S3Settings | None = None,
    *,
    multipart_threshold: int = DEFAULT_MULTIPART_THRESHOLD,
) -> FileSink:
    """`s3://bucket/prefix`, `file:///path` or a plain path (option `path`)."""
    location = parse_location(uri, "files", ConfigError)
    if location.scheme == "s3":
        # Imported here: a sink that writes its files locally never loads boto3.
        from kafka_txn_sink.storage.s3 import S3FileSink

        return S3FileSink(
            location.bucket, location.path, s3, multipart_threshold=multipart_threshold
        )
    return LocalFileSink(location.path)
