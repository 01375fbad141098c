"""A task initialises its transaction while Spark delivers its first input: both run at once,
no input is lost or reordered, and an error of either fails the task."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any, cast

import pytest

from kafka_txn_sink.errors import KafkaTxnSinkError
from kafka_txn_sink.kafka.producer import TaskTransaction
from kafka_txn_sink.protocol.prepare import _init_while_spark_delivers

WAIT_S = 5.0


class Init:
    """A transaction whose init records that it ran, after `release` (if given) is set."""

    def __init__(self, release: threading.Event | None = None, error: Exception | None = None):
        self.started = threading.Event()
        self.done = threading.Event()
        self._release = release
        self._error = error

    def init(self) -> None:
        self.started.set()
        if self._release is not None:
            assert self._release.wait(WAIT_S), "the first input never came"
        if self._error is not None:
            raise self._error
        self.done.set()


def delivered_after(event: threading.Event, items: list[Any]) -> Iterator[Any]:
    """Spark's input: its first item only once `event` is set."""
    assert event.wait(WAIT_S), "the init never started while the input was awaited"
    yield from items


def as_txn(init: Init) -> TaskTransaction:
    return cast(TaskTransaction, init)


def test_the_init_runs_while_the_first_input_is_awaited() -> None:
    init = Init()
    inputs = _init_while_spark_delivers(as_txn(init), delivered_after(init.started, [1, 2, 3]))

    assert init.done.is_set()
    assert list(inputs) == [1, 2, 3]


def test_the_inputs_wait_for_the_init_to_end() -> None:
    """The first input arrives first; the inputs are handed on only after the init ended."""
    arrived = threading.Event()
    init = Init(release=arrived)

    def inputs() -> Iterator[int]:
        arrived.set()
        yield from (7, 8)

    handed = _init_while_spark_delivers(as_txn(init), inputs())

    assert init.done.is_set()
    assert list(handed) == [7, 8]


def test_a_task_without_input_is_still_initialised() -> None:
    init = Init()

    assert list(_init_while_spark_delivers(as_txn(init), iter([]))) == []
    assert init.done.is_set()


def test_an_init_error_fails_the_task_before_any_input_is_used() -> None:
    init = Init(error=KafkaTxnSinkError("fenced"))

    with pytest.raises(KafkaTxnSinkError, match="fenced"):
        _init_while_spark_delivers(as_txn(init), iter([1]))


def test_an_input_error_fails_the_task_after_the_init_ended() -> None:
    init = Init()

    def broken() -> Iterator[int]:
        raise ValueError("the JVM went away")
        yield 0

    with pytest.raises(ValueError, match="the JVM went away"):
        _init_while_spark_delivers(as_txn(init), broken())
    assert init.done.is_set()
