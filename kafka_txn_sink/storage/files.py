"""Where files mode puts its files: the `FileSink` interface, and a local directory.

An S3 prefix is `s3.S3FileSink`; `kafka_txn_sink.storage.open_file_sink` opens either.

Names are relative to the sink's root and use `/` (`user=ann/date=2026-11-21/part-...avro`).
A file becomes visible whole or not at all: locally through a temporary name in the target
directory and `os.replace`, on S3 because a PUT or a completed multipart upload is atomic.
Every failure is a StagingError naming the bucket or path, never a credential.
"""

from __future__ import annotations

import errno
import os
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from kafka_txn_sink.errors import StagingError
from kafka_txn_sink.files.naming import TEMP_PREFIX, temp_name
from kafka_txn_sink.storage.local import fsync_path, make_dirs, unlink_quietly

MiB = 1024 * 1024
DEFAULT_MULTIPART_THRESHOLD = 64 * MiB


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
    def uri(self) -> str:
        """The root, as messages name it."""
        ...

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
        """The absolute root path."""
        return str(self.root)

    def location(self, name: str) -> str:
        """The absolute path of `name`."""
        return str(self._path(name))

    def upload(self, local: Path, name: str) -> str:
        """Rename `local` to `name` (a copy and a rename across file systems)."""
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
        """A hard link of a complete temporary file; False if `name` exists."""
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
        """Every file whose name starts with `prefix`, temporary ones included, by name."""
        directory = prefix.rpartition("/")[0]
        found = [
            f for f in self._walk(self.root / directory, directory) if f.name.startswith(prefix)
        ]
        return sorted(found, key=lambda f: f.name)

    def read_head(self, name: str, size: int) -> bytes:
        """The first `size` bytes of `name`."""
        path = self._path(name)
        try:
            with path.open("rb") as stored:
                return stored.read(size)
        except OSError as exc:
            raise StagingError(f"cannot read {path}: {exc}") from exc

    def delete(self, name: str) -> None:
        """Remove `name` (a temporary file too); a missing file is no error."""
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
            p in ("", ".", "..") or (p.startswith(TEMP_PREFIX) and not allow_temp) for p in parts
        ):
            raise StagingError(f"invalid file name {name!r} under {self.root}")
        return self.root.joinpath(*parts)

    def _temp_for(self, final: Path) -> Path:
        self._make_dirs(final.parent)
        # Same directory, so os.replace stays on one file system and is atomic.
        return final.with_name(temp_name(final.name))

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
