"""Why a batch was aborted, for its abort record: the kind of error its `commit()` raised.

Spark calls `abort()` after a failed `commit()` without saying why, and runs each in its own
short-lived Python worker on the driver. So `commit()` leaves the error's kind (its class name,
never its message: a message may carry what a user passed in) in a small file on the driver's
disk, and `abort()` of the same batch takes it into its abort record (`Abort.cause`). Best
effort: a cause that is not found, or not written, makes the record say `None` (the tasks
failed, or Spark stopped the batch, before any decision was attempted). Nothing reads it but
the metrics; the protocol never does.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import tempfile
from pathlib import Path

from kafka_txn_sink.errors import KafkaTxnSinkError

OTHER = "other"  # an error that is not the sink's own (a bug, an interrupted driver)
_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_]{0,99}$")


def cause_of(exc: BaseException) -> str:
    """The kind of `exc` an abort record keeps: the sink's error class, else `other`."""
    return type(exc).__name__ if isinstance(exc, KafkaTxnSinkError) else OTHER


def leave(sink_id: str, batch_id: int, exc: BaseException) -> None:
    """Leave the kind of the error `commit()` of `batch_id` raised for its `abort()`."""
    with contextlib.suppress(OSError):
        path = _path(sink_id, batch_id)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(cause_of(exc))


def take(sink_id: str, batch_id: int) -> str | None:
    """The kind `commit()` of `batch_id` left (removed once taken), or None."""
    path = _path(sink_id, batch_id)
    try:
        found = path.read_text().strip()
        path.unlink()
    except OSError:
        return None
    return found if _NAME.match(found) else None


def _path(sink_id: str, batch_id: int) -> Path:
    # A hash of the sink id: the same sink id from any user maps to one file name, and the
    # folder is per user (tempfile's, with the uid), so one user cannot leave causes for another.
    key = hashlib.sha256(f"{sink_id}\0{batch_id}".encode()).hexdigest()[:32]
    return Path(tempfile.gettempdir()) / f"kafka_txn_sink-causes-{os.getuid()}" / key
