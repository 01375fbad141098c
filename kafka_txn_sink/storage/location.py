"""The locations users give: `s3://bucket/prefix`, `file:///path` or a plain local path."""

from __future__ import annotations

import re
from dataclasses import dataclass
from urllib.parse import unquote, urlparse

from kafka_txn_sink.errors import CommitLogError

_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")


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
