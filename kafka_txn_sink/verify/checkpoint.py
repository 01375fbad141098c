"""The input range of a query, from its Spark checkpoint.

Spark writes `offsets/N` (the end offsets of batch N, one JSON line per source after a version
line and a metadata line) before it runs batch N, and `commits/N` once the sink committed it.
A Kafka source's line is `{"topic":{"0":123,...}}`: offsets one past the batch's last record.
`sources/<i>/0` holds where source `i` started (one NUL byte, `v1`, then the same JSON).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from kafka_txn_sink.errors import ConfigError, KafkaTxnSinkError
from kafka_txn_sink.storage import S3Settings, Storage, open_storage, parse_location
from kafka_txn_sink.verify.kafka import Offsets

_BATCH = re.compile(r"^(commits|offsets)/(\d+)$")
_SOURCE_START = re.compile(r"^sources/\d+/0$")


@dataclass(frozen=True)
class CheckpointRange:
    """Where the input ends (and, when Spark recorded it, starts) for the verified batches."""

    uri: str
    batch: int  # the input runs up to this batch's end offsets
    committed: int | None  # the newest batch in commits/
    end: Offsets
    start: Offsets
    notes: list[str] = field(default_factory=list)


def read_checkpoint(
    uri: str,
    topics: Sequence[str],
    s3: S3Settings | None = None,
    decided: Iterable[int] = (),
) -> CheckpointRange:
    """The end offsets of the newest batch that is committed: in Spark's `commits/`, or decided
    in the sink's commit log (`decided`) when Spark stopped before writing `commits/N`.

    Raises:
        ConfigError: no checkpoint at `uri`, no committed batch, or a topic it does not read.
    """
    parse_location(_as_s3(uri), "checkpoint", ConfigError)
    storage = open_storage(_as_s3(uri), s3)
    batches = _batches(storage, uri)
    committed = max(batches["commits"], default=None)
    decided_max = max(decided, default=None)
    notes: list[str] = []
    batch = committed
    if decided_max is not None and decided_max > (committed if committed is not None else -1):
        if decided_max in batches["offsets"]:
            batch = decided_max
            notes.append(
                f"batch {decided_max} is decided in the commit log but not in the checkpoint's "
                f"commits/ (the query stopped between the sink's commit and Spark's): its input "
                "is included"
            )
        else:
            notes.append(
                f"the commit log's newest decided batch {decided_max} has no offsets/"
                f"{decided_max} in the checkpoint: is --checkpoint the query's checkpointLocation?"
            )
    if batch is None:
        raise ConfigError(f"--checkpoint {uri}: no batch is committed yet (commits/ is empty)")
    end = _source_offsets(_text(storage, f"offsets/{batch}", uri), skip=2)
    _check_topics(end, topics, uri, f"offsets/{batch}")
    return CheckpointRange(uri, batch, committed, end, _starts(storage, topics), notes)


def newest_batch(uri: str, s3: S3Settings | None = None) -> int | None:
    """The newest batch in the checkpoint's `offsets/` (the batch about to run, in
    `streamWriter()`), None before the first."""
    batches = (_BATCH.match(n) for n in open_storage(_as_s3(uri), s3).list("offsets/"))
    return max((int(m.group(2)) for m in batches if m), default=None)


def batch_end_offsets(uri: str, batch_id: int, s3: S3Settings | None = None) -> Offsets:
    """The end offsets of batch `batch_id` of the query checkpointed at `uri`: every Kafka
    source's line of `offsets/<batch_id>`, which Spark writes before it runs the batch.

    Raises:
        ConfigError: the checkpoint has no such file, or the file names no Kafka topic.
    """
    storage = open_storage(_as_s3(uri), s3)
    name = f"offsets/{batch_id}"
    found = _source_offsets(_text(storage, name, uri), skip=2)
    if not found:
        raise ConfigError(
            f"checkpointLocation {uri}: {name} names no Kafka topic; option consumerGroup needs "
            f"a query that reads Kafka (Spark's kafka source)"
        )
    return found


def _as_s3(uri: str) -> str:
    # Spark names S3 `s3a://` (Hadoop's connector); boto3 reads the same objects.
    return "s3://" + uri[len("s3a://") :] if uri.lower().startswith("s3a://") else uri


def _batches(storage: Storage, uri: str) -> dict[str, set[int]]:
    found: dict[str, set[int]] = {"commits": set(), "offsets": set()}
    for prefix in found:
        for name in storage.list(f"{prefix}/"):
            match = _BATCH.match(name)
            if match:
                found[prefix].add(int(match.group(2)))
    if not found["offsets"]:
        raise ConfigError(
            f"--checkpoint {uri}: not a Spark streaming checkpoint (no offsets/ files); pass the "
            "query's checkpointLocation"
        )
    return found


def _text(storage: Storage, name: str, uri: str) -> str:
    data = storage.get(name)
    if data is None:
        raise ConfigError(f"checkpoint {uri}: {name} is missing")
    try:
        return data.lstrip(b"\0").decode()
    except UnicodeDecodeError as exc:
        raise KafkaTxnSinkError(f"--checkpoint {uri}: {name} is not text: {exc}") from exc


def _source_offsets(text: str, skip: int) -> Offsets:
    """Every Kafka source's offsets in the lines after the first `skip` ones."""
    found: Offsets = {}
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


def _check_topics(found: Offsets, topics: Sequence[str], uri: str, name: str) -> None:
    missing = [t for t in topics if t not in found]
    if missing:
        raise ConfigError(
            f"--input-topic {', '.join(missing)}: not read by the query of --checkpoint {uri} "
            f"({name} names {', '.join(sorted(found)) or 'no Kafka topic'})"
        )


def _starts(storage: Storage, topics: Sequence[str]) -> Offsets:
    """Where each topic's source started (negative: Kafka's earliest/latest markers, dropped)."""
    start: Offsets = {}
    for name in storage.list("sources/"):
        if not _SOURCE_START.match(name):
            continue
        data = storage.get(name)
        if data is None:
            continue
        text = data.lstrip(b"\0").decode(errors="replace")
        for topic, parts in _source_offsets(text, skip=1).items():
            if topic in topics:
                start[topic] = {p: o for p, o in parts.items() if o >= 0}
    return start
