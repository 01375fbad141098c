from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from kafka_txn_sink import failpoints


@pytest.fixture
def armed(monkeypatch: pytest.MonkeyPatch, tmp_path: Path):  # type: ignore[no-untyped-def]
    def arm(spec: str) -> Path:
        for name, value in failpoints.environment(spec, tmp_path).items():
            monkeypatch.setenv(name, value)
        return tmp_path

    return arm


def test_inert_without_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(failpoints.ENV, raising=False)
    failpoints.fire("driver.after_decision", 1)


def test_inert_without_the_test_switch(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A failpoint configured outside a test (the variable left set, or set by someone who can
    set a job's environment) neither fails nor blocks the sink."""
    monkeypatch.delenv("KAFKA_TXN_SINK_TESTING", raising=False)
    monkeypatch.setattr(failpoints, "_warned", False)
    monkeypatch.setenv("KAFKA_TXN_SINK_FAILPOINTS", "driver.after_decision=raise")
    monkeypatch.setenv("KAFKA_TXN_SINK_FAILPOINT_DIR", str(tmp_path))

    failpoints.fire("driver.after_decision", 1)
    failpoints.fire("driver.after_decision", 2)

    assert not failpoints.reached(tmp_path, "driver.after_decision")
    warnings = [r.getMessage() for r in caplog.records if r.name == failpoints.__name__]
    assert len(warnings) == 1 and "KAFKA_TXN_SINK_TESTING=1" in warnings[0]


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
