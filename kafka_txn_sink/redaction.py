"""Which settings are secret, and their values kept out of every log record of the process.

kafka-python, at DEBUG, logs its whole configuration and the raw bytes of a SASL PLAIN
handshake, both holding the password. Rather than trust each library, the sink registers the
secret values it was given (`mask_in_logs`), and a log record factory masks them in every
record before any handler sees it, as text and as the escaped forms `repr` gives: its message,
its stack (`stack_info`) and its exception's traceback (`exc_info`, chained exceptions
included).

AWS MSK IAM tokens are masked by their shape (`_SHAPES`). A URL may carry credentials in its
user info (`https://user:password@host/`, which confluent-kafka's registry client takes as basic
auth): whatever the setting's name, they are masked in logs, and `redact` and `scrubbed` show
such a URL as `https://***@host/`.
"""

from __future__ import annotations

import logging
import re
import threading
import urllib.parse
from collections.abc import Callable, Mapping
from typing import Any

MASK = "***"
MIN_SECRET_LENGTH = 3  # shorter values would mask ordinary words; no real secret is this short

# "user.info" is the Schema Registry client's basic auth, user:password.
# "ssl.key.pem" is an inline private key; a key's location is a path, shown in errors.
_SECRET_HINTS = (
    "password",
    "secret",
    "jaas",
    "token",
    "ssl.key.pem",
    "ssl_key",
    "credentials",
    "user.info",
)

# Secrets known by their shape, whoever made them: AWS MSK IAM tokens (kafka/msk_iam_tokens.py),
# base64url of "https://kafka." and the presigned request's query, session token included. They
# are masked by shape rather than registered one by one: a query signs a new one every few
# minutes in every process.
_SHAPES = (re.compile(r"aHR0cHM6Ly9rYWZrYS[A-Za-z0-9_-]+"),)
# botocore's DEBUG records of the requests it signs and the answers it reads: a canonical request
# with its signature is a usable presigned URL, and STS answers hold new keys. Withheld whole.
_WITHHELD_LOGGERS = ("botocore.auth", "botocore.endpoint", "botocore.parsers")
WITHHELD = "(withheld by kafka_txn_sink: this DEBUG record may hold credentials)"

_lock = threading.Lock()
_secrets: tuple[str, ...] = ()  # every form of every secret, the longest first
_installed = False


def is_secret(key: str) -> bool:
    """Whether a setting's value must never be shown (passwords, keys, tokens)."""
    lowered = key.lower()
    return any(hint in lowered for hint in _SECRET_HINTS)


def redact(settings: Mapping[str, Any]) -> dict[str, Any]:
    """A copy that is safe to log or put in an error message: secret settings masked, and the
    user info of any URL in the others."""
    return {
        k: MASK if is_secret(k) else without_user_info(v) if isinstance(v, str) else v
        for k, v in settings.items()
    }


def without_user_info(text: str) -> str:
    """`text` with the user info of every URL in it masked: `https://***@host/`."""
    return _USER_INFO.sub(lambda found: f"{found['scheme']}{MASK}@", text)


def scrubbed(text: str) -> str:
    """`text` safe for an error message: URLs' user info and every secret registered with
    `mask_in_logs` masked (a library's exception text may quote either)."""
    return _masked(without_user_info(text))


def mask_in_logs(settings: Mapping[str, str]) -> None:
    """Mask in every log record from now on (this process) the value of each secret setting,
    and the credentials in any URL's user info in any setting's value."""
    values = [v for k, v in settings.items() if is_secret(k)]
    values += [secret for v in settings.values() for secret in _user_info_secrets(str(v))]
    _register({form for v in values if len(v) >= MIN_SECRET_LENGTH for form in _forms(v)})


# A URL's user info ends at the last "@" before its host; "," ends it too, as it separates the
# URLs of a list (`schema.registry.url`).
_USER_INFO = re.compile(r"(?P<scheme>\b[A-Za-z][A-Za-z0-9+.-]*://)(?P<info>[^/?#\s,]*)@")


def _user_info_secrets(text: str) -> set[str]:
    """The secrets in the user info of each URL in `text`: `user:password` and the password
    (or a user info without a password, a token), as written and percent-decoded."""
    found: set[str] = set()
    for info in (m["info"] for m in _USER_INFO.finditer(text)):
        _, colon, password = info.partition(":")
        for written in (info, password) if colon else (info,):
            found |= {written, urllib.parse.unquote(written)}
    return found - {""}


def _register(forms: set[str]) -> None:
    global _installed, _secrets
    with _lock:
        if forms <= set(_secrets):
            return
        _secrets = tuple(sorted(forms | set(_secrets), key=len, reverse=True))
        if not _installed:
            logging.setLogRecordFactory(_masking(logging.getLogRecordFactory()))
            _installed = True


def _forms(value: str) -> set[str]:
    """The value as logged as text, in a str's repr, in a bytes' repr and percent-encoded (as
    in a URL's query)."""
    return {
        value,
        repr(value)[1:-1],
        repr(value.encode())[2:-1],
        urllib.parse.quote(value, safe="-_.~"),
    }


def _masking(previous: Callable[..., logging.LogRecord]) -> Callable[..., logging.LogRecord]:
    def factory(*args: Any, **kwargs: Any) -> logging.LogRecord:
        record = previous(*args, **kwargs)
        if record.levelno <= logging.DEBUG and record.name in _WITHHELD_LOGGERS:
            record.msg, record.args = WITHHELD, None
        _mask_message(record)
        _mask_exception(record)
        if record.stack_info:
            record.stack_info = _masked(record.stack_info)
        return record

    return factory


def _masked(text: str) -> str:
    for secret in _secrets:
        text = text.replace(secret, MASK)
    for shape in _SHAPES:
        text = shape.sub(MASK, text)
    return text


def _mask_message(record: logging.LogRecord) -> None:
    try:
        message = record.getMessage()
    except Exception:  # a malformed record stays as it is; logging reports it itself
        return
    masked = _masked(message)
    if masked != message:
        record.msg, record.args = masked, None


def _mask_exception(record: logging.LogRecord) -> None:
    """A traceback holding a secret becomes the record's masked text (`exc_text`, which
    formatters print instead of formatting `exc_info` again), and the exception is dropped
    from the record so that no handler formats it unmasked."""
    if not record.exc_info or record.exc_info[0] is None:
        return
    text = _TRACEBACKS.formatException(record.exc_info)
    masked = _masked(text)
    if masked != text:
        record.exc_text, record.exc_info = masked, None


_TRACEBACKS = logging.Formatter()
