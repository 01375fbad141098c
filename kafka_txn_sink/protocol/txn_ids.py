"""Transactional ids of a sink: `{sinkId}-{slot}-{partition}`, a bounded pool reused every batch.

Each run of the query (runs.py) takes one of `SLOTS` slots, so two runs alive at once (a job
retry beside a frozen driver) never share an id: one run's tasks cannot fence the other's
transactions. The brokers know at most SLOTS x partitions ids of a sink, however often it
restarts. Logs written before slots existed used `{sinkId}-{partition}` (slot None here).

Recovery has one more, `{sinkId}-republish`, for publishing again the file references of a
decided batch whose transactions the broker aborted (files mode). A query with `consumerGroup`
has one more per slot, `{sinkId}-{slot}-g`: the driver's progress transaction, which commits the
batch's input offsets to the group beside its output (progress.py). With the group on another
cluster, that cluster knows one id of the sink, `{sinkId}-group` (progress_across.py), outside
this pattern: the output's clean-up never touches it. Sink ids have no '-', so no id of one sink
is ever an id of another.
"""

from __future__ import annotations

import re

from kafka_txn_sink.errors import ConfigError

_SINK_ID = re.compile(r"^[A-Za-z0-9._]{1,200}$")
REPUBLISH = "republish"
PROGRESS = "g"
GROUP = "group"
# Runs that may hold ids at once; the model (model/README.md) needs at least 2.
SLOTS = 4


def validate_sink_id(sink_id: str) -> str:
    """Return the sink id if it is usable as a transactional id prefix.

    Raises:
        ConfigError: empty, too long, or with characters other than letters, digits, '.', '_'.
    """
    if not _SINK_ID.match(sink_id or ""):
        raise ConfigError(
            f"option sinkId must be 1-200 letters, digits, '.' or '_' (it prefixes the "
            f"transactional ids), got {sink_id!r}"
        )
    return sink_id


def transactional_id(sink_id: str, partition: int, *, slot: int) -> str:
    """The id of Spark partition `partition`'s transactions in slot `slot`:
    `{sinkId}-{slot}-{partition}`."""
    if partition < 0 or not 0 <= slot < SLOTS:
        raise ValueError(f"need partition >= 0 and 0 <= slot < {SLOTS}, got {partition}, {slot}")
    return f"{sink_id}-{slot}-{partition}"


def progress_id(sink_id: str, *, slot: int) -> str:
    """The id of the progress transactions of the run holding slot `slot`: `{sinkId}-{slot}-g`."""
    if not 0 <= slot < SLOTS:
        raise ValueError(f"need 0 <= slot < {SLOTS}, got {slot}")
    return f"{sink_id}-{slot}-{PROGRESS}"


def group_id(sink_id: str) -> str:
    """The id of the sink's commits to a consumer group on another cluster: `{sinkId}-group`."""
    return f"{sink_id}-{GROUP}"


def republish_id(sink_id: str) -> str:
    """The id of the republish transactions: `{sinkId}-republish`."""
    return f"{sink_id}-{REPUBLISH}"


def id_pattern(sink_id: str) -> re.Pattern[str]:
    """Matches exactly this sink's ids, never those of a sink whose id merely shares a prefix."""
    return re.compile(
        rf"^{re.escape(sink_id)}-(?:(?:([0-9]+)-)?([0-9]+)|([0-9]+)-{PROGRESS}|{REPUBLISH})$"
    )


def owns(sink_id: str, txn_id: str) -> bool:
    """Whether `txn_id` is one of this sink's ids."""
    return id_pattern(sink_id).match(txn_id) is not None


def partition_of(sink_id: str, txn_id: str) -> int:
    """The Spark partition of a task id of this sink.

    Raises:
        ValueError: `txn_id` is not a task id of this sink.
    """
    return _task_id_parts(sink_id, txn_id)[1]


def slot_of(sink_id: str, txn_id: str) -> int | None:
    """The slot of a task or progress id of this sink; None for an id from before slots existed.

    Raises:
        ValueError: `txn_id` is neither a task id nor a progress id of this sink.
    """
    match = id_pattern(sink_id).match(txn_id)
    if match is not None and match.group(3) is not None:
        return int(match.group(3))
    return _task_id_parts(sink_id, txn_id)[0]


def _task_id_parts(sink_id: str, txn_id: str) -> tuple[int | None, int]:
    match = id_pattern(sink_id).match(txn_id)
    if match is None or match.group(2) is None:
        raise ValueError(f"{txn_id!r} is not a transactional id of sink {sink_id!r}")
    slot = match.group(1)
    return (int(slot) if slot is not None else None), int(match.group(2))
