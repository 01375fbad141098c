"""A consumer group's side of the sink: its committed offsets, its members, and what they say of
a progress transaction's fate.

A progress transaction (protocol/progress.py) has no records to read back, so its fate probe reads
the group instead: OffsetFetch with `require_stable`, which the group coordinator refuses
(UNSTABLE_OFFSET_COMMIT) while any transaction's offsets for those partitions are pending. Once
nothing is pending, the group holds the batch's end offsets (or later ones) exactly when the
transaction committed: the sink commits offsets only forward, one completed batch after another.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Mapping
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from typing import TYPE_CHECKING, Any, TypeVar

from confluent_kafka import IsolationLevel, KafkaError, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient, OffsetSpec

from kafka_txn_sink.errors import KafkaTxnSinkError, KafkaUnavailableError
from kafka_txn_sink.kafka.admin_api import Fate, FateAnswer
from kafka_txn_sink.kafka.permissions import group_permission, refused
from kafka_txn_sink.protocol.messages import GroupOffsets, GroupProgress

if TYPE_CHECKING:  # kafka-python is loaded once a client is made, not by this module
    from kafka_txn_sink.kafka.txn_admin import OffsetsAnswer, TxnAdmin

# What the group coordinator answers while offsets of an open transaction are pending.
_PENDING = (KafkaError.UNSTABLE_OFFSET_COMMIT, KafkaError._TIMED_OUT, KafkaError.REQUEST_TIMED_OUT)
_COORDINATOR_NOT_READY = (
    KafkaError.NOT_COORDINATOR,
    KafkaError.COORDINATOR_NOT_AVAILABLE,
    KafkaError.COORDINATOR_LOAD_IN_PROGRESS,
)
_STALE_LEADER_EPOCH = (KafkaError.FENCED_LEADER_EPOCH, KafkaError.UNKNOWN_LEADER_EPOCH)
# No answer: a coordinator that shut down refuses connections until the group has moved.
_NO_ANSWER = (KafkaError._TIMED_OUT, KafkaError.REQUEST_TIMED_OUT)
_LEADER_MOVING = (
    KafkaError.NOT_LEADER_FOR_PARTITION,
    KafkaError.LEADER_NOT_AVAILABLE,
    KafkaError.UNKNOWN_TOPIC_OR_PART,
    KafkaError._TIMED_OUT,
    *_STALE_LEADER_EPOCH,
)
COORDINATOR_RETRY_S = 0.2
_T = TypeVar("_T")


class GroupRefused(Exception):
    """The group coordinator answered with an error that is not a pending transaction."""

    def __init__(self, error: KafkaError):
        super().__init__(error.str())
        self.error = error


def fetch_offsets(
    client: TxnAdmin,
    group: str,
    partitions: GroupOffsets | None,
    timeout_s: float,
    *,
    stable: bool,
) -> GroupOffsets:
    """The group's committed offsets for `partitions` (None: every partition it has), leaving out
    partitions without one. Asked through kafka-python, not librdkafka's AdminClient: that one
    crashes the process when a moving group coordinator answers NOT_COORDINATOR. A coordinator
    that moves, loads or does not answer is asked again (found anew) up to `timeout_s`.

    Raises:
        GroupRefused: the coordinator refused (with `stable`: offsets of an open transaction are
            pending, among others), or did not answer.
    """
    answer = _retried(
        lambda: _offset_fetch(client, group, partitions, timeout_s, stable),
        timeout_s,
        _COORDINATOR_NOT_READY + _NO_ANSWER,
    )
    found: GroupOffsets = {}
    for topic, partition, offset, error in answer.partitions:
        if error:
            raise GroupRefused(_broker_error(error))
        if offset >= 0:
            found.setdefault(topic, {})[partition] = offset
    return found


def _offset_fetch(
    client: TxnAdmin, group: str, partitions: GroupOffsets | None, timeout_s: float, stable: bool
) -> OffsetsAnswer:
    """One OffsetFetch; a refusal of the whole group, or no answer, as `GroupRefused`."""
    import kafka.errors as kafka_errors

    try:
        answer = client.fetch_group_offsets(group, partitions, stable, timeout_s)
    except kafka_errors.KafkaError as exc:
        code = getattr(exc, "errno", None)
        if isinstance(code, int):
            raise GroupRefused(_broker_error(code)) from exc
        raise GroupRefused(
            KafkaError(KafkaError._TIMED_OUT, f"no answer: {type(exc).__name__}: {exc}")
        ) from exc
    if answer.error:
        raise GroupRefused(_broker_error(answer.error))
    return answer


def _broker_error(code: int) -> KafkaError:
    """A broker's error code as librdkafka's KafkaError (the same protocol codes)."""
    import kafka.errors as kafka_errors

    return KafkaError(code, f"Broker: {kafka_errors.for_code(code).description}")


def settled_offsets(
    client: TxnAdmin, group: str, partitions: GroupOffsets, timeout_s: float
) -> GroupOffsets:
    """The group's committed offsets of `partitions`, asked again while a transaction's offsets
    for any of them are pending (their commit markers are being written), up to `timeout_s`.
    Named partitions, not all: the coordinator checks pending offsets only of the partitions
    asked for, and asking for all skips those with no committed offset yet.

    Raises:
        GroupRefused: the coordinator refused, or offsets were still pending at the deadline.
    """
    return _retried(
        lambda: fetch_offsets(client, group, partitions, timeout_s, stable=True),
        timeout_s,
        (KafkaError.UNSTABLE_OFFSET_COMMIT,),
    )


def progress_fate(client: TxnAdmin, progress: GroupProgress, timeout_s: float) -> FateAnswer:
    """What the group says of the progress transaction that committed `progress`: OPEN while
    its offsets (or another transaction's) are pending or the coordinator does not answer."""
    try:
        held = fetch_offsets(client, progress.group, progress.offsets, timeout_s, stable=True)
    except GroupRefused as exc:
        if exc.error.code() in _PENDING:
            return FateAnswer(Fate.OPEN, f"group {progress.group}: {exc.error.str()}")
        raise
    behind = [
        f"{t}[{p}] at {held.get(t, {}).get(p, 'none')} < {o}"
        for t, parts in sorted(progress.offsets.items())
        for p, o in sorted(parts.items())
        if held.get(t, {}).get(p, -1) < o
    ]
    if behind:
        return FateAnswer(
            Fate.ABORTED,
            f"group {progress.group} is stable and behind the batch: {', '.join(behind)}",
        )
    return FateAnswer(Fate.COMMITTED, f"group {progress.group} holds the batch's end offsets")


def log_ends(
    admin: AdminClient, offsets: GroupOffsets, timeout_s: float, stable: bool = False
) -> GroupOffsets:
    """The end offset (high watermark; with `stable`, the last stable offset, below which no
    transaction is open) of each partition `offsets` names, asked again while a partition's
    leader moves (or is not known yet, on a new topic), up to `timeout_s`.

    Raises:
        GroupRefused: a partition's end could not be read.
    """
    wanted = {
        TopicPartition(topic, partition): OffsetSpec.latest()
        for topic, parts in offsets.items()
        for partition in parts
    }

    def ask() -> GroupOffsets:
        ends: GroupOffsets = {}
        try:
            # Without it, the brokers answer the high watermark (READ_UNCOMMITTED).
            stably = {"isolation_level": IsolationLevel.READ_COMMITTED} if stable else {}
            asked = admin.list_offsets(wanted, request_timeout=timeout_s, **stably)
            for tp, future in asked.items():
                ends.setdefault(tp.topic, {})[tp.partition] = _result(future, timeout_s).offset
        except GroupRefused as exc:
            if exc.error.code() in _STALE_LEADER_EPOCH:
                # librdkafka asks again with the leader epoch it cached, which stays fenced
                # until its metadata is refreshed (every 5 minutes by default): refresh it now.
                with contextlib.suppress(KafkaException):  # the next ask reports any failure
                    for topic in offsets:
                        admin.list_topics(topic=topic, timeout=timeout_s)
            raise
        return ends

    return _retried(ask, timeout_s, _LEADER_MOVING)


def active_members(admin: AdminClient, group: str, timeout_s: float) -> int:
    """How many members the group has now (0 for a group that does not exist yet).

    Raises:
        GroupRefused: the coordinator refused to describe it.
    """
    description = _retried(
        lambda: _result(
            admin.describe_consumer_groups([group], request_timeout=timeout_s)[group], timeout_s
        ),
        timeout_s,
        _COORDINATOR_NOT_READY,
    )
    return len(description.members or ())


def _retried(ask: Callable[[], _T], timeout_s: float, retry: tuple[int, ...]) -> _T:
    """`ask()`, asked again while it is refused with an error of `retry` (a coordinator or a
    leader moving, loading, or not known yet: a new cluster creates its offsets topic on the
    first group request), up to `timeout_s`.

    Raises:
        GroupRefused: any other error, or one of `retry` still at the deadline.
    """
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return ask()
        except GroupRefused as exc:
            if exc.error.code() not in retry or time.monotonic() >= deadline:
                raise
        time.sleep(COORDINATOR_RETRY_S)


def _result(future: Future[Any], timeout_s: float) -> Any:
    """The future's answer; a refusal or no answer as `GroupRefused`."""
    try:
        return future.result(timeout=timeout_s + 5)
    except FutureTimeout as exc:
        raise GroupRefused(KafkaError(KafkaError._TIMED_OUT, "no answer")) from exc
    except KafkaException as exc:
        raise GroupRefused(exc.args[0]) from exc


def group_error(
    exc: GroupRefused, group: str, kafka: Mapping[str, str], step: str, operation: str = "Read"
) -> KafkaTxnSinkError:
    """The error for a refused group request: a denial names `operation` on the group."""
    error = exc.error
    denial = refused(error.code(), error.str(), kafka, step, group_permission(operation, group))
    pending = (
        " (a transaction's offsets for the group are pending: a batch is being committed; "
        "ask again)"
        if error.code() == KafkaError.UNSTABLE_OFFSET_COMMIT
        else ""
    )
    return denial or KafkaUnavailableError(f"{step} failed: {error.str()}{pending}")


def as_starting_offsets(offsets: GroupOffsets) -> dict[str, Any]:
    """The offsets as Spark's Kafka source takes them in `startingOffsets` (JSON keys)."""
    return {
        topic: {str(p): o for p, o in sorted(parts.items())}
        for topic, parts in sorted(offsets.items())
    }
