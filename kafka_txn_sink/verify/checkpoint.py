"""The input range of a query, from its Spark checkpoint (spark_checkpoint.py reads its files).

`sources/<i>/0` holds where source `i` started (one NUL byte, `v1`, then the same JSON as
`offsets/N`).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from kafka_txn_sink.errors import ConfigError
from kafka_txn_sink.spark_checkpoint import BATCH_FILE, as_s3, read_text, source_offsets
from kafka_txn_sink.storage import S3Settings, Storage, open_storage, parse_location
from kafka_txn_sink.verify.kafka import Offsets

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
    parse_location(as_s3(uri), "checkpoint", ConfigError)
    storage = open_storage(as_s3(uri), s3)
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
    end = source_offsets(read_text(storage, f"offsets/{batch}", uri), skip=2)
    _check_topics(end, topics, uri, f"offsets/{batch}")
    return CheckpointRange(uri, batch, committed, end, _starts(storage, topics), notes)


def _batches(storage: Storage, uri: str) -> dict[str, set[int]]:
    found: dict[str, set[int]] = {"commits": set(), "offsets": set()}
    for prefix in found:
        for name in storage.list(f"{prefix}/"):
            match = BATCH_FILE.match(name)
            if match:
                found[prefix].add(int(match.group(2)))
    if not found["offsets"]:
        raise ConfigError(
            f"--checkpoint {uri}: not a Spark streaming checkpoint (no offsets/ files); pass the "
            "query's checkpointLocation"
        )
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
        for topic, parts in source_offsets(text, skip=1).items():
            if topic in topics:
                start[topic] = {p: o for p, o in parts.items() if o >= 0}
    return start
