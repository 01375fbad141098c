"""Why a batch was aborted, for its abort record: the kind of error its `commit()` raised.

Spark calls `abort()` after a failed `commit()` without saying why, and runs each in its own
short-lived Python worker on the driver. So `commit()` leaves the error's kind (its class name,
never its message: a message may carry what a user passed in) in a small file on the driver's
disk, and `abort()` of the same batch in the same run takes it into its abort record
(`Abort.cause`). Best effort: a cause that is not found, or not written, makes the record say
`None` (the tasks failed, or Spark stopped the batch, before any decision was attempted).
Nothing reads it but the metrics; the protocol never does.

The files live in a folder of the user's own (mode 0700, checked to be theirs and not a link)
and are opened without following links, so another user of the machine can neither plant a
cause nor make a write land elsewhere.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import stat
import tempfile
from pathlib import Path

from kafka_txn_sink.errors import KafkaTxnSinkError

OTHER = "other"  # an error that is not the sink's own (a bug, an interrupted driver)
_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_]{0,99}")
_MOST = 200  # bytes read back: a class name is shorter


def cause_of(exc: BaseException) -> str:
    """The kind of `exc` an abort record keeps: the sink's error class, else `other`."""
    return type(exc).__name__ if isinstance(exc, KafkaTxnSinkError) else OTHER


def leave(sink_id: str, run: int, batch_id: int, exc: BaseException) -> None:
    """Leave the kind of the error `commit()` of `batch_id` in run `run` raised for its
    `abort()`."""
    folder = _folder()
    if folder is None:
        return
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW
    with contextlib.suppress(OSError):
        descriptor = os.open(folder / _key(sink_id, run, batch_id), flags, 0o600)
        with os.fdopen(descriptor, "w") as out:
            out.write(cause_of(exc))


def take(sink_id: str, run: int, batch_id: int) -> str | None:
    """The kind `commit()` of `batch_id` in run `run` left (removed once taken), or None."""
    folder = _folder()
    if folder is None:
        return None
    path = folder / _key(sink_id, run, batch_id)
    try:
        descriptor = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
        with os.fdopen(descriptor) as found:
            text = found.read(_MOST).strip()
        path.unlink()
    except OSError:
        return None
    return text if _NAME.fullmatch(text) else None


def _folder() -> Path | None:
    """The user's folder of causes, made if need be; None unless it is a real folder of this
    user's that no one else may enter."""
    folder = Path(tempfile.gettempdir()) / f"kafka_txn_sink-causes-{os.getuid()}"
    try:
        folder.mkdir(mode=0o700, exist_ok=True)
        found = os.lstat(folder)
        if not stat.S_ISDIR(found.st_mode) or found.st_uid != os.getuid():
            return None
        if found.st_mode & 0o077:  # ours, but others may enter: close it before any use
            os.chmod(folder, 0o700, follow_symlinks=False)
    except OSError:
        return None
    return folder


def _key(sink_id: str, run: int, batch_id: int) -> str:
    return hashlib.sha256(f"{sink_id}\0{run}\0{batch_id}".encode()).hexdigest()[:32]
