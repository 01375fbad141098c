"""Spark's streaming checkpoint, as far as the sink reads it: the end offsets of a batch.

Spark writes `offsets/N` (the end offsets of batch N, one JSON line per source after a version
line and a metadata line) before it runs batch N, and `commits/N` once the sink committed it.
A Kafka source's line is `{"topic":{"0":123,...}}`: offsets one past the batch's last record.
Option consumerGroup commits these offsets (protocol/progress.py); the verifier bounds its input
range with them (verify/checkpoint.py).
"""

from __future__ import annotations

import json
import re
from typing import Any

from kafka_txn_sink.errors import ConfigError, KafkaTxnSinkError
from kafka_txn_sink.protocol.messages import GroupOffsets
from kafka_txn_sink.storage import S3Settings, Storage, open_storage, parse_location

BATCH_FILE = re.compile(r"^(commits|offsets)/(\d+)$")
_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]+:")


def newest_batch(uri: str, s3: S3Settings | None = None) -> int | None:
    """The newest batch in the checkpoint's `offsets/` (the batch about to run, in
    `streamWriter()`), None before the first."""
    batches = (BATCH_FILE.match(n) for n in _storage(uri, s3).list("offsets/"))
    return max((int(m.group(2)) for m in batches if m), default=None)


def batch_end_offsets(uri: str, batch_id: int, s3: S3Settings | None = None) -> GroupOffsets:
    """The end offsets of batch `batch_id` of the query checkpointed at `uri`: every Kafka
    source's line of `offsets/<batch_id>`, which Spark writes before it runs the batch.

    Raises:
        ConfigError: the checkpoint has no such file, or the file names no Kafka topic.
    """
    storage = _storage(uri, s3)
    name = f"offsets/{batch_id}"
    found = source_offsets(read_text(storage, name, uri), skip=2)
    if not found:
        raise ConfigError(
            f"checkpointLocation {uri}: {name} names no Kafka topic; option consumerGroup needs "
            f"a query that reads Kafka (Spark's kafka source)"
        )
    return found


def _storage(uri: str, s3: S3Settings | None) -> Storage:
    """The checkpoint's files; a location the sink cannot read is named as the option."""
    location = as_s3(uri)
    if location.lower().startswith("file:") and not location.lower().startswith("file://"):
        location = location[len("file:") :]  # Hadoop's file:/path
    elif _SCHEME.match(location) and not location.lower().startswith(("s3://", "file://")):
        raise ConfigError(
            f"checkpointLocation {uri!r}: the sink reads Spark's offsets from a local path, "
            f"file:// or s3:// (s3a://) only"
        )
    parse_location(location, "checkpointLocation", ConfigError)
    return open_storage(location, s3)


def as_s3(uri: str) -> str:
    """`s3a://` (Spark's name for S3, from Hadoop's connector) as `s3://`, which boto3 reads."""
    return "s3://" + uri[len("s3a://") :] if uri.lower().startswith("s3a://") else uri


def read_text(storage: Storage, name: str, uri: str) -> str:
    """The text of checkpoint file `name` (leading NUL bytes dropped).

    Raises:
        ConfigError: the file is missing.
        KafkaTxnSinkError: it is not text.
    """
    data = storage.get(name)
    if data is None:
        raise ConfigError(f"checkpoint {uri}: {name} is missing")
    try:
        return data.lstrip(b"\0").decode()
    except UnicodeDecodeError as exc:
        raise KafkaTxnSinkError(f"checkpoint {uri}: {name} is not text: {exc}") from exc


def source_offsets(text: str, skip: int) -> GroupOffsets:
    """Every Kafka source's offsets in the lines after the first `skip` ones."""
    found: GroupOffsets = {}
    for line in text.splitlines()[skip:]:
        try:
            body: Any = json.loads(line)
        except ValueError:
            continue  # another kind of source, e.g. "-" for one without offsets
        if not isinstance(body, dict):
            continue
        for topic, parts in body.items():
            if isinstance(parts, dict) and all(
                str(p).isdigit() and isinstance(o, int) for p, o in parts.items()
            ):
                found.setdefault(topic, {}).update({int(p): int(o) for p, o in parts.items()})
    return found
