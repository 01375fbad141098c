"""The C loop that produces records without delivery reports (kafka/_quiet.c), on a producer
with no broker: what it takes, where it stops, and what it refuses to touch."""

from __future__ import annotations

import builtins
import json
import time
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer

from kafka_txn_sink.kafka import quiet
from kafka_txn_sink.kafka.quiet import loaded_librdkafka, quiet_produce

# Long enough that no record expires (and leaves the count) while a loaded machine runs the test.
NO_BROKER = {"bootstrap.servers": "127.0.0.1:9", "message.timeout.ms": 60_000}


@pytest.fixture
def producer() -> Counted:
    return counted_producer({})


class Counted(Producer):  # a subclass: the extension reads any Producer's handle
    """A producer whose statistics samples (every 10 ms) are kept for `queued`."""

    def __init__(self, settings: dict[str, object]):
        self.samples: list[str] = []
        stats = {"statistics.interval.ms": 10, "stats_cb": self.samples.append}
        super().__init__({**NO_BROKER, **settings, **stats})


def counted_producer(settings: dict[str, object]) -> Counted:
    return Counted(settings)


def queued(producer: Counted) -> int:
    """librdkafka's count of records in the producer (msg_cnt), from a sample taken after the
    caller's produce: the samples queued before it are served and dropped first."""
    samples = producer.samples
    producer.poll(0)
    samples.clear()
    deadline = time.monotonic() + 5
    while not samples and time.monotonic() < deadline:
        producer.poll(0.05)
    count: int = json.loads(samples[-1])["msg_cnt"]
    return count


def test_it_finds_the_librdkafka_confluent_kafka_loaded() -> None:
    path = loaded_librdkafka()
    assert path is not None and "librdkafka" in path


def test_records_go_into_the_producers_queue(producer: Counted) -> None:
    produce = quiet_produce(producer)
    assert produce is not None
    values: list[bytes | None] = [b"a", None, b"c" * 1000]
    assert produce("t", 0, values, [b"k", b"k", None], 0, 3) == (3, 0)
    assert queued(producer) == 3


def test_it_stops_at_a_record_that_is_not_bytes(producer: Counted) -> None:
    """The caller produces that one through confluent-kafka's produce(), which takes str."""
    produce = quiet_produce(producer)
    assert produce is not None
    values = [b"a", "not bytes", b"c"]
    assert produce("t", 0, values, None, 0, 3) == (1, 0)
    assert produce("t", 0, values, None, 2, 3) == (3, 0)
    assert queued(producer) == 2


def test_it_stops_at_a_record_librdkafka_refuses() -> None:
    """Larger than message.max.bytes: librdkafka's own error code, and nothing of it queued."""
    small = counted_producer({"message.max.bytes": 2_000})
    produce = quiet_produce(small)
    assert produce is not None
    index, error = produce("t", 0, [b"a", b"x" * 5_000, b"c"], None, 0, 3)
    assert (index, error) == (1, 10)  # RD_KAFKA_RESP_ERR_MSG_SIZE_TOO_LARGE
    assert queued(small) == 1


def test_bounds_and_types_are_checked(producer: Counted) -> None:
    produce = quiet_produce(producer)
    assert produce is not None
    with pytest.raises(IndexError):
        produce("t", 0, [b"a"], None, 0, 2)
    with pytest.raises(IndexError):
        produce("t", 0, [b"a", b"b"], [b"k"], 0, 2)
    with pytest.raises(TypeError):
        produce("t", 0, iter([b"a"]), None, 0, 1)  # type: ignore[arg-type]


def test_only_a_producer_is_read() -> None:
    assert quiet._quiet is not None and quiet._librdkafka() is not None
    with pytest.raises(TypeError, match="not a confluent-kafka Producer"):
        quiet._quiet.handle(object())


def test_the_pure_python_switch_turns_it_off(
    producer: Counted, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(quiet.PURE_PYTHON, "1")
    quiet._librdkafka.cache_clear()
    try:
        assert quiet_produce(producer) is None
    finally:
        monkeypatch.delenv(quiet.PURE_PYTHON)
        quiet._librdkafka.cache_clear()
    assert quiet_produce(producer) is not None


def test_two_copies_of_librdkafka_leave_it_unused(
    producer: Counted, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Which copy confluent-kafka links is then not known: produce() is used, never a guess."""
    real = builtins.open

    def maps_with_another(path: str, *args: Any, **kwargs: Any) -> Any:
        if path != "/proc/self/maps":
            return real(path, *args, **kwargs)
        other = tmp_path / "maps"
        lines = real(path, *args, **kwargs).read()
        other.write_text(lines + "7f00-7f01 r-xp 00000000 08:01 1 /opt/other/librdkafka.so.1\n")
        return real(other, *args, **kwargs)

    monkeypatch.setattr(quiet, "open", maps_with_another, raising=False)
    quiet._librdkafka.cache_clear()
    try:
        assert loaded_librdkafka() is None
        assert quiet_produce(producer) is None
    finally:
        monkeypatch.undo()
        quiet._librdkafka.cache_clear()
    assert quiet_produce(producer) is not None
