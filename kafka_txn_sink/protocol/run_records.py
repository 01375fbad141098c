"""The commit log's records of who writes to it: the sink it belongs to (`SinkMeta`), each run
of the query that took it over (`Owner`), and each run that let it go (`Release`). Runs and
their slots are protocol/runs.py's; the batches' records are messages.py's.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass

from kafka_txn_sink.errors import CommitLogError
from kafka_txn_sink.protocol.messages import FORMAT_VERSION, dump_record, load_record


@dataclass(frozen=True)
class SinkMeta:
    """Written once when the commit log is created: which sink the log belongs to."""

    sink_id: str
    created_at_ms: int
    version: int = FORMAT_VERSION

    def to_json(self) -> bytes:
        """The record as the commit log stores it (sorted, compact JSON)."""
        return dump_record("sink", asdict(self))

    @classmethod
    def from_json(cls, data: bytes) -> SinkMeta:
        """The record stored as `data`.

        Raises:
            CommitLogError: `data` is not such a record, or from a newer format.
        """
        body = load_record("sink", data)
        try:
            return cls(
                sink_id=body["sink_id"],
                created_at_ms=int(body["created_at_ms"]),
                version=int(body["version"]),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise CommitLogError(f"malformed sink record: {exc!r}") from exc


@dataclass(frozen=True)
class Owner:
    """Run `run` of the sink's query took it over, using transactional-id slot `slot`.

    Runs are numbered 0, 1, 2... in the order they were recorded (put-if-absent per number), so
    the highest number is the current owner. `driver` names the driver process (host, pid,
    start time) for messages and for finding a driver's own run again.
    """

    sink_id: str
    run: int
    slot: int
    driver: str
    started_at_ms: int
    version: int = FORMAT_VERSION

    def to_json(self) -> bytes:
        """The record as the commit log stores it (sorted, compact JSON)."""
        return dump_record("owner", asdict(self))

    @classmethod
    def from_json(cls, data: bytes) -> Owner:
        """The record stored as `data`.

        Raises:
            CommitLogError: `data` is not such a record, or from a newer format.
        """
        body = load_record("owner", data)
        try:
            return cls(
                sink_id=body["sink_id"],
                run=int(body["run"]),
                slot=int(body["slot"]),
                driver=str(body["driver"]),
                started_at_ms=int(body["started_at_ms"]),
                version=int(body["version"]),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise CommitLogError(f"malformed owner record: {exc!r}") from exc

    def describe(self) -> str:
        """How messages name the run: number, slot, driver and start time."""
        started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(self.started_at_ms / 1000))
        return f"run {self.run} (driver {self.driver}, slot {self.slot}, started {started})"


@dataclass(frozen=True)
class Release:
    """Run `run` stopped between batches (superseded, or its batch write done): its slot is
    free for the next run."""

    sink_id: str
    run: int
    released_at_ms: int
    version: int = FORMAT_VERSION

    def to_json(self) -> bytes:
        """The record as the commit log stores it (sorted, compact JSON)."""
        return dump_record("release", asdict(self))

    @classmethod
    def from_json(cls, data: bytes) -> Release:
        """The record stored as `data`.

        Raises:
            CommitLogError: `data` is not such a record, or from a newer format.
        """
        body = load_record("release", data)
        try:
            return cls(
                sink_id=body["sink_id"],
                run=int(body["run"]),
                released_at_ms=int(body["released_at_ms"]),
                version=int(body["version"]),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise CommitLogError(f"malformed release record: {exc!r}") from exc
