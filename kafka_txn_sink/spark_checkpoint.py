"""Spark's streaming checkpoint, as far as the sink reads it: the end offsets of a batch, and
whether the checkpoint is older than the commit log (`check_not_behind`).

Spark writes `offsets/N` (the end offsets of batch N, one JSON line per source after a version
line and a metadata line) before it runs batch N, and `commits/N` once the sink committed it.
A Kafka source's line is `{"topic":{"0":123,...}}`: offsets one past the batch's last record.
Option consumerGroup commits these offsets (protocol/progress.py); the verifier bounds its input
range with them (verify/checkpoint.py).
"""

from __future__ import annotations

import json
import logging
import re
from typing import Any

from kafka_txn_sink.errors import ConfigError, KafkaTxnSinkError
from kafka_txn_sink.protocol.messages import GroupOffsets
from kafka_txn_sink.storage import S3Settings, Storage, open_storage, parse_location

log = logging.getLogger(__name__)

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


def check_not_behind(
    uri: str, log_query_id: str | None, last_decided: int | None, s3: S3Settings | None
) -> None:
    """Refuse a checkpoint older than the commit log: a copy of the query's checkpoint
    restored from before its last decided batch. Spark would plan the batches after the copy's
    newest anew, with other input ranges, and the tasks would skip every one the log decided:
    their new rows lost, silently. In `streamWriter()` the checkpoint's newest `offsets/N` is
    the batch about to run, which is never below the log's last decided batch of the same query.

    Raises:
        ConfigError: the checkpoint's newest batch is below the log's last decided one.
    """
    if last_decided is None or not log_query_id:
        return
    try:
        query_id = checkpoint_query_id(uri, s3)
        newest = newest_batch(uri, s3)
    except (KafkaTxnSinkError, OSError, ValueError) as exc:
        # A location the sink does not read (abfss://, dbfs:/...), or one it may not: the
        # check is a guard beside the protocol, and needs no permission the sink did not.
        log.info("checkpointLocation %s not compared with the commit log: %s", uri, exc)
        return
    if query_id != log_query_id:
        return  # another query's checkpoint: the tasks' query-id check refuses it
    if newest is not None and newest >= last_decided:
        return
    raise ConfigError(
        f"checkpointLocation {uri} is older than the sink's commit log: its newest batch is "
        f"{'none' if newest is None else newest}, but the log decided batch {last_decided} of "
        f"the same query ({log_query_id}). A copy of the checkpoint from before that batch was "
        f"restored; running it would plan the decided batches again with other input and skip "
        f"their rows. Restore the checkpoint as it was after batch {last_decided}, or start "
        f"over with a new checkpointLocation, sinkId and commitLog"
    )


def checkpoint_query_id(uri: str, s3: S3Settings | None) -> str | None:
    """The query id in the checkpoint's `metadata` file, None without one."""
    storage = _storage(uri, s3)
    if not storage.exists("metadata"):
        return None
    body = json.loads(read_text(storage, "metadata", uri))
    found = body.get("id") if isinstance(body, dict) else None
    return str(found) if found else None
