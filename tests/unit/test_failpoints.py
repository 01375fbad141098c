from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from kafka_txn_sink import failpoints


@pytest.fixture
def armed(monkeypatch: pytest.MonkeyPatch, tmp_path: Path):  # type: ignore[no-untyped-def]
    def arm(spec: str) -> Path:
        monkeypatch.setenv(failpoints.ENV, spec)
        monkeypatch.setenv(failpoints.ENV_DIR, str(tmp_path))
        return tmp_path

    return arm


def test_inert_without_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(failpoints.ENV, raising=False)
    failpoints.fire("driver.after_decision", 1)


def test_raise_once_raises_only_the_first_time(armed) -> None:  # type: ignore[no-untyped-def]
    directory = armed("task.after_produce=raise-once")

    with pytest.raises(failpoints.FailpointError):
        failpoints.fire("task.after_produce", 0)
    failpoints.fire("task.after_produce", 0)
    assert failpoints.reached(directory, "task.after_produce")


def test_block_waits_for_release_and_signals(armed) -> None:  # type: ignore[no-untyped-def]
    directory = armed("driver.after_decision=block")
    done = threading.Event()
    thread = threading.Thread(
        target=lambda: (failpoints.fire("driver.after_decision", 3), done.set())
    )
    thread.start()
    deadline = time.monotonic() + 5
    while not failpoints.reached(directory, "driver.after_decision"):
        assert time.monotonic() < deadline
        time.sleep(0.01)
    assert not done.is_set()
    failpoints.release(directory, "driver.after_decision")
    thread.join(5)
    assert done.is_set()


def test_batch_filter(armed) -> None:  # type: ignore[no-untyped-def]
    armed("driver.before_decision=raise@2")

    failpoints.fire("driver.before_decision", 1)
    with pytest.raises(failpoints.FailpointError):
        failpoints.fire("driver.before_decision", 2)


def test_unknown_names_are_errors(armed) -> None:  # type: ignore[no-untyped-def]
    armed("driver.after_decision=raise")

    with pytest.raises(ValueError, match="unknown failpoint"):
        failpoints.fire("driver.nowhere")
