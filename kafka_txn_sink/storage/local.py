"""A commit log's objects in a local (or mounted) directory, and the file system helpers
files mode shares.

`put_if_absent` is a hard link of a fully written, fsynced temporary file: an `O_EXCL` create
followed by a write could leave an empty record after a crash. The final name never holds a
partial record, and an existing record is never replaced.
"""

from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import Iterator
from pathlib import Path

from kafka_txn_sink.errors import CommitLogError

_TEMP_PREFIX = "."


class LocalStorage:
    """A directory on a local (or mounted) file system."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root).absolute()

    def __repr__(self) -> str:
        return f"LocalStorage({str(self.root)!r})"

    @property
    def uri(self) -> str:
        """`file:///absolute/root`."""
        return self.root.as_uri()

    def put_if_absent(self, name: str, data: bytes) -> bool:
        """A hard link of a complete, fsynced temporary file; False if `name` exists."""
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
        """The file's bytes, or None if it does not exist."""
        path = self._path(name)
        try:
            return path.read_bytes()
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise CommitLogError(f"cannot read {path}: {exc}") from exc

    def exists(self, name: str) -> bool:
        """Whether `name` is a file."""
        return self._path(name).is_file()

    def put(self, name: str, data: bytes) -> None:
        """Plain overwrite (`os.replace` of a temporary file): only for best-effort data."""
        final = self._path(name)
        self._make_dirs(final.parent)
        temp = self._write_temp(final, data)
        try:
            os.replace(temp, final)
        except OSError as exc:
            unlink_quietly(temp)
            raise CommitLogError(f"cannot write {final}: {exc}") from exc

    def list(self, prefix: str, start_after: str | None = None) -> list[str]:
        """Every name starting with `prefix` and sorting after `start_after`, sorted; left-over
        temporary files are skipped."""
        directory, _, _ = prefix.rpartition("/")
        names = (
            name
            for name in self._walk(self.root / directory, directory)
            if name.startswith(prefix) and (start_after is None or name > start_after)
        )
        return sorted(names)

    def delete(self, name: str) -> None:
        """Remove `name`; a missing file is no error."""
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
    """Remove `path` if it can be removed; clean-up that must not hide the error being handled."""
    with contextlib.suppress(OSError):
        path.unlink()
