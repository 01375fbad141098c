"""How the sink reads a group's offsets (kafka/groups.py): answers and refusals of the group
coordinator as the callers see them. The requests themselves meet real brokers in
tests/integration/test_group_*.py and tests/e2e/test_coordinator_failover.py."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import Future
from types import SimpleNamespace
from typing import Any

import kafka.errors as kafka_errors
import pytest
from confluent_kafka import KafkaError, KafkaException

from kafka_txn_sink.errors import PermissionDeniedError
from kafka_txn_sink.kafka import groups
from kafka_txn_sink.kafka.txn_admin import OffsetsAnswer


class Coordinator:
    """Answers OffsetFetch from a script: an OffsetsAnswer, or an exception to raise."""

    def __init__(self, *script: OffsetsAnswer | Exception) -> None:
        self._script: Iterator[OffsetsAnswer | Exception] = iter(script)
        self.asked: list[tuple[Any, ...]] = []

    def fetch_group_offsets(self, group: str, partitions: Any, stable: bool,
                            timeout_s: float) -> OffsetsAnswer:
        self.asked.append((group, partitions, stable))
        step = next(self._script)
        if isinstance(step, Exception):
            raise step
        return step


HELD = OffsetsAnswer(0, [("in", 0, 5, 0), ("in", 1, -1, 0), ("in", 2, 7, 0)])


@pytest.fixture(autouse=True)
def quick_retries(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(groups, "COORDINATOR_RETRY_S", 0.0)


def test_partitions_without_a_committed_offset_are_left_out() -> None:
    coordinator = Coordinator(HELD)
    wanted = {"in": {0: 0, 1: 0, 2: 0}}
    assert groups.fetch_offsets(coordinator, "g", wanted, 5, stable=True) == {"in": {0: 5, 2: 7}}
    assert coordinator.asked == [("g", wanted, True)]


@pytest.mark.parametrize("moving", [KafkaError.NOT_COORDINATOR,
                                    KafkaError.COORDINATOR_LOAD_IN_PROGRESS,
                                    KafkaError.COORDINATOR_NOT_AVAILABLE])
def test_a_coordinator_that_moves_is_asked_again(moving: int) -> None:
    coordinator = Coordinator(OffsetsAnswer(moving, []), kafka_errors.for_code(moving)(), HELD)
    assert groups.fetch_offsets(coordinator, "g", None, 5, stable=True) == {"in": {0: 5, 2: 7}}
    assert len(coordinator.asked) == 3


def test_a_coordinator_still_moving_at_the_deadline_is_a_refusal() -> None:
    coordinator = Coordinator(*[OffsetsAnswer(KafkaError.NOT_COORDINATOR, [])] * 1000)
    with pytest.raises(groups.GroupRefused) as refused:
        groups.fetch_offsets(coordinator, "g", None, 0.05, stable=True)
    assert refused.value.error.code() == KafkaError.NOT_COORDINATOR


def test_pending_offsets_read_as_an_open_progress_transaction() -> None:
    pending = OffsetsAnswer(0, [("in", 0, -1, KafkaError.UNSTABLE_OFFSET_COMMIT)])
    with pytest.raises(groups.GroupRefused) as refused:
        groups.fetch_offsets(Coordinator(pending), "g", {"in": {0: 0}}, 5, stable=True)
    assert refused.value.error.code() == KafkaError.UNSTABLE_OFFSET_COMMIT
    assert "unstable offsets" in refused.value.error.str()


def test_a_coordinator_that_does_not_answer_is_asked_again() -> None:
    # A coordinator shut down refuses connections until the group has moved to another broker.
    refused = kafka_errors.KafkaConnectionError("111 ECONNREFUSED")
    coordinator = Coordinator(refused, kafka_errors.KafkaTimeoutError("timed out"), HELD)
    assert groups.fetch_offsets(coordinator, "g", None, 5, stable=True) == {"in": {0: 5, 2: 7}}


def test_no_answer_until_the_deadline_is_a_timeout_never_an_offset() -> None:
    coordinator = Coordinator(*[kafka_errors.KafkaTimeoutError("request timed out")] * 1000)
    with pytest.raises(groups.GroupRefused) as refused:
        groups.fetch_offsets(coordinator, "g", None, 0.05, stable=True)
    assert refused.value.error.code() == KafkaError._TIMED_OUT
    assert "KafkaTimeoutError" in refused.value.error.str()


def test_a_denied_group_names_the_permission() -> None:
    coordinator = Coordinator(OffsetsAnswer(KafkaError.GROUP_AUTHORIZATION_FAILED, []))
    with pytest.raises(groups.GroupRefused) as refused:
        groups.fetch_offsets(coordinator, "g", None, 5, stable=True)
    error = groups.group_error(refused.value, "g", {}, "reading group g")
    assert isinstance(error, PermissionDeniedError)
    assert "refused Read on group 'g'" in str(error)
    assert "--operation Read --group 'g'" in str(error)


class Ends:
    """Answers ListOffsets from a script: a broker error code, or the end offset."""

    def __init__(self, *script: int | None) -> None:
        self._script = iter(script)
        self.refreshed: list[str] = []

    def list_topics(self, topic: str, timeout: float) -> None:
        self.refreshed.append(topic)

    def list_offsets(self, wanted: dict[Any, Any], request_timeout: float) -> dict[Any, Any]:
        code = next(self._script)
        answers: dict[Any, Any] = {}
        for tp in wanted:
            future: Future[Any] = Future()
            if code is None:
                future.set_result(SimpleNamespace(offset=42))
            else:
                future.set_exception(KafkaException(KafkaError(code, "moving")))
            answers[tp] = future
        return answers


@pytest.mark.parametrize("moving", [KafkaError.NOT_LEADER_FOR_PARTITION,
                                    KafkaError.FENCED_LEADER_EPOCH,
                                    KafkaError.UNKNOWN_LEADER_EPOCH])
def test_a_leader_that_moves_is_asked_again_for_the_end(moving: int) -> None:
    # Seen while a node of three shut down: "Leader epoch is older than broker epoch", again and
    # again until librdkafka's metadata was refreshed.
    admin = Ends(moving, None)
    assert groups.log_ends(admin, {"in": {0: 1}}, 5) == {"in": {0: 42}}  # type: ignore[arg-type]
    stale_epoch = moving != KafkaError.NOT_LEADER_FOR_PARTITION
    assert admin.refreshed == (["in"] if stale_epoch else [])


def test_a_refresh_that_fails_leaves_the_next_ask_to_say_what_is_wrong() -> None:
    class Unreachable(Ends):
        def list_topics(self, topic: str, timeout: float) -> None:
            raise KafkaException(KafkaError(KafkaError._TRANSPORT, "broker down"))

    admin = Unreachable(KafkaError.FENCED_LEADER_EPOCH, None)
    assert groups.log_ends(admin, {"in": {0: 1}}, 5) == {"in": {0: 42}}  # type: ignore[arg-type]
