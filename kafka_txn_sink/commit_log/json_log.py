"""The commit log as small JSON objects in a directory or an S3 prefix.

Layout under the root:

    _sink.json                          which sink the log belongs to (SinkMeta)
    decisions/00000000000000000042.json batch 42 commits these participants (Decision), or
                                        round 0 of batch 42 decides nothing (Abort)
    decisions/00000000000000000042-001.json  round 1 of batch 42's outcome, after an Abort
    completions/00000000000000000042.json every participant of batch 42 is settled (Completion)
    republish/00000000000000000042-000.json references of batch 42 published again (Republish)
    repairs/00000000000000000042-001.json   rows of batch 42 written again, level 1 (a Decision)
    completions/00000000000000000042-001.json  that repair is settled (Completion, level 1)
    owners/00000000000000000003.json    run 3 of the query took the sink over (Owner)
    releases/00000000000000000003.json  run 3 stopped and freed its id slot (Release)
    _hints/last_completed.json          a batch id at or below which everything is complete

Records are created put-if-absent and never overwritten. The hint is only an optimisation that
spares listing a long log from the start; it is written with a plain overwrite, and a missing,
unparsable or dangling hint just means listing from the start.
"""

from __future__ import annotations

import json
import logging
import re
import threading
from collections.abc import Callable
from typing import Any, TypeVar

from kafka_txn_sink.commit_log.base import (
    CommitLogBase,
    Record,
    check_batch_id,
    check_round,
    parse_record,
    parser_of,
)
from kafka_txn_sink.errors import CommitLogError
from kafka_txn_sink.protocol.messages import (
    Abort,
    Completion,
    Decision,
    Outcome,
    Republish,
    parse_outcome,
)
from kafka_txn_sink.protocol.run_records import Owner, Release, SinkMeta
from kafka_txn_sink.storage import Storage

log = logging.getLogger(__name__)

T = TypeVar("T")
L = TypeVar("L", Completion, Decision)  # the records kept per (batch, level)

SINK = "_sink.json"
DECISIONS = "decisions/"
COMPLETIONS = "completions/"
REPUBLISH = "republish/"
REPAIRS = "repairs/"
OWNERS = "owners/"
RELEASES = "releases/"
HINT = "_hints/last_completed.json"

_BATCH_NAME = re.compile(r"^(\d{20})(?:-\d{3,})?\.json$")

# Records kept parsed, by name, with the bytes they were parsed from. A decision of 128
# participants takes about 1.2 ms to parse, and every commit reads the previous one back.
PARSED_KEPT = 8


class JsonCommitLog(CommitLogBase):
    """One JSON object per record, on any `Storage` with put-if-absent."""

    def __init__(self, storage: Storage, *, recent: int = 20) -> None:
        self.storage = storage
        self.recent = recent
        self._parsed: dict[str, tuple[bytes, Any]] = {}
        self._parsed_lock = threading.Lock()

    def __repr__(self) -> str:
        return f"JsonCommitLog({self.uri!r})"

    @property
    def uri(self) -> str:
        """The storage's root."""
        return self.storage.uri

    def sink_meta(self) -> SinkMeta | None:
        """The claim in `_sink.json`, or None."""
        return self._read(SINK, SinkMeta.from_json)

    def outcome(self, batch_id: int, round_: int) -> Outcome | None:
        """The decision or abort at round `round_` of `batch_id`, or None."""
        name = outcome_name(batch_id, round_)
        found = self._read(name, parse_outcome)
        if found is not None and (found.batch_id, found.round) != (batch_id, round_):
            raise CommitLogError(
                f"{self.uri}/{name} holds the {type(found).__name__.lower()} of batch "
                f"{found.batch_id} (round {found.round})"
            )
        return found

    def completion(self, batch_id: int, level: int = 0) -> Completion | None:
        """The completion marker of `batch_id`'s decision (or of its repair `level`), or None."""
        name = completion_name(batch_id, level)
        return self._leveled(name, Completion.from_json, batch_id, level)

    def repair(self, batch_id: int, level: int) -> Decision | None:
        """The repair of `batch_id` at `level`, or None."""
        return self._leveled(repair_name(batch_id, level), Decision.from_json, batch_id, level)

    def _leveled(
        self, name: str, parse: Callable[[bytes], L], batch_id: int, level: int
    ) -> L | None:
        """The record at `name`, checked to be `batch_id`'s at `level`, or None."""
        found = self._read(name, parse)
        if found is not None and (found.batch_id, found.level) != (batch_id, level):
            raise CommitLogError(
                f"{self.uri}/{name} holds a record of batch {found.batch_id} (level {found.level})"
            )
        return found

    def republish(self, batch_id: int, round_: int) -> Republish | None:
        """Round `round_` of `batch_id`'s republishing, or None."""
        found = self._read(republish_name(batch_id, round_), Republish.from_json)
        if found is not None and (found.batch_id, found.round) != (batch_id, round_):
            raise CommitLogError(
                f"{self.uri}/{republish_name(batch_id, round_)} holds round {found.round} of "
                f"batch {found.batch_id}"
            )
        return found

    def owners(self) -> list[Owner]:
        """Every owner record, by run number ascending."""
        found = (self._read(_batch_name(OWNERS, r), Owner.from_json) for r in self._runs())
        return [owner for owner in found if owner is not None]

    def latest_run(self) -> int | None:
        """The highest run number with an owner record (listed, not read), or None."""
        return max(self._runs(), default=None)

    def latest_owner(self) -> Owner | None:
        """The owner record of the highest run number (one listing, one read), or None."""
        latest = self.latest_run()
        return None if latest is None else self._read(_batch_name(OWNERS, latest), Owner.from_json)

    def released_runs(self) -> set[int]:
        """The run numbers with a release record (listed, not read)."""
        return set(self._batches(RELEASES, None))

    def _runs(self) -> list[int]:
        return self._batches(OWNERS, None)

    def _outcome_batches(self, after: int | None) -> list[int]:
        return self._batches(DECISIONS, after)

    def latest_decision(self) -> Decision | None:
        """The highest decision, listing only above the hint when there is a usable one."""
        hint = self.last_completed_hint()
        found = self._highest_decision(self._outcome_batches(hint))
        if found is None and hint is not None:
            found = self.decision(hint)
            if found is None:
                # A completion without its decision: the hint cannot be trusted, list everything.
                found = self._highest_decision(self._outcome_batches(None))
        return found

    def incomplete_batches(self) -> list[int]:
        """Decided batches without a completion marker, above the hint, ascending."""
        hint = self.last_completed_hint()
        completed = set(self._batches(COMPLETIONS, hint))
        return [b for b in self.decided_batches(after=hint) if b not in completed]

    def last_completed_hint(self) -> int | None:
        """The hinted batch id if it is usable: parsable, and that batch really is complete."""
        try:
            data = self.storage.get(HINT)
            batch_id = _parse_hint(data) if data is not None else None
            if batch_id is None or not self.storage.exists(completion_name(batch_id)):
                return None
        except CommitLogError as exc:
            log.warning("ignoring the commit log hint of %s: %s", self.uri, exc)
            return None
        return batch_id

    def write_hint(self, batch_id: int) -> None:
        """Best effort: tell later readers that every batch up to `batch_id` is complete."""
        body = {"kind": "hint", "last_completed": batch_id, "version": 1}
        try:
            self.storage.put(HINT, json.dumps(body, sort_keys=True).encode())
        except Exception as exc:
            log.warning("could not write the commit log hint of %s: %s", self.uri, exc)

    def _put(self, record: Record) -> Record | None:
        name = _name_of(record)
        data = record.to_json()
        if self.storage.put_if_absent(name, data):
            self._keep_parsed(name, data, record)
            return None
        return self._read_existing(name, parser_of(record))

    def _recent_decisions(self) -> list[Decision]:
        latest = self.latest_decision()
        if latest is None:
            return []
        return self.decisions(after=latest.batch_id - self.recent)

    def _batches(self, prefix: str, after: int | None) -> list[int]:
        if after is not None and after < 0:
            after = None
        start_after = _batch_name(prefix, after) if after is not None else None
        ids = (_batch_of(name, prefix) for name in self.storage.list(prefix, start_after))
        return sorted({b for b in ids if b is not None and (after is None or b > after)})

    def _read(self, name: str, parse: Callable[[bytes], T]) -> T | None:
        data = self.storage.get(name)
        return None if data is None else self._parse(name, data, parse)

    def _read_existing(self, name: str, parse: Callable[[bytes], T]) -> T:
        """Read back a record that put-if-absent found; never overwrite it, whatever it holds."""
        data = self.storage.get(name)
        if data is None:
            raise CommitLogError(
                f"{self.uri}/{name} exists but could not be read back; nothing was overwritten"
            )
        return self._parse(name, data, parse)

    def _parse(self, name: str, data: bytes, parse: Callable[[bytes], T]) -> T:
        if not data:
            raise CommitLogError(
                f"{self.uri}/{name} is empty; it was not written by kafka_txn_sink's put-if-absent "
                "and is left as it is: inspect it and restore it by hand"
            )
        with self._parsed_lock:
            kept = self._parsed.get(name)
        if kept is not None and kept[0] == data:
            parsed: T = kept[1]  # parsed from these very bytes, so the same record
            return parsed
        parsed = parse_record(f"{self.uri}/{name}", data, parse)
        self._keep_parsed(name, data, parsed)
        return parsed

    def _keep_parsed(self, name: str, data: bytes, record: object) -> None:
        with self._parsed_lock:
            self._parsed.pop(name, None)
            self._parsed[name] = (data, record)
            while len(self._parsed) > PARSED_KEPT:
                del self._parsed[next(iter(self._parsed))]


def decision_name(batch_id: int) -> str:
    """`decisions/<batch:020d>.json`: round 0 of the batch's outcome key."""
    return _batch_name(DECISIONS, batch_id)


def outcome_name(batch_id: int, round_: int) -> str:
    """`decisions/<batch:020d>.json` for round 0, `decisions/<batch:020d>-<round:03d>.json`
    after it."""
    check_round(round_)
    name = _batch_name(DECISIONS, batch_id)
    return name if round_ == 0 else f"{name[:-5]}-{round_:03d}.json"


def completion_name(batch_id: int, level: int = 0) -> str:
    """`completions/<batch:020d>.json`; `completions/<batch:020d>-<level:03d>.json` for the
    completion of a repair."""
    return _leveled(COMPLETIONS, batch_id, level)


def repair_name(batch_id: int, level: int) -> str:
    """`repairs/<batch:020d>-<level:03d>.json`, level >= 1."""
    check_round(level - 1)
    return _leveled(REPAIRS, batch_id, level)


def _leveled(prefix: str, batch_id: int, level: int) -> str:
    check_round(level)
    name = _batch_name(prefix, batch_id)
    return name if level == 0 else f"{name[:-5]}-{level:03d}.json"


def republish_name(batch_id: int, round_: int) -> str:
    """`republish/<batch:020d>-<round:03d>.json`."""
    check_round(round_)
    return f"{_batch_name(REPUBLISH, batch_id)[:-5]}-{round_:03d}.json"


def _name_of(record: Record) -> str:
    if isinstance(record, SinkMeta):
        return SINK
    if isinstance(record, Decision) and record.level:
        return repair_name(record.batch_id, record.level)
    if isinstance(record, Decision | Abort):
        return outcome_name(record.batch_id, record.round)
    if isinstance(record, Completion):
        return completion_name(record.batch_id, record.level)
    if isinstance(record, Owner):
        return _batch_name(OWNERS, record.run)
    if isinstance(record, Release):
        return _batch_name(RELEASES, record.run)
    return republish_name(record.batch_id, record.round)


def _batch_name(prefix: str, batch_id: int) -> str:
    check_batch_id(batch_id)
    return f"{prefix}{batch_id:020d}.json"


def _batch_of(name: str, prefix: str) -> int | None:
    match = _BATCH_NAME.match(name[len(prefix) :])
    return int(match.group(1)) if match else None


def _parse_hint(data: bytes) -> int | None:
    try:
        body = json.loads(data)
        batch_id = body["last_completed"] if isinstance(body, dict) else None
    except (ValueError, KeyError):
        return None
    return batch_id if isinstance(batch_id, int) and batch_id >= 0 else None
