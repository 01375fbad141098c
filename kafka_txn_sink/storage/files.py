"""Where files mode puts its files: a local directory or an S3 prefix.

Names are relative to the sink's root and use `/` (`user=ann/date=2026-11-21/part-...avro`).
A file becomes visible whole or not at all: locally through a temporary name in the target
directory and `os.replace`, on S3 because a PUT or a completed multipart upload is atomic.
Every failure is a StagingError naming the bucket or path, never a credential.
"""

from __future__ import annotations

import builtins
import errno
import os
import shutil
import uuid
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, TypeVar

from boto3.s3.transfer import TransferConfig

from kafka_txn_sink.errors import ConfigError, StagingError
from kafka_txn_sink.storage import fsync_path, make_dirs, parse_location, unlink_quietly
from kafka_txn_sink.storage.s3 import S3Prefix, S3Settings

T = TypeVar("T")

MiB = 1024 * 1024
DEFAULT_MULTIPART_THRESHOLD = 64 * MiB
_MIN_PART_SIZE = 5 * MiB  # S3's smallest part but the last
_TEMP_PREFIX = "."


@dataclass(frozen=True)
class StoredFile:
    """One file under the sink's root, as `list` reports it."""

    name: str
    bytes: int
    modified_s: float  # seconds since the epoch


@dataclass(frozen=True)
class PendingUpload:
    """A multipart upload S3 still holds open: invisible, billed, until completed or aborted.

    A failed upload can leave one behind even after its abort: a CreateMultipartUpload that
    timed out on the client may still be carried out by the server later."""

    name: str
    upload_id: str
    initiated_s: float  # seconds since the epoch


class FileSink(Protocol):
    """The root files mode writes under."""

    @property
    def uri(self) -> str: ...

    def location(self, name: str) -> str:
        """Where `name` lives: `s3://bucket/key` or an absolute local path."""
        ...

    def upload(self, local: Path, name: str) -> str:
        """Store the complete local file `local` as `name`, whole; returns `location(name)`.
        `local` may be moved away (a local sink on the same file system renames it)."""
        ...

    def put_text(self, name: str, text: str) -> bool:
        """Create `name` holding `text` unless it exists (True: created). For content-addressed
        files such as `_schemas/<digest>.avsc`, so writing one twice is harmless."""
        ...

    def list(self, prefix: str = "") -> list[StoredFile]:
        """Every file whose name starts with `prefix`, sorted by name, left-over temporary
        files included (they are garbage too)."""
        ...

    def read_head(self, name: str, size: int) -> bytes:
        """The first `size` bytes of `name` (all of it if shorter).

        Raises:
            StagingError: `name` does not exist or cannot be read.
        """
        ...

    def delete(self, name: str) -> None:
        """Remove `name`; a missing file is no error."""
        ...


# --- local directory ---------------------------------------------------------------------


class LocalFileSink:
    """A directory on a local (or mounted) file system.

    `durable`: fsync each file and its directory before it counts as written, so a decision
    record never names a file a crash could lose. Only tests that write thousands of files
    and never crash the machine turn it off (an fsync costs milliseconds).
    """

    def __init__(self, root: Path | str, *, durable: bool = True) -> None:
        self.root = Path(root).absolute()
        self.durable = durable

    def __repr__(self) -> str:
        return f"LocalFileSink({str(self.root)!r})"

    @property
    def uri(self) -> str:
        return str(self.root)

    def location(self, name: str) -> str:
        return str(self._path(name))

    def upload(self, local: Path, name: str) -> str:
        final = self._path(name)
        self._make_dirs(final.parent)
        try:
            if self.durable:
                fsync_path(local)
            # `local` is complete: renaming it is atomic, when it is on the same file system.
            os.replace(local, final)
        except OSError as exc:
            if exc.errno != errno.EXDEV:
                raise StagingError(f"cannot write {final}: {exc}") from exc
            self._copy(local, final)
        if self.durable:
            fsync_path(final.parent)
        return str(final)

    def _copy(self, local: Path, final: Path) -> None:
        temp = self._temp_for(final)
        try:
            shutil.copyfile(local, temp)
            if self.durable:
                fsync_path(temp)
            os.replace(temp, final)
        except OSError as exc:
            unlink_quietly(temp)
            raise StagingError(f"cannot write {final}: {exc}") from exc

    def put_text(self, name: str, text: str) -> bool:
        final = self._path(name)
        temp = self._temp_for(final)
        try:
            with open(temp, "x", encoding="utf-8") as out:
                out.write(text)
                out.flush()
                if self.durable:
                    os.fsync(out.fileno())
            os.link(temp, final)
        except FileExistsError:
            return False
        except OSError as exc:
            raise StagingError(f"cannot write {final}: {exc}") from exc
        finally:
            unlink_quietly(temp)
        if self.durable:
            fsync_path(final.parent)
        return True

    def list(self, prefix: str = "") -> list[StoredFile]:
        directory = prefix.rpartition("/")[0]
        found = [
            f for f in self._walk(self.root / directory, directory) if f.name.startswith(prefix)
        ]
        return sorted(found, key=lambda f: f.name)

    def read_head(self, name: str, size: int) -> bytes:
        path = self._path(name)
        try:
            with path.open("rb") as stored:
                return stored.read(size)
        except OSError as exc:
            raise StagingError(f"cannot read {path}: {exc}") from exc

    def delete(self, name: str) -> None:
        path = self._path(name, allow_temp=True)
        try:
            path.unlink()
        except FileNotFoundError:
            return
        except OSError as exc:
            raise StagingError(f"cannot delete {path}: {exc}") from exc

    def _path(self, name: str, allow_temp: bool = False) -> Path:
        parts = name.split("/")
        if not name or any(
            p in ("", ".", "..") or (p.startswith(_TEMP_PREFIX) and not allow_temp) for p in parts
        ):
            raise StagingError(f"invalid file name {name!r} under {self.root}")
        return self.root.joinpath(*parts)

    def _temp_for(self, final: Path) -> Path:
        self._make_dirs(final.parent)
        # Same directory, so os.replace stays on one file system and is atomic.
        return final.with_name(f"{_TEMP_PREFIX}{final.name}.{uuid.uuid4().hex[:12]}.tmp")

    def _make_dirs(self, target: Path) -> None:
        try:
            make_dirs(target, durable=self.durable)
        except OSError as exc:
            raise StagingError(f"cannot create directory {target}: {exc}") from exc

    def _walk(self, directory: Path, relative: str) -> Iterator[StoredFile]:
        try:
            entries = list(os.scandir(directory))
        except (FileNotFoundError, NotADirectoryError):
            return
        except OSError as exc:
            raise StagingError(f"cannot list {directory}: {exc}") from exc
        for entry in entries:
            name = f"{relative}/{entry.name}" if relative else entry.name
            if entry.is_dir(follow_symlinks=False):
                yield from self._walk(Path(entry.path), name)
                continue
            try:
                stat = entry.stat(follow_symlinks=False)
            except FileNotFoundError:
                continue  # deleted while listing
            yield StoredFile(name, stat.st_size, stat.st_mtime)


# --- S3 ----------------------------------------------------------------------------------


class S3FileSink(S3Prefix):
    """A prefix of an S3 bucket, through boto3 (AWS or any S3-compatible endpoint).

    Files at or above `multipart_threshold` bytes go up as multipart uploads in parts of that
    size (at least 5 MiB); smaller ones in one PUT. Each request is bounded by the settings'
    timeouts and attempts, so a hung endpoint fails the upload in bounded time.
    """

    def __init__(
        self,
        bucket: str,
        prefix: str = "",
        settings: S3Settings | None = None,
        *,
        multipart_threshold: int = DEFAULT_MULTIPART_THRESHOLD,
        max_concurrency: int = 4,
    ) -> None:
        if multipart_threshold < _MIN_PART_SIZE:
            raise StagingError(
                f"multipart threshold {multipart_threshold} is below S3's smallest part "
                f"({_MIN_PART_SIZE} bytes)"
            )
        super().__init__(bucket, prefix, settings)
        self.multipart_threshold = multipart_threshold
        self.max_concurrency = max_concurrency
        self._transfer = TransferConfig(
            multipart_threshold=multipart_threshold,
            multipart_chunksize=multipart_threshold,
            max_concurrency=max_concurrency,
        )

    def _error(self, message: str, status: int, code: str) -> S3FileError:
        return S3FileError(message, status, code)

    def __repr__(self) -> str:
        return f"S3FileSink({self.uri!r}, endpoint={self.endpoint!r})"

    def __reduce__(self) -> tuple[Any, ...]:
        # A boto3 client cannot be pickled; rebuild it where the sink lands (an executor).
        return (
            _rebuild_s3,
            (
                self.bucket,
                self.prefix,
                self.settings,
                self.multipart_threshold,
                self.max_concurrency,
            ),
        )

    def location(self, name: str) -> str:
        return f"s3://{self.bucket}/{self._key(name)}"

    def upload(self, local: Path, name: str) -> str:
        self._call(
            "upload",
            name,
            self._client.upload_file,
            Filename=str(local),
            Bucket=self.bucket,
            Key=self._key(name),
            Config=self._transfer,
        )
        return self.location(name)

    def put_text(self, name: str, text: str) -> bool:
        try:
            self._call(
                "write",
                name,
                self._client.put_object,
                Bucket=self.bucket,
                Key=self._key(name),
                Body=text.encode("utf-8"),
                IfNoneMatch="*",
            )
        except S3FileError as refused:
            # 412: it exists (perhaps from botocore's retry of our own first attempt).
            # 409: a concurrent put-if-absent of the same content-addressed name.
            if refused.status in (409, 412):
                return False
            raise
        return True

    def list(self, prefix: str = "") -> list[StoredFile]:
        paginator = self._client.get_paginator("list_objects_v2")
        pages = paginator.paginate(Bucket=self.bucket, Prefix=self._key(prefix))
        skip = len(self._key(""))
        items = self._call("list", prefix, _items_of, pages=pages)
        found = [
            StoredFile(item["Key"][skip:], int(item["Size"]), item["LastModified"].timestamp())
            for item in items
        ]
        return sorted(found, key=lambda f: f.name)

    def read_head(self, name: str, size: int) -> bytes:
        response = self._call(
            "read",
            name,
            self._client.get_object,
            Bucket=self.bucket,
            Key=self._key(name),
            Range=f"bytes=0-{max(size, 1) - 1}",
        )
        return bytes(self._call("read", name, response["Body"].read))

    def delete(self, name: str) -> None:
        self._call(
            "delete", name, self._client.delete_object, Bucket=self.bucket, Key=self._key(name)
        )

    def pending_uploads(self, prefix: str = "") -> builtins.list[PendingUpload]:
        """Multipart uploads under `prefix` that were never completed nor aborted."""
        paginator = self._client.get_paginator("list_multipart_uploads")
        pages = paginator.paginate(Bucket=self.bucket, Prefix=self._key(prefix))
        skip = len(self._key(""))
        uploads = self._call("list uploads of", prefix, _uploads_of, pages=pages)
        found = [
            PendingUpload(u["Key"][skip:], u["UploadId"], u["Initiated"].timestamp())
            for u in uploads
        ]
        return sorted(found, key=lambda u: (u.name, u.initiated_s))

    def abort_upload(self, upload: PendingUpload) -> None:
        """Abort a pending multipart upload; an unknown one (already gone) is no error."""
        try:
            self._call(
                "abort the upload of",
                upload.name,
                self._client.abort_multipart_upload,
                Bucket=self.bucket,
                Key=self._key(upload.name),
                UploadId=upload.upload_id,
            )
        except S3FileError as refused:
            if refused.status != 404:
                raise


class S3FileError(StagingError):
    """S3 answered a request with an error (status 0: no answer)."""

    def __init__(self, message: str, status: int, code: str) -> None:
        super().__init__(message)
        self.status = status
        self.code = code


def _items_of(pages: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    return [item for page in pages for item in page.get("Contents", [])]


def _uploads_of(pages: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    return [upload for page in pages for upload in page.get("Uploads", [])]


def _rebuild_s3(
    bucket: str, prefix: str, settings: S3Settings, threshold: int, concurrency: int
) -> S3FileSink:
    return S3FileSink(
        bucket, prefix, settings, multipart_threshold=threshold, max_concurrency=concurrency
    )


def open_file_sink(
    uri: str,
    s3: S3Settings | None = None,
    *,
    multipart_threshold: int = DEFAULT_MULTIPART_THRESHOLD,
) -> FileSink:
    """`s3://bucket/prefix`, `file:///path` or a plain path (option `path`)."""
    location = parse_location(uri, "files", ConfigError)
    if location.scheme == "s3":
        return S3FileSink(
            location.bucket, location.path, s3, multipart_threshold=multipart_threshold
        )
    return LocalFileSink(location.path)
