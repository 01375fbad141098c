"""The driver session's client of the transaction coordinators (protocol/session.py): made on a
step's first request, dropped when that step fails, never made for a step that asks nothing."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from kafka_txn_sink.errors import KafkaUnavailableError
from kafka_txn_sink.kafka import txn_admin
from kafka_txn_sink.kafka.admin_api import NOT_FOUND, TxnState
from kafka_txn_sink.options import SinkOptions, parse_options
from kafka_txn_sink.protocol import session


class Coordinators:
    """Stands in for the process's shared TxnAdmin clients: which were made and discarded."""

    def __init__(self) -> None:
        self.made: list[Coordinators.Client] = []
        self.discarded: list[Coordinators.Client] = []
        self.reachable = True

    class Client:
        def describe(self, ids: Any) -> dict[str, TxnState]:
            return {i: TxnState(i, NOT_FOUND) for i in ids}

    def shared(self, bootstrap: str, kafka: Any, timeout_ms: int) -> Client:
        if not self.reachable:
            raise KafkaUnavailableError(f"cannot reach Kafka at {bootstrap}")
        self.made.append(Coordinators.Client())
        return self.made[-1]


@pytest.fixture
def coordinators(monkeypatch: pytest.MonkeyPatch) -> Coordinators:
    found = Coordinators()
    monkeypatch.setattr(txn_admin, "shared_txn_admin", found.shared)
    monkeypatch.setattr(txn_admin, "discard_txn_admin", found.discarded.append)
    monkeypatch.setattr(session, "shared_cluster_of", lambda options: object())
    monkeypatch.setattr(session, "discard_cluster", lambda cluster: None)
    return found


@pytest.fixture
def options(tmp_path: Path) -> SinkOptions:
    return parse_options(
        {"kafka.bootstrap.servers": "h:1", "sinkId": "s", "commitLog": str(tmp_path / "log")}
    )


def test_a_step_that_asks_the_coordinators_nothing_makes_no_client(
    coordinators: Coordinators, options: SinkOptions
) -> None:
    with session.driver_session(options) as step:
        assert step.commit_log is not None
    assert coordinators.made == []


def test_the_first_request_makes_the_client_and_the_next_reuse_it(
    coordinators: Coordinators, options: SinkOptions
) -> None:
    with session.driver_session(options) as step:
        assert step.txn_admin.describe(["a"])["a"].state == NOT_FOUND
        step.txn_admin.describe(["b"])
    assert len(coordinators.made) == 1 and coordinators.discarded == []


def test_a_failed_step_drops_the_client_it_made(
    coordinators: Coordinators, options: SinkOptions
) -> None:
    with pytest.raises(RuntimeError), session.driver_session(options) as step:
        step.txn_admin.describe(["a"])
        raise RuntimeError("the step failed")
    assert coordinators.discarded == coordinators.made and len(coordinators.made) == 1


def test_a_failed_step_that_made_no_client_drops_none(
    coordinators: Coordinators, options: SinkOptions
) -> None:
    with pytest.raises(RuntimeError), session.driver_session(options):
        raise RuntimeError("the step failed")
    assert coordinators.made == [] and coordinators.discarded == []


def test_unreachable_coordinators_fail_the_step_that_asks(
    coordinators: Coordinators, options: SinkOptions
) -> None:
    coordinators.reachable = False
    with (
        pytest.raises(KafkaUnavailableError, match="cannot reach Kafka at h:1"),
        session.driver_session(options) as step,
    ):
        step.txn_admin.describe(["a"])
    assert coordinators.discarded == []
