"""Where the commit log lives: a local directory or an S3 prefix, both with put-if-absent.

`put_if_absent` is the commit point of the protocol. Locally it is a hard link of a fully written,
fsynced temporary file (an `O_EXCL` create followed by a write could leave an empty record after a
crash); on S3 it is `PutObject` with `If-None-Match: *`. Either way the final name never holds a
partial record, and an existing record is never replaced.
"""

from __future__ import annotations

import contextlib
import os
import random
import re
import time
import uuid
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, TypeVar
from urllib.parse import unquote, urlparse

from kafka_txn_sink.errors import CommitLogError
from kafka_txn_sink.storage.s3 import S3Prefix, S3Settings

__all__ = [
    "LocalStorage",
    "S3RequestError",
    "S3Settings",
    "S3Storage",
    "Storage",
    "open_storage",
    "parse_location",
]

T = TypeVar("T")

_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")
_TEMP_PREFIX = "."
_CONFLICT_RETRIES = 5
_CONFLICT_BACKOFF_S = 0.05


class Storage(Protocol):
    """A flat namespace of small objects under one root; names use `/` and are relative."""

    @property
    def uri(self) -> str: ...

    def put_if_absent(self, name: str, data: bytes) -> bool:
        """Create `name` with `data`. True: we created it. False: something was already there."""
        ...

    def get(self, name: str) -> bytes | None: ...

    def exists(self, name: str) -> bool: ...

    def put(self, name: str, data: bytes) -> None:
        """Plain overwrite: only for best-effort data such as hints."""
        ...

    def list(self, prefix: str, start_after: str | None = None) -> list[str]:
        """Every name starting with `prefix` and sorting after `start_after`, sorted."""
        ...

    def delete(self, name: str) -> None: ...


class LocalStorage:
    """A directory on a local (or mounted) file system."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root).absolute()

    def __repr__(self) -> str:
        return f"LocalStorage({str(self.root)!r})"

    @property
    def uri(self) -> str:
        return self.root.as_uri()

    def put_if_absent(self, name: str, data: bytes) -> bool:
        final = self._path(name)
        self._make_dirs(final.parent)
        temp = self._write_temp(final, data)
        try:
            os.link(temp, final)
        except FileExistsError:
            return False
        except OSError as exc:
            raise CommitLogError(f"cannot create {final}: {exc}") from exc
        finally:
            unlink_quietly(temp)
        fsync_path(final.parent)
        return True

    def get(self, name: str) -> bytes | None:
        path = self._path(name)
        try:
            return path.read_bytes()
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise CommitLogError(f"cannot read {path}: {exc}") from exc

    def exists(self, name: str) -> bool:
        return self._path(name).is_file()

    def put(self, name: str, data: bytes) -> None:
        final = self._path(name)
        self._make_dirs(final.parent)
        temp = self._write_temp(final, data)
        try:
            os.replace(temp, final)
        except OSError as exc:
            unlink_quietly(temp)
            raise CommitLogError(f"cannot write {final}: {exc}") from exc

    def list(self, prefix: str, start_after: str | None = None) -> list[str]:
        directory, _, _ = prefix.rpartition("/")
        names = (
            name
            for name in self._walk(self.root / directory, directory)
            if name.startswith(prefix) and (start_after is None or name > start_after)
        )
        return sorted(names)

    def delete(self, name: str) -> None:
        unlink_quietly(self._path(name))

    def _path(self, name: str) -> Path:
        parts = name.split("/")
        if not name or any(p in ("", ".", "..") or p.startswith(_TEMP_PREFIX) for p in parts):
            raise CommitLogError(f"invalid object name {name!r} under {self.uri}")
        return self.root.joinpath(*parts)

    def _walk(self, directory: Path, relative: str) -> Iterator[str]:
        try:
            entries = list(os.scandir(directory))
        except (FileNotFoundError, NotADirectoryError):
            return
        except OSError as exc:
            raise CommitLogError(f"cannot list {directory}: {exc}") from exc
        for entry in entries:
            if entry.name.startswith(_TEMP_PREFIX):
                continue
            name = f"{relative}/{entry.name}" if relative else entry.name
            if entry.is_dir(follow_symlinks=False):
                yield from self._walk(Path(entry.path), name)
            else:
                yield name

    def _make_dirs(self, target: Path) -> None:
        try:
            make_dirs(target, durable=True)
        except OSError as exc:
            raise CommitLogError(f"cannot create directory {target}: {exc}") from exc

    def _write_temp(self, final: Path, data: bytes) -> Path:
        # Same directory (so the link is on one file system), dot-prefixed (so list() skips it).
        temp = final.with_name(f"{_TEMP_PREFIX}{final.name}.{uuid.uuid4().hex}.tmp")
        try:
            with open(temp, "xb") as out:
                out.write(data)
                out.flush()
                os.fsync(out.fileno())
        except BaseException as exc:
            unlink_quietly(temp)
            if isinstance(exc, OSError):
                raise CommitLogError(f"cannot write {temp}: {exc}") from exc
            raise
        return temp


def make_dirs(target: Path, *, durable: bool) -> None:
    """Create `target` and its missing parents; durable: each new entry survives a crash,
    as the file that will live there must.

    Raises:
        OSError: a directory could not be created or synced.
    """
    missing = []
    directory = target
    while not directory.exists():
        missing.append(directory)
        directory = directory.parent
    for created in reversed(missing):
        created.mkdir(exist_ok=True)
        if durable:
            fsync_path(created.parent)


def fsync_path(path: Path) -> None:
    """fsync a file or a directory (a directory's sync makes its new entries durable)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def unlink_quietly(path: Path) -> None:
    with contextlib.suppress(OSError):
        path.unlink()


class S3Storage(S3Prefix):
    """A prefix of an S3 bucket, through boto3, on AWS or any S3-compatible endpoint."""

    def __init__(
        self,
        bucket: str,
        prefix: str = "",
        settings: S3Settings | None = None,
        *,
        list_page_size: int = 1000,
    ) -> None:
        super().__init__(bucket, prefix, settings)
        self.list_page_size = list_page_size

    def _error(self, message: str, status: int, code: str) -> S3RequestError:
        return S3RequestError(message, status, code)

    def __repr__(self) -> str:
        return f"S3Storage({self.uri!r}, endpoint={self.endpoint!r})"

    def __reduce__(self) -> tuple[Any, ...]:
        # A boto3 client cannot be pickled; rebuild it where the storage lands (an executor).
        return (_rebuild_s3, (self.bucket, self.prefix, self.settings, self.list_page_size))

    def put_if_absent(self, name: str, data: bytes) -> bool:
        key = self._key(name)
        for attempt in range(_CONFLICT_RETRIES + 1):
            try:
                self._call(
                    "create",
                    name,
                    self._client.put_object,
                    Bucket=self.bucket,
                    Key=key,
                    Body=data,
                    IfNoneMatch="*",
                )
                return True
            except S3RequestError as refused:
                # A 412 may answer botocore's retry of our own first, successful attempt:
                # the caller reads the record back and compares.
                if refused.status == 412:
                    return False
                # 409: a concurrent conditional write to the same key is in flight; its outcome
                # decides, so ask again shortly.
                if refused.status != 409 or attempt == _CONFLICT_RETRIES:
                    raise
                time.sleep(_CONFLICT_BACKOFF_S * 2**attempt * (0.5 + random.random()))
        raise AssertionError("unreachable")

    def get(self, name: str) -> bytes | None:
        try:
            response = self._call(
                "read", name, self._client.get_object, Bucket=self.bucket, Key=self._key(name)
            )
        except S3RequestError as refused:
            if refused.code in ("NoSuchKey", "404"):
                return None
            raise
        return self._call("read", name, response["Body"].read)

    def exists(self, name: str) -> bool:
        # A HEAD answers 404 for a missing bucket as for a missing key; a one-key listing of the
        # exact name tells them apart (NoSuchBucket) at the price of one request as well.
        key = self._key(name)
        page = self._call(
            "list", name, self._client.list_objects_v2, Bucket=self.bucket, Prefix=key, MaxKeys=1
        )
        return any(item["Key"] == key for item in page.get("Contents", []))

    def put(self, name: str, data: bytes) -> None:
        self._call(
            "write",
            name,
            self._client.put_object,
            Bucket=self.bucket,
            Key=self._key(name),
            Body=data,
        )

    def list(self, prefix: str, start_after: str | None = None) -> list[str]:
        arguments: dict[str, Any] = {"Bucket": self.bucket, "Prefix": self._key(prefix)}
        if start_after is not None:
            arguments["StartAfter"] = self._key(start_after)
        paginator = self._client.get_paginator("list_objects_v2")
        pages = paginator.paginate(**arguments, PaginationConfig={"PageSize": self.list_page_size})
        keys = self._call("list", prefix, _keys_of, pages=pages)
        skip = len(self._key(""))
        return sorted(key[skip:] for key in keys)

    def delete(self, name: str) -> None:
        self._call(
            "delete", name, self._client.delete_object, Bucket=self.bucket, Key=self._key(name)
        )

    def probe_conditional_writes(self) -> None:
        """Fail unless the endpoint refuses a second `If-None-Match: *` write of one key."""
        name = f"_probe/{uuid.uuid4().hex}"
        try:
            first = self.put_if_absent(name, b"probe")
            second = self.put_if_absent(name, b"probe again") if first else True
        except S3RequestError as exc:
            if exc.status in (400, 501):
                raise self._not_honoured(f"it rejected the header: {exc}") from exc
            raise
        finally:
            self._delete_quietly(name)
        if not first:
            raise self._not_honoured("a fresh key was reported as existing")
        if second:
            raise self._not_honoured("a second write of the same key succeeded")

    def _not_honoured(self, why: str) -> CommitLogError:
        return CommitLogError(
            f"S3 endpoint {self.endpoint} does not honour If-None-Match ({why}) for {self.uri}; "
            "conditional writes are required for exactly-once"
        )

    def _delete_quietly(self, name: str) -> None:
        with contextlib.suppress(CommitLogError):
            self.delete(name)


class S3RequestError(CommitLogError):
    """S3 answered a request with an error (status 0: no answer); status and code let callers
    treat some answers as results."""

    def __init__(self, message: str, status: int, code: str) -> None:
        super().__init__(message)
        self.status = status
        self.code = code


def _keys_of(pages: Iterable[dict[str, Any]]) -> list[str]:
    return [item["Key"] for page in pages for item in page.get("Contents", [])]


def _rebuild_s3(bucket: str, prefix: str, settings: S3Settings, page_size: int) -> S3Storage:
    return S3Storage(bucket, prefix, settings, list_page_size=page_size)


def open_storage(uri: str, s3: S3Settings | None = None) -> Storage:
    """`s3://bucket/prefix`, `file:///path` or a plain path; anything else is refused."""
    location = parse_location(uri, "commit log", CommitLogError)
    if location.scheme == "s3":
        return S3Storage(location.bucket, location.path, s3)
    return LocalStorage(Path(location.path))


@dataclass(frozen=True)
class Location:
    """A parsed location: an S3 bucket and key prefix, or a local path (`bucket` empty)."""

    scheme: str  # "s3" or "file"
    bucket: str
    path: str


def parse_location(uri: str, what: str, error: type[Exception] = CommitLogError) -> Location:
    """`s3://bucket/prefix`, `file:///path` or a plain path; `what` names the location in the
    `error` raised for anything else."""
    match = _SCHEME.match(uri)
    scheme = match.group(1).lower() if match else ""
    if scheme == "s3":
        parsed = urlparse(uri)
        if not parsed.netloc or parsed.query or parsed.fragment:
            raise error(f"invalid S3 {what} location {uri!r}: use s3://bucket/prefix")
        return Location("s3", parsed.netloc, unquote(parsed.path))
    if scheme == "file":
        parsed = urlparse(uri)
        if parsed.netloc not in ("", "localhost") or not parsed.path:
            raise error(f"invalid file {what} location {uri!r}: use file:///path")
        return Location("file", "", unquote(parsed.path))
    if scheme or not uri.strip():
        raise error(
            f"unsupported {what} location {uri!r}: use s3://bucket/prefix, "
            "file:///path or a local path"
        )
    return Location("file", "", uri)
