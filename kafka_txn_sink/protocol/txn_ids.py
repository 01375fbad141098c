"""Transactional ids of a sink: `{sinkId}-{partition}`, a bounded pool reused every batch.

Recovery has one more, `{sinkId}-republish`, for publishing again the file references of a
decided batch whose transactions the broker aborted (files mode). Sink ids have no '-', so no
id of one sink is ever an id of another.
"""

from __future__ import annotations

import re

from kafka_txn_sink.errors import ConfigError

_SINK_ID = re.compile(r"^[A-Za-z0-9._]{1,200}$")
REPUBLISH = "republish"


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


def transactional_id(sink_id: str, partition: int) -> str:
    """The id of Spark partition `partition`'s transactions: `{sinkId}-{partition}`."""
    if partition < 0:
        raise ValueError(f"partition must be >= 0, got {partition}")
    return f"{sink_id}-{partition}"


def republish_id(sink_id: str) -> str:
    """The id of the republish transactions: `{sinkId}-republish`."""
    return f"{sink_id}-{REPUBLISH}"


def id_pattern(sink_id: str) -> re.Pattern[str]:
    """Matches exactly this sink's ids, never those of a sink whose id merely shares a prefix."""
    return re.compile(rf"^{re.escape(sink_id)}-([0-9]+|{REPUBLISH})$")


def owns(sink_id: str, txn_id: str) -> bool:
    """Whether `txn_id` is one of this sink's ids."""
    return id_pattern(sink_id).match(txn_id) is not None


def partition_of(sink_id: str, txn_id: str) -> int:
    """The Spark partition of a task id of this sink.

    Raises:
        ValueError: `txn_id` is not a task id of this sink.
    """
    if not owns(sink_id, txn_id) or txn_id == republish_id(sink_id):
        raise ValueError(f"{txn_id!r} is not a transactional id of sink {sink_id!r}")
    return int(txn_id.rsplit("-", 1)[1])
