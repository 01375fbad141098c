"""What the commit log keeps, and what a task's message carries: small, versioned, JSON-able.

A task's `TaskCommit` (`task_commit.py`) travels from the executor to `commit()`. The driver turns
the prepared ones into `Participant`s of a `Decision`, which is written to the commit log before any
transaction is completed; a `Completion` follows once every participant's fate is settled.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields, replace
from typing import Any, Literal

from kafka_txn_sink.errors import CommitLogError
from kafka_txn_sink.protocol.stats import BatchStats, CompletionStats, read_stats

FORMAT_VERSION = 2  # 2: digests and repairs; a version-1 sink refuses such records as newer
# A decision with a progress participant (consumerGroup): a version-2 sink, which would end it
# in any order, refuses it as newer.
PROGRESS_FORMAT_VERSION = 3
# A decision with rows set aside in the dead-letter topic (option badRows=deadLetter): its
# participants count them, which a version-3 sink cannot read.
DEAD_LETTER_FORMAT_VERSION = 4
NEWEST_FORMAT_VERSION = DEAD_LETTER_FORMAT_VERSION
# The partition a progress participant takes in its decision: no Spark partition has it.
PROGRESS_PARTITION = -1

TaskStatus = Literal["prepared", "empty", "skipped"]

# topic -> partition -> [first offset, last offset] written by one transaction
OffsetRanges = dict[str, dict[int, tuple[int, int]]]
# topic -> partition -> the offset a consumer group reads next (Spark's end offset of a batch)
GroupOffsets = dict[str, dict[int, int]]


@dataclass(frozen=True)
class GroupProgress:
    """What a progress participant commits: `offsets` to consumer group `group`."""

    group: str
    offsets: GroupOffsets

    def to_json(self) -> dict[str, Any]:
        """The group and its offsets as JSON values (partitions as strings)."""
        return {
            "group": self.group,
            "offsets": {
                topic: {str(p): o for p, o in sorted(parts.items())}
                for topic, parts in sorted(self.offsets.items())
            },
        }

    @classmethod
    def from_json(cls, body: Mapping[str, Any]) -> GroupProgress:
        """The progress whose fields are `body`."""
        offsets = {
            str(topic): {int(p): int(o) for p, o in parts.items()}
            for topic, parts in body["offsets"].items()
        }
        return cls(str(body["group"]), offsets)


@dataclass(frozen=True)
class Triple:
    """Identifies one transaction: the broker checks exactly these three on EndTxn."""

    transactional_id: str
    producer_id: int
    producer_epoch: int

    def __str__(self) -> str:
        return f"{self.transactional_id}(pid={self.producer_id}, epoch={self.producer_epoch})"

    def to_json(self) -> dict[str, Any]:
        """The three fields as the commit log's records spell them, flat."""
        return {
            "transactional_id": self.transactional_id,
            "producer_id": self.producer_id,
            "producer_epoch": self.producer_epoch,
        }

    @classmethod
    def from_json(cls, body: Mapping[str, Any]) -> Triple:
        """The triple of a record that spells it flat (see `to_json`)."""
        return cls(
            str(body["transactional_id"]), int(body["producer_id"]), int(body["producer_epoch"])
        )


def now_ms() -> int:
    """Wall-clock milliseconds, as the records' `..._at_ms` fields and the brokers use them."""
    return int(time.time() * 1000)


@dataclass(frozen=True)
class FileRef:
    """One Avro file a task wrote (files mode); its reference message names the same facts."""

    location: str  # s3://bucket/key or an absolute local path
    partition_path: str  # Hive-style, e.g. user=ann/date=2026-11-21/hour=05
    partition_values: dict[str, str | None]
    records: int
    bytes: int
    schema_fingerprint: str

    def to_json(self) -> dict[str, Any]:
        """The fields as JSON values."""
        return asdict(self)

    @classmethod
    def from_json(cls, body: dict[str, Any]) -> FileRef:
        """The file reference whose fields are `body`."""
        return cls(**body)


@dataclass(frozen=True)
class SchemaUse:
    """A key or value schema of the Schema Registry the batch's records were written with."""

    column: str  # key or value
    format: str  # avro or json-schema
    subject: str
    schema_id: int

    def to_json(self) -> dict[str, Any]:
        """The fields as JSON values."""
        return asdict(self)

    @classmethod
    def from_json(cls, body: dict[str, Any]) -> SchemaUse:
        """The schema use whose fields are `body`."""
        return cls(
            str(body["column"]), str(body["format"]), str(body["subject"]), int(body["schema_id"])
        )


@dataclass(frozen=True)
class Participant:
    """A prepared transaction that a decision commits."""

    partition: int
    attempt: int
    triple: Triple
    rows: int
    offsets: OffsetRanges
    files: tuple[FileRef, ...] = ()
    # The records' digest (records/digest.py): what a repair matches a replayed task by.
    digest: str = ""
    # Set only on the progress participant (partition -1, no records): the group's offsets.
    progress: GroupProgress | None = None
    # Rows of its records that went to the dead-letter topic (option badRows=deadLetter).
    dead_lettered: int = 0

    @property
    def transactional_id(self) -> str:
        """The transactional id of the participant's transaction."""
        return self.triple.transactional_id

    def describe(self) -> str:
        """`Spark partition N`, or the progress transaction's group, as messages name it."""
        if self.progress is not None:
            return f"the progress of consumer group {self.progress.group}"
        return f"Spark partition {self.partition}"


@dataclass(frozen=True)
class Decision:
    """Batch `batch_id` commits exactly these participants. Written once, never changed."""

    sink_id: str
    query_id: str
    batch_id: int
    participants: tuple[Participant, ...]
    tasks: int
    rows: int
    decided_at_ms: int
    version: int = FORMAT_VERSION
    run: int | None = None  # the run (Owner.run) that decided; None before runs existed
    # The round of the batch's outcome key it holds: 0 unless abort records closed the rounds
    # before it (`Abort`).
    round: int = 0
    # A repair (protocol/repair.py) is a decision at `level` >= 1 of a decided batch: its
    # participants write again the lost transactions `repaired` names; `refused`: lost for good.
    level: int = 0
    repaired: tuple[Triple, ...] = ()
    refused: tuple[LostParticipant, ...] = ()
    schemas: tuple[SchemaUse, ...] = ()  # the registry's schemas of its records (serde/)
    stats: BatchStats | None = None  # what the batch cost (stats.py); None before stats existed

    def same_decision(self, other: Decision) -> bool:
        """Equal in everything but the time it was made and its cost: a repeated write of our
        own decision."""
        return (
            self.sink_id == other.sink_id
            and self.query_id == other.query_id
            and self.batch_id == other.batch_id
            and sorted(self.participants, key=_by_partition)
            == sorted(other.participants, key=_by_partition)
            and self.tasks == other.tasks
            and self.rows == other.rows
            and self.run == other.run
            and self.round == other.round
            and self.level == other.level
            and self.repaired == other.repaired
            and self.refused == other.refused
            and self.schemas == other.schemas
        )

    def output_ranges(self) -> OffsetRanges:
        """Per output partition, the smallest first and largest last offset of the batch."""
        merged: OffsetRanges = {}
        for participant in self.participants:
            for topic, parts in participant.offsets.items():
                for partition, (first, last) in parts.items():
                    seen = merged.setdefault(topic, {}).get(partition)
                    if seen is not None:
                        first, last = min(first, seen[0]), max(last, seen[1])
                    merged[topic][partition] = (first, last)
        return merged

    def to_json(self) -> bytes:
        """The record as the commit log stores it (sorted, compact JSON)."""
        # Field by field, not asdict(): its deep copy of every participant cost 40 ms of a
        # 128-task commit (measured).
        body = {f.name: getattr(self, f.name) for f in fields(self)}
        body["participants"] = [_participant_json(p) for p in self.participants]
        body["output"] = _offsets_json(self.output_ranges())
        if self.run is None:
            body.pop("run")  # a log written before runs existed keeps its records as they were
        if not self.round:
            body.pop("round")  # round 0: the record reads as it did before rounds existed
        for name in ("level", "repaired", "refused", "schemas", "stats"):
            body.pop(name)  # a decision reads as it did before repairs, schemas and stats existed
        if self.stats is not None:
            body["stats"] = self.stats.to_json()
        if self.schemas:
            body["schemas"] = [s.to_json() for s in self.schemas]
        if self.level:
            body["level"] = self.level
            body["repaired"] = [t.to_json() for t in self.repaired]
            body["refused"] = [_lost_json(x) for x in self.refused]
        return dump_record("repair" if self.level else "decision", body)

    @classmethod
    def from_json(cls, data: bytes) -> Decision:
        """The record stored as `data`.

        Raises:
            CommitLogError: `data` is not such a record, or from a newer format.
        """
        body = load_record(("decision", "repair"), data)
        try:
            return cls(
                sink_id=body["sink_id"],
                query_id=body["query_id"],
                batch_id=int(body["batch_id"]),
                participants=tuple(_participant_from(p) for p in body["participants"]),
                tasks=int(body["tasks"]),
                rows=int(body["rows"]),
                decided_at_ms=int(body["decided_at_ms"]),
                version=int(body["version"]),
                run=int(body["run"]) if body.get("run") is not None else None,
                round=int(body.get("round", 0)),
                level=int(body.get("level", 0)),
                repaired=tuple(Triple.from_json(t) for t in body.get("repaired", ())),
                refused=tuple(_lost_from(x) for x in body.get("refused", ())),
                schemas=tuple(SchemaUse.from_json(x) for x in body.get("schemas", ())),
                stats=read_stats(BatchStats.from_json, body.get("stats")),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise CommitLogError(f"malformed decision record: {exc!r}") from exc


@dataclass(frozen=True)
class Abort:
    """Round `round` of batch `batch_id` decides nothing: `abort()` wrote it put-if-absent at
    the key a decision of that round would take, before aborting `aborted`.

    A batch's outcome key is a register that `commit()` and `abort()` race for: whichever
    record lands there first is the round's outcome, so a decision write that timed out and
    lands later is refused, never half-applied. A batch run again decides at the next round.
    """

    sink_id: str
    batch_id: int
    round: int
    aborted: tuple[Triple, ...]
    recorded_at_ms: int
    run: int | None = None
    version: int = FORMAT_VERSION
    # The kind of error the batch's commit() raised (causes.py); None: it raised none.
    cause: str | None = None

    def to_json(self) -> bytes:
        """The record as the commit log stores it (sorted, compact JSON)."""
        body = {f.name: getattr(self, f.name) for f in fields(self)}
        body["aborted"] = [t.to_json() for t in self.aborted]
        if self.cause is None:
            body.pop("cause")  # the record reads as it did before causes existed
        return dump_record("abort", body)

    @classmethod
    def from_json(cls, data: bytes) -> Abort:
        """The record stored as `data`.

        Raises:
            CommitLogError: `data` is not such a record, or from a newer format.
        """
        body = load_record("abort", data)
        try:
            return cls(
                sink_id=body["sink_id"],
                batch_id=int(body["batch_id"]),
                round=int(body["round"]),
                aborted=tuple(Triple.from_json(t) for t in body["aborted"]),
                recorded_at_ms=int(body["recorded_at_ms"]),
                run=int(body["run"]) if body.get("run") is not None else None,
                version=int(body["version"]),
                cause=str(body["cause"]) if body.get("cause") is not None else None,
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise CommitLogError(f"malformed abort record: {exc!r}") from exc


Outcome = Decision | Abort
"""What one round of a batch's outcome key holds."""


def parse_outcome(data: bytes) -> Outcome:
    """The decision or abort record stored as `data`.

    Raises:
        CommitLogError: `data` is neither, or from a newer format.
    """
    try:
        kind = json.loads(data).get("kind")
    except (ValueError, AttributeError):
        kind = None
    return Abort.from_json(data) if kind == "abort" else Decision.from_json(data)


@dataclass(frozen=True)
class LostParticipant:
    """A decided transaction that the broker aborted before it could be committed."""

    triple: Triple
    partition: int
    rows: int
    offsets: OffsetRanges
    reason: str
    digest: str = ""  # its participant's: a replayed task with the same digest repairs it

    @property
    def transactional_id(self) -> str:
        """The transactional id of the lost transaction."""
        return self.triple.transactional_id


@dataclass(frozen=True)
class Republish:
    """Files mode: the references of `partitions` of batch `batch_id`, published once more.

    Written put-if-absent per (batch, round) after its transaction is prepared and before it
    is committed: round n+1 exists only if round n's transaction was aborted by the broker.
    """

    sink_id: str
    batch_id: int
    round: int
    partitions: tuple[int, ...]
    triple: Triple
    references: int
    offsets: OffsetRanges
    recorded_at_ms: int
    version: int = FORMAT_VERSION

    def same_republish(self, other: Republish) -> bool:
        """Equal in everything but the time it was recorded."""
        return replace(self, recorded_at_ms=0) == replace(other, recorded_at_ms=0)

    def to_json(self) -> bytes:
        """The record as the commit log stores it (sorted, compact JSON)."""
        body = {**_flat(asdict(self)), "offsets": _offsets_json(self.offsets)}
        body["partitions"] = list(self.partitions)
        return dump_record("republish", body)

    @classmethod
    def from_json(cls, data: bytes) -> Republish:
        """The record stored as `data`.

        Raises:
            CommitLogError: `data` is not such a record, or from a newer format.
        """
        body = load_record("republish", data)
        try:
            return cls(
                **{
                    **_nested(body),
                    "partitions": tuple(int(p) for p in body["partitions"]),
                    "offsets": _offsets_from(body["offsets"]),
                }
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise CommitLogError(f"malformed republish record: {exc!r}") from exc


@dataclass(frozen=True)
class Completion:
    """Every participant of batch `batch_id` is settled: committed, republished or `lost`.

    `republished` names the Spark partitions whose transactions the broker aborted but whose
    file references were published again (files mode); their records, if any, are in `lost`.
    """

    sink_id: str
    batch_id: int
    completed_at_ms: int
    lost: tuple[LostParticipant, ...] = ()
    version: int = FORMAT_VERSION
    republished: tuple[int, ...] = ()
    level: int = 0  # the level it settles: 0 the decision, >= 1 that repair
    stats: CompletionStats | None = None  # what completing cost (stats.py)

    def to_json(self) -> bytes:
        """The record as the commit log stores it (sorted, compact JSON)."""
        body = asdict(self)
        body["lost"] = [_lost_json(x) for x in self.lost]
        if self.stats is None:
            body.pop("stats")  # a completion reads as it did before stats existed
        if self.republished:
            body["republished"] = list(self.republished)
        else:
            body.pop("republished")  # records mode keeps its records as they were
        if not self.level:
            body.pop("level")
        return dump_record("completion", body)

    @classmethod
    def from_json(cls, data: bytes) -> Completion:
        """The record stored as `data`.

        Raises:
            CommitLogError: `data` is not such a record, or from a newer format.
        """
        body = load_record("completion", data)
        try:
            lost = tuple(_lost_from(x) for x in body.get("lost", []))
            return cls(
                sink_id=body["sink_id"],
                batch_id=int(body["batch_id"]),
                completed_at_ms=int(body["completed_at_ms"]),
                lost=lost,
                version=int(body["version"]),
                republished=tuple(int(p) for p in body.get("republished", ())),
                level=int(body.get("level", 0)),
                stats=read_stats(CompletionStats.from_json, body.get("stats")),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise CommitLogError(f"malformed completion record: {exc!r}") from exc


def format_version(participants: tuple[Participant, ...] | list[Participant]) -> int:
    """The oldest format a decision or repair of `participants` can be read in."""
    if any(p.dead_lettered for p in participants):
        return DEAD_LETTER_FORMAT_VERSION
    if any(p.progress is not None for p in participants):
        return PROGRESS_FORMAT_VERSION
    return FORMAT_VERSION


def _by_partition(participant: Participant) -> int:
    return participant.partition


def _participant_json(participant: Participant) -> dict[str, Any]:
    body = {
        "partition": participant.partition,
        "attempt": participant.attempt,
        **participant.triple.to_json(),
        "rows": participant.rows,
        "offsets": _offsets_json(participant.offsets),
    }
    if participant.files:  # records mode keeps its records as they were
        body["files"] = [f.to_json() for f in participant.files]
    if participant.digest:
        body["digest"] = participant.digest
    if participant.progress is not None:
        body["progress"] = participant.progress.to_json()
    if participant.dead_lettered:
        body["dead_lettered"] = participant.dead_lettered
    return body


def _lost_json(lost: LostParticipant) -> dict[str, Any]:
    body = {**_flat(asdict(lost)), "offsets": _offsets_json(lost.offsets)}
    if not lost.digest:
        body.pop("digest")
    return body


def _lost_from(body: dict[str, Any]) -> LostParticipant:
    return LostParticipant(**{**_nested(body), "offsets": _offsets_from(body["offsets"])})


def _participant_from(body: dict[str, Any]) -> Participant:
    files = tuple(FileRef.from_json(f) for f in body.get("files", ()))
    progress = GroupProgress.from_json(body["progress"]) if "progress" in body else None
    return Participant(
        **{
            **_nested(body),
            "offsets": _offsets_from(body["offsets"]),
            "files": files,
            "progress": progress,
        }
    )


_TRIPLE_FIELDS = ("transactional_id", "producer_id", "producer_epoch")


def _flat(body: dict[str, Any]) -> dict[str, Any]:
    """A record body with its `triple` spelt as three top-level fields, as logs store it."""
    flat = {k: v for k, v in body.items() if k != "triple"}
    flat.update(body["triple"])
    return flat


def _nested(body: Mapping[str, Any]) -> dict[str, Any]:
    """The inverse of `_flat`: the three fields gathered into one `Triple`."""
    nested = {k: v for k, v in body.items() if k not in _TRIPLE_FIELDS}
    nested["triple"] = Triple.from_json(body)
    return nested


def _offsets_json(offsets: OffsetRanges) -> dict[str, dict[str, list[int]]]:
    return {
        topic: {str(p): [first, last] for p, (first, last) in sorted(parts.items())}
        for topic, parts in sorted(offsets.items())
    }


def _offsets_from(body: dict[str, dict[str, list[int]]]) -> OffsetRanges:
    return {
        topic: {int(p): (int(r[0]), int(r[1])) for p, r in parts.items()}
        for topic, parts in body.items()
    }


def dump_record(kind: str, body: dict[str, Any]) -> bytes:
    """A record of `kind` as the commit log stores it: sorted, compact JSON."""
    return json.dumps({"kind": kind, **body}, sort_keys=True, separators=(",", ":")).encode()


def load_record(kinds: str | tuple[str, ...], data: bytes) -> dict[str, Any]:
    """The body of a stored record of one of `kinds`, checked for its kind and format version."""
    wanted = (kinds,) if isinstance(kinds, str) else kinds
    what = " or ".join(wanted)
    try:
        body = json.loads(data)
    except (ValueError, UnicodeDecodeError) as exc:
        raise CommitLogError(f"{what} record is not JSON: {exc}") from exc
    if not isinstance(body, dict) or body.get("kind") not in wanted:
        raise CommitLogError(f"expected a {what} record, found {str(body)[:200]!r}")
    kind = body["kind"]
    version = body.get("version")
    if not isinstance(version, int):
        raise CommitLogError(f"{kind} record has no valid format version: {version!r}")
    if version > NEWEST_FORMAT_VERSION:
        raise CommitLogError(
            f"{kind} record has format version {body.get('version')}, newer than this "
            f"kafka_txn_sink understands ({NEWEST_FORMAT_VERSION}); upgrade the package"
        )
    body.pop("kind")
    body.pop("output", None)
    return body
