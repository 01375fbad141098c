"""The task's producer on a real broker: the triple it reports is the coordinator's, and
preparing hundreds of transactions in one (reused) Python worker leaks no thread or handle."""

from __future__ import annotations

import os
import time
import uuid

import pytest
from confluent_kafka import Producer

from kafka_txn_sink.errors import InputError, KafkaTxnSinkError
from kafka_txn_sink.kafka import producer as producer_module
from kafka_txn_sink.kafka.producer import TaskTransaction
from kafka_txn_sink.kafka.producer_settings import producer_config
from kafka_txn_sink.kafka.quiet import quiet_produce
from kafka_txn_sink.kafka.security import librdkafka_config
from kafka_txn_sink.kafka.txn_admin import ONGOING, TxnAdmin
from kafka_txn_sink.testing.topics import read_topic
from tests.e2e.harness import commit_prepared, create_small_topic, create_topics

pytestmark = pytest.mark.kafka

CYCLES = 40  # a thread or a socket leaked per task shows well above the slack of 2 and 4


def native_threads() -> int:
    return len(os.listdir("/proc/self/task"))


def open_files() -> int:
    return len(os.listdir("/proc/self/fd"))


def prepare_one(bootstrap: str, topic: str, txn_id: str) -> TaskTransaction:
    txn = TaskTransaction(producer_config(bootstrap, {}, txn_id, 60_000), timeout_s=30)
    txn.init()
    txn.send(topic, value=b"x", key=b"k")
    assert txn.prepare() is not None
    return txn


def open_txn(bootstrap: str, settings: dict[str, str]) -> tuple[TaskTransaction, str]:
    """A task's transaction of a fresh id, initialised and begun, with these producer settings."""
    txn_id = f"prodtest_{uuid.uuid4().hex[:8]}-0"
    txn = TaskTransaction(producer_config(bootstrap, settings, txn_id, 60_000), timeout_s=30)
    txn.init()
    return txn, txn_id


def test_reported_triple_is_the_coordinators(kafka_bootstrap: str) -> None:
    topic = f"prod_{uuid.uuid4().hex[:8]}"
    create_topics(kafka_bootstrap, 3, topic)
    txn, txn_id = open_txn(kafka_bootstrap, {})
    for i in range(100):
        txn.send(topic, value=b"v", key=str(i).encode())
    prepared = txn.prepare()
    txn.detach()

    assert prepared is not None and prepared.rows == 100
    assert (
        sum(last - first + 1 for p in prepared.offsets[topic].values() for first, last in [p])
        == 100
    )
    with TxnAdmin(kafka_bootstrap, {}) as txn_admin:
        state = txn_admin.describe([txn_id])[txn_id]
        txn_admin.end_transactions([prepared.triple], commit=False, deadline_s=30)
    assert state.state == ONGOING
    assert state.triple == prepared.triple


def test_a_sample_taken_before_the_flush_names_the_transaction(kafka_bootstrap: str) -> None:
    """prepare() takes the producer id from a sample seen while the records were produced
    (no wait for another): it is the coordinator's, and the task's bytes are its records'
    keys and values, tombstones and null keys included."""
    topic = f"prod_{uuid.uuid4().hex[:8]}"
    create_topics(kafka_bootstrap, 3, topic)
    txn, txn_id = open_txn(kafka_bootstrap, {})
    values: list[bytes | None] = [b"value-%d" % i for i in range(50)] + [None]
    keys: list[bytes | None] = [*(b"k%d" % i for i in range(50)), b"gone"]
    txn.send_many(topic, values, keys)
    deadline = time.monotonic() + 5
    while not txn._stats.latest.get("producer_id") and time.monotonic() < deadline:
        txn._client.poll(0.01)  # let a sample inside the transaction arrive
    txn.send_many(topic, [b"last"], [None])
    prepared = txn.prepare()
    txn.detach()

    assert prepared is not None and prepared.rows == 52
    payload = sum(len(v or b"") + len(k or b"") for v, k in zip(values, keys, strict=True))
    assert prepared.bytes == payload + len(b"last")
    with TxnAdmin(kafka_bootstrap, {}) as txn_admin:
        state = txn_admin.describe([txn_id])[txn_id]
        txn_admin.end_transactions([prepared.triple], commit=False, deadline_s=30)
    assert state.state == ONGOING
    assert state.triple == prepared.triple


def test_records_past_the_reported_ones_are_proven_by_the_acknowledged_counts(
    kafka_bootstrap: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """After the task's first REPORTED_RECORDS, send_many reports only each call's last record
    of a partition: the task still prepares with every partition's first and last offset, and
    a reader sees every record once when the transaction commits."""
    monkeypatch.setattr(producer_module, "REPORTED_RECORDS", 100)
    topic = f"prod_{uuid.uuid4().hex[:8]}"
    create_topics(kafka_bootstrap, 3, topic)
    txn, txn_id = open_txn(kafka_bootstrap, {})
    ids = [b"%d" % i for i in range(2_000)]
    for start in range(0, len(ids), 500):
        txn.send_many(topic, ids[start : start + 500], ids[start : start + 500])
    prepared = txn.prepare()
    txn.detach()

    assert prepared is not None and prepared.rows == 2_000
    ranges = prepared.offsets[topic]
    assert sum(last - first + 1 for first, last in ranges.values()) == 2_000
    with TxnAdmin(kafka_bootstrap, {}) as txn_admin:
        assert txn_admin.describe([txn_id])[txn_id].triple == prepared.triple
    commit_prepared(kafka_bootstrap, prepared)
    seen = [record.value or b"" for record in read_topic(kafka_bootstrap, topic)]
    assert sorted(seen) == sorted(ids)


def test_a_refused_record_among_the_unreported_fails_the_task(
    kafka_bootstrap: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A record the broker refuses in the middle of the unreported ones (larger than the
    topic's max.message.bytes) has no report to show it: the transaction fails, the records
    after it are purged (their reports say so), and nothing of the task becomes visible."""
    monkeypatch.setattr(producer_module, "REPORTED_RECORDS", 10)
    topic = f"prod_{uuid.uuid4().hex[:8]}"
    create_small_topic(kafka_bootstrap, topic, max_message_bytes=1_000)
    small_batches = {"batch.num.messages": "10"}  # the refused record's batch is not the last's
    txn, txn_id = open_txn(kafka_bootstrap, small_batches)
    values: list[bytes | None] = [b"small-%d" % i for i in range(300)]
    values[150] = b"x" * 5_000
    txn.send_many(topic, values[:20], [b"k"] * 20)
    with pytest.raises(KafkaTxnSinkError, match="an earlier record was refused"):
        txn.send_many(topic, values[20:], [b"k"] * 280)
        txn.prepare()
    txn.detach()
    with TxnAdmin(kafka_bootstrap, {}) as txn_admin:  # aborted, or fenced when it timed out
        assert txn_admin.describe([txn_id])[txn_id].state != ONGOING
    assert read_topic(kafka_bootstrap, topic) == []


def count_one_short(monkeypatch: pytest.MonkeyPatch, times: int) -> list[int]:
    """Lower by one the busiest partition's acknowledged count in the first `times` samples
    read; the returned list gets, per sample read, how much it was lowered."""
    real = producer_module.acknowledged_of
    lowered: list[int] = []

    def short(raw: str) -> dict[tuple[str, int], int]:
        counts = real(raw)
        lowered.append(1 if len(lowered) < times else 0)
        where = max(counts, key=lambda k: counts[k])
        return {**counts, where: counts[where] - lowered[-1]}

    monkeypatch.setattr(producer_module, "acknowledged_of", short)
    return lowered


def past_the_reported_records(
    bootstrap: str, monkeypatch: pytest.MonkeyPatch
) -> tuple[str, TaskTransaction, str]:
    """A topic of 2 partitions and an open transaction holding 220 records to one of them, all
    but each call's last past REPORTED_RECORDS (lowered to 10): (topic, transaction, its id)."""
    monkeypatch.setattr(producer_module, "REPORTED_RECORDS", 10)
    topic = f"prod_{uuid.uuid4().hex[:8]}"
    create_topics(bootstrap, 2, topic)
    txn, txn_id = open_txn(bootstrap, {})
    txn.send_many(topic, [b"v"] * 20, [b"k"] * 20)
    txn.send_many(topic, [b"v"] * 200, [b"k"] * 200)
    return topic, txn, txn_id


def test_a_partition_acknowledging_fewer_records_than_sent_fails_the_task(
    kafka_bootstrap: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What a record failing without a report and without failing the transaction leaves
    (librdkafka: a time-out before the partition had a leader, or the partition removed):
    one record fewer acknowledged than sent. The sample's count is lowered by one here, as
    those failures cannot be caused on the test bed's broker."""
    lowered = count_one_short(monkeypatch, times=2)
    topic, txn, _ = past_the_reported_records(kafka_bootstrap, monkeypatch)
    with pytest.raises(KafkaTxnSinkError, match=r"acknowledged 219 of the 220 records sent to"):
        txn.prepare()
    txn.detach()
    assert lowered == [1, 1]  # the second sample was read too
    assert read_topic(kafka_bootstrap, topic) == []


def test_a_sample_built_before_the_last_acknowledgement_is_read_again(
    kafka_bootstrap: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """librdkafka builds a sample partition by partition, so the first one served after the
    flush can count one acknowledgement short of the truth (lowered by one here, once): the
    task looks at the next sample before it decides, and prepares."""
    lowered = count_one_short(monkeypatch, times=1)
    _, txn, txn_id = past_the_reported_records(kafka_bootstrap, monkeypatch)
    prepared = txn.prepare()
    txn.detach()

    assert prepared is not None and prepared.rows == 220 and lowered == [1, 0]
    with TxnAdmin(kafka_bootstrap, {}) as txn_admin:
        assert txn_admin.describe([txn_id])[txn_id].triple == prepared.triple
        txn_admin.end_transactions([prepared.triple], commit=False, deadline_s=30)


# Records reported each (the task's first REPORTED_RECORDS), or past them: from C (kafka/quiet.py)
# where the extension is built, else through produce() with no report (pure Python).
PATHS = ["reported", "quiet", "quiet-pure-python"]


def take_path(path: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Send the records of the test's transactions (opened after this) down `path`."""
    if path != "reported":
        monkeypatch.setattr(producer_module, "REPORTED_RECORDS", 10)
    if path == "quiet-pure-python":
        monkeypatch.setattr(producer_module, "quiet_produce", lambda producer: None)


def test_the_extension_takes_the_records_without_reports(kafka_bootstrap: str) -> None:
    """The C loop is built into this installation and bound to confluent-kafka's librdkafka:
    records past the reported ones do not fall back to produce() one by one."""
    config = producer_config(kafka_bootstrap, {}, f"prodtest_{uuid.uuid4().hex[:8]}-0", 60_000)
    assert quiet_produce(Producer(librdkafka_config(config))) is not None


@pytest.mark.parametrize("path", PATHS)
def test_a_full_queue_loses_and_repeats_no_record(
    kafka_bootstrap: str, monkeypatch: pytest.MonkeyPatch, path: str
) -> None:
    """With a producer queue of 50 records, produce() refuses over and over while send_many
    hands it thousands: each refused record is sent again once, in its place."""
    take_path(path, monkeypatch)
    topic = f"prod_{uuid.uuid4().hex[:8]}"
    create_topics(kafka_bootstrap, 2, topic)
    tiny = {"queue.buffering.max.messages": "50"}
    txn, _ = open_txn(kafka_bootstrap, tiny)
    ids = [b"%05d" % i for i in range(5_000)]
    txn.send_many(topic, ids, None)  # no keys: one partition, in this order
    prepared = txn.prepare()
    txn.detach()

    assert prepared is not None and prepared.rows == 5_000
    commit_prepared(kafka_bootstrap, prepared)
    assert [record.value for record in read_topic(kafka_bootstrap, topic)] == ids


@pytest.mark.parametrize("path", PATHS)
def test_a_record_refused_by_produce_is_the_one_named(
    kafka_bootstrap: str, monkeypatch: pytest.MonkeyPatch, path: str
) -> None:
    """A record above the producer's message.max.bytes is refused by produce() itself, in the
    middle of a call: the error gives that record's size, and the task publishes nothing."""
    take_path(path, monkeypatch)
    topic = f"prod_{uuid.uuid4().hex[:8]}"
    create_topics(kafka_bootstrap, 1, topic)
    small = {"message.max.bytes": "2000"}
    txn, _ = open_txn(kafka_bootstrap, small)
    values: list[bytes | None] = [b"v" * 10] * 3_000
    values[2_345] = b"x" * 4_321
    with pytest.raises(InputError, match="a record of 4321 bytes"):
        txn.send_many(topic, values, None)
    txn.abort()
    txn.detach()
    assert read_topic(kafka_bootstrap, topic) == []


def test_dozens_of_prepared_transactions_leak_nothing(kafka_bootstrap: str) -> None:
    topic = f"prod_{uuid.uuid4().hex[:8]}"
    create_topics(kafka_bootstrap, 1, topic)
    txn_id = f"prodtest_{uuid.uuid4().hex[:8]}-0"
    for _ in range(5):  # warm up: first connections, lazily started library threads
        prepare_one(kafka_bootstrap, topic, txn_id).detach()
    threads, files = native_threads(), open_files()

    for _ in range(CYCLES):
        prepare_one(kafka_bootstrap, topic, txn_id).detach()

    assert native_threads() <= threads + 2, "producer threads outlive their tasks"
    assert open_files() <= files + 4, "sockets or pipes outlive their tasks"
    with TxnAdmin(kafka_bootstrap, {}) as txn_admin:
        last = txn_admin.describe([txn_id])[txn_id]
        txn_admin.end_transactions([last.triple], commit=False, deadline_s=30)
