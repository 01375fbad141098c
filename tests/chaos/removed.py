"""The records a `gone` trial (retention.py) deleted with deleteRecords, read just before: the
oracle still counts the rows they carried. One file per batch, `<workdir>/removed/<batch>.json`."""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass

from kafka_txn_sink.testing.topics import Seen
from tests.chaos.bed import Sink


@dataclass(frozen=True)
class Removed:
    """A record deleteRecords removed, and whether read_committed consumers saw it."""

    topic: str
    record: Seen
    committed: bool


def save_removed(sink: Sink, batch: int, removed: list[Removed]) -> None:
    directory = sink.workdir / "removed"
    directory.mkdir(parents=True, exist_ok=True)
    rows = [
        {
            "topic": r.topic,
            "partition": r.record.partition,
            "offset": r.record.offset,
            "key": _b64(r.record.key),
            "value": _b64(r.record.value),
            "committed": r.committed,
        }
        for r in removed
    ]
    (directory / f"{batch}.json").write_text(json.dumps(rows))


def removed_records(sink: Sink, topic: str, committed_only: bool) -> list[Seen]:
    """The records of `topic` a `gone` trial deleted (those read_committed saw, or all)."""
    found = []
    for path in sorted((sink.workdir / "removed").glob("*.json")):
        for row in json.loads(path.read_text()):
            if row["topic"] == topic and (row["committed"] or not committed_only):
                found.append(
                    Seen(_unb64(row["key"]), _unb64(row["value"]), row["partition"], row["offset"])
                )
    return found


def _b64(data: bytes | None) -> str | None:
    return None if data is None else base64.b64encode(data).decode()


def _unb64(text: str | None) -> bytes | None:
    return None if text is None else base64.b64decode(text)
