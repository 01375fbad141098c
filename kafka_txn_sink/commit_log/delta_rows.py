"""The rows of the Delta commit log (`delta_log.py`): its schema, and one row per record.

Each record is a row of its kind (the partition column) and batch id, with the record's exact
JSON in `record` and a few columns copied out of it for SQL readers. A batch's outcome key is
kind `decision` for round 0 and `decision_<round>` after it; it holds a decision or an abort
record (`messages.Abort`), whose JSON says which. A repair of a batch is kind `repair_<level>`,
and its completion `completion_<level>`.
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa

from kafka_txn_sink.commit_log.base import Record, check_round
from kafka_txn_sink.protocol.messages import Abort, Completion, Decision, Republish
from kafka_txn_sink.protocol.run_records import Owner, Release, SinkMeta

SINK, DECISION, COMPLETION = "sink", "decision", "completion"
OWNER, RELEASE = "owner", "release"
REPUBLISH, REPAIR = "republish", "repair"

PARTITION_COLUMNS = ["kind"]

_PARTICIPANT = pa.struct(
    [
        ("partition", pa.int32()),
        ("attempt", pa.int32()),
        ("transactional_id", pa.string()),
        ("producer_id", pa.int64()),
        ("producer_epoch", pa.int32()),
        ("rows", pa.int64()),
    ]
)

_LOST = pa.struct(
    [
        ("partition", pa.int32()),
        ("transactional_id", pa.string()),
        ("producer_id", pa.int64()),
        ("producer_epoch", pa.int32()),
        ("rows", pa.int64()),
        ("reason", pa.string()),
    ]
)

SCHEMA = pa.schema(
    [
        ("kind", pa.string()),
        ("batch_id", pa.int64()),
        ("sink_id", pa.string()),
        ("query_id", pa.string()),
        ("recorded_at_ms", pa.int64()),
        ("tasks", pa.int32()),
        ("rows", pa.int64()),
        ("participants", pa.list_(_PARTICIPANT)),
        ("lost", pa.list_(_LOST)),
        ("lost_rows", pa.int64()),
        ("format_version", pa.int32()),
        ("record", pa.string()),
    ]
)


def row_of(record: Record) -> tuple[str, int | None, pa.Table]:
    """(kind, batch id, row) of a record: put-if-absent keys on (kind, batch id)."""
    if isinstance(record, SinkMeta):
        return SINK, None, _sink_row(record)
    if isinstance(record, Decision):
        kind = repair_kind(record.level) if record.level else outcome_kind(record.round)
        return kind, record.batch_id, _decision_row(kind, record)
    if isinstance(record, Abort):
        return outcome_kind(record.round), record.batch_id, _abort_row(record)
    if isinstance(record, Completion):
        kind = completion_kind(record.level)
        return kind, record.batch_id, _completion_row(kind, record)
    if isinstance(record, Owner):
        return OWNER, record.run, _run_row(OWNER, record, record.started_at_ms)
    if isinstance(record, Release):
        return RELEASE, record.run, _run_row(RELEASE, record, record.released_at_ms)
    return republish_kind(record.round), record.batch_id, _republish_row(record)


def _sink_row(meta: SinkMeta) -> pa.Table:
    return _table(
        kind=SINK,
        sink_id=meta.sink_id,
        recorded_at_ms=meta.created_at_ms,
        format_version=meta.version,
        record=meta.to_json().decode(),
    )


def _decision_row(kind: str, decision: Decision) -> pa.Table:
    participants = [
        {
            "partition": p.partition,
            "attempt": p.attempt,
            "transactional_id": p.triple.transactional_id,
            "producer_id": p.triple.producer_id,
            "producer_epoch": p.triple.producer_epoch,
            "rows": p.rows,
        }
        for p in decision.participants
    ]
    return _table(
        kind=kind,
        batch_id=decision.batch_id,
        sink_id=decision.sink_id,
        query_id=decision.query_id,
        recorded_at_ms=decision.decided_at_ms,
        tasks=decision.tasks,
        rows=decision.rows,
        participants=participants,
        format_version=decision.version,
        record=decision.to_json().decode(),
    )


def _completion_row(kind: str, completion: Completion) -> pa.Table:
    lost = [
        {
            "partition": x.partition,
            "transactional_id": x.triple.transactional_id,
            "producer_id": x.triple.producer_id,
            "producer_epoch": x.triple.producer_epoch,
            "rows": x.rows,
            "reason": x.reason,
        }
        for x in completion.lost
    ]
    return _table(
        kind=kind,
        batch_id=completion.batch_id,
        sink_id=completion.sink_id,
        recorded_at_ms=completion.completed_at_ms,
        lost=lost,
        lost_rows=sum(x.rows for x in completion.lost),
        format_version=completion.version,
        record=completion.to_json().decode(),
    )


def _run_row(kind: str, record: Owner | Release, at_ms: int) -> pa.Table:
    return _table(
        kind=kind,
        batch_id=record.run,
        sink_id=record.sink_id,
        recorded_at_ms=at_ms,
        format_version=record.version,
        record=record.to_json().decode(),
    )


def _republish_row(republish: Republish) -> pa.Table:
    return _table(
        kind=republish_kind(republish.round),
        batch_id=republish.batch_id,
        sink_id=republish.sink_id,
        recorded_at_ms=republish.recorded_at_ms,
        rows=republish.references,
        format_version=republish.version,
        record=republish.to_json().decode(),
    )


def republish_kind(round_: int) -> str:
    """The kind of a republish round's row: `republish_<round>`."""
    check_round(round_)
    return f"{REPUBLISH}_{round_}"


def _abort_row(abort: Abort) -> pa.Table:
    return _table(
        kind=outcome_kind(abort.round),
        batch_id=abort.batch_id,
        sink_id=abort.sink_id,
        recorded_at_ms=abort.recorded_at_ms,
        format_version=abort.version,
        record=abort.to_json().decode(),
    )


def repair_kind(level: int) -> str:
    """The kind of a repair's row (protocol/repair.py): `repair_<level>`, level >= 1."""
    check_round(level - 1)
    return f"{REPAIR}_{level}"


def completion_kind(level: int) -> str:
    """The kind of a completion's row: `completion` for a decision, `completion_<level>` for
    a repair."""
    check_round(level)
    return COMPLETION if level == 0 else f"{COMPLETION}_{level}"


def outcome_kind(round_: int) -> str:
    """The kind of round `round_` of a batch's outcome key: `decision`, then `decision_<r>`."""
    check_round(round_)
    return DECISION if round_ == 0 else f"{DECISION}_{round_}"


def _table(**row: Any) -> pa.Table:
    return pa.Table.from_pylist([row], schema=SCHEMA)
