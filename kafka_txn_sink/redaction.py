"""Secret values kept out of every log record of the process, whoever logs them.

kafka-python, at DEBUG, logs its whole configuration and the raw bytes of a SASL PLAIN
handshake, both holding the password. Rather than trust each library, the sink registers the
secret values it was given (`mask_in_logs`), and a log record factory masks them in every
record's message before any handler sees it, as text and as the escaped forms `repr` gives.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable
from typing import Any

MASK = "***"
MIN_SECRET_LENGTH = 3  # shorter values would mask ordinary words; no real secret is this short

_lock = threading.Lock()
_secrets: set[str] = set()
_installed = False


def mask_in_logs(values: Iterable[str]) -> None:
    """Mask each of `values` in every log record from now on (in this process)."""
    global _installed
    forms = {form for value in values if len(value) >= MIN_SECRET_LENGTH for form in _forms(value)}
    if not forms:
        return
    with _lock:
        _secrets.update(forms)
        if not _installed:
            logging.setLogRecordFactory(_masking(logging.getLogRecordFactory()))
            _installed = True


def _forms(value: str) -> set[str]:
    """The value as logged as text, in a str's repr and in a bytes' repr."""
    return {value, repr(value)[1:-1], repr(value.encode())[2:-1]}


def _masking(previous: Callable[..., logging.LogRecord]) -> Callable[..., logging.LogRecord]:
    def factory(*args: Any, **kwargs: Any) -> logging.LogRecord:
        record = previous(*args, **kwargs)
        secrets = sorted(_secrets, key=len, reverse=True)  # a longer form first
        try:
            message = record.getMessage()
        except Exception:  # a malformed record stays as it is; logging reports it itself
            return record
        masked = message
        for secret in secrets:
            masked = masked.replace(secret, MASK)
        if masked != message:
            record.msg, record.args = masked, None
        return record

    return factory
