"""Repair after a shuffle (issue 39): a query with `repartition(n, key)` or a streaming
deduplication before the sink, its driver killed after batch 1's decision and restarted after
the coordinators aborted the batch; Spark's replay hands the reduce tasks the same rows in
another order, and the repair still takes it: every id once.

The replay's order differs on purpose. Spark's Kafka source numbers a batch's map tasks in the
order of its end-offset map on the first run (the order of a Java hash set of the topic's
partitions, which depends on the topic's name) and by partition number on a replay, and a reduce
task fetches the map outputs in map-task order. The input topic's name is chosen so that the two
orders differ, and the test checks that they did: each reduce task writes to the output partition
of its own number, and a read_uncommitted reader sees the first run's aborted records of batch 1
in one order and the repair's committed ones in another.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
from confluent_kafka import Producer

from kafka_txn_sink.protocol.messages import Completion, Decision
from kafka_txn_sink.testing.topics import read_topic
from tests.e2e.harness import Pipeline, assert_exactly_once, create_topics
from tests.e2e.test_repair import kill_at_batch_1_and_wait_for_the_timeout

pytestmark = [pytest.mark.kafka, pytest.mark.spark]

INPUT_PARTITIONS = 3


def java_hash(text: str) -> int:
    """Java's String.hashCode, as a signed 32-bit int."""
    value = 0
    for char in text:
        value = (31 * value + ord(char)) & 0xFFFFFFFF
    return value - (1 << 32) if value >= 1 << 31 else value


def hash_set_order(topic: str, partitions: int) -> list[int]:
    """The order a small java.util.HashSet of the topic's TopicPartitions iterates in."""

    def bucket(partition: int) -> int:
        code = (31 * (31 + partition) + java_hash(topic)) & 0xFFFFFFFF
        return (code ^ (code >> 16)) & 15

    return sorted(range(partitions), key=lambda p: (bucket(p), p))


def reordering_topic(prefix: str, moving_rows: bool = False) -> str:
    """A fresh topic name whose partitions a hash set holds out of their numbers' order. With
    `moving_rows`, one whose replay also deals rows to other tasks in a round-robin
    `repartition(2)`: that starts each map task's rows at `XORShiftRandom(its number)
    .nextInt(2)`, which is 0, 0 and 1 for map tasks 0, 1 and 2 (SPARK-21782), so the rows move
    only when map task 2 reads another topic partition on the replay than on the first run."""
    while True:
        name = f"{prefix}_{uuid.uuid4().hex[:10]}"
        order = hash_set_order(name, INPUT_PARTITIONS)
        if order != list(range(INPUT_PARTITIONS)) and (not moving_rows or order[2] != 2):
            return name


def reading_a_reordering_topic(pipeline: Pipeline, moving_rows: bool = False) -> Pipeline:
    """`pipeline` reading a topic whose map tasks a replay numbers differently (`moving_rows`:
    `reordering_topic`), writing to one with an output partition for each of the 4 shuffle
    partitions pipeline.py sets."""
    pipeline.input = reordering_topic("in", moving_rows)
    pipeline.output = f"out4_{uuid.uuid4().hex[:10]}"
    create_topics(pipeline.bootstrap, INPUT_PARTITIONS, pipeline.input)
    create_topics(pipeline.bootstrap, 4, pipeline.output)
    return pipeline


@pytest.fixture
def shuffled(pipeline: Pipeline) -> Iterator[Pipeline]:
    """The pipeline on a reordering topic (`reading_a_reordering_topic`)."""
    yield reading_a_reordering_topic(pipeline)


def first_and_replayed_orders(pipeline: Pipeline) -> dict[int, tuple[list[bytes], list[bytes]]]:
    """Per output partition: batch 1's keys in the order of the first run's aborted records,
    and in the order of the committed records that replaced them."""
    committed = read_topic(pipeline.bootstrap, pipeline.output, "read_committed")
    everything = read_topic(pipeline.bootstrap, pipeline.output, "read_uncommitted")
    kept = {(r.partition, r.offset) for r in committed}
    orders: dict[int, tuple[list[bytes], list[bytes]]] = {}
    for partition in {r.partition for r in everything}:
        aborted = [
            r.key or b""
            for r in everything
            if r.partition == partition and (partition, r.offset) not in kept
        ]
        first = list(dict.fromkeys(aborted))
        replayed = [
            r.key or b"" for r in committed if r.partition == partition and r.key in set(first)
        ]
        orders[partition] = (first, replayed)
    return orders


def assert_repaired(pipeline: Pipeline, ids: list[str]) -> tuple[Completion, Decision]:
    """Every id once, and batch 1's loss repaired whole at level 1: its completion and repair."""
    assert_exactly_once(pipeline, ids)
    log = pipeline.open_log()
    completion, repair = log.completion(1), log.repair(1, 1)
    assert completion is not None and repair is not None
    assert len(completion.lost) == len(repair.repaired) > 0 and repair.refused == ()
    return completion, repair


def assert_repaired_in_another_order(pipeline: Pipeline, ids: list[str]) -> None:
    assert_repaired(pipeline, ids)
    orders = first_and_replayed_orders(pipeline)
    assert all(sorted(first) == sorted(again) for first, again in orders.values()), orders
    assert any(first != again for first, again in orders.values()), (
        "the replay wrote batch 1 in the first run's order: the test did not reorder it"
    )


def test_repartition_by_key_replayed_in_another_order_is_repaired(shuffled: Pipeline) -> None:
    shuffled.partitions = 2
    shuffled.shape = ["--repartition-by", "key", "--partition-by-task"]
    ids = kill_at_batch_1_and_wait_for_the_timeout(shuffled, "driver.after_decision")

    restarted = shuffled.run()

    assert restarted.returncode == 0, restarted.error
    assert_repaired_in_another_order(shuffled, ids)


@pytest.mark.full  # CI: the repartition by key above, the same reduce-side reordering
def test_a_streaming_deduplication_replayed_in_another_order_is_repaired(
    shuffled: Pipeline,
) -> None:
    """A stateful operator: its state store's shuffle by key (the Python sink takes Append
    mode only, so an aggregation reaches it only behind a watermark; the shuffle is the same)."""
    shuffled.shape = ["--deduplicate", "--partition-by-task"]
    ids = kill_at_batch_1_and_wait_for_the_timeout(shuffled, "driver.after_decision")

    restarted = shuffled.run()

    assert restarted.returncode == 0, restarted.error
    assert_repaired_in_another_order(shuffled, ids)


def produce_flush(pipeline: Pipeline) -> None:
    """The record that closes every window of `pipeline.py --aggregate` (produced last)."""
    producer = Producer({"bootstrap.servers": pipeline.bootstrap, "acks": "all"})
    producer.produce(pipeline.input, key=b"flush", value=b"{}")
    assert producer.flush(30) == 0


@pytest.mark.full  # CI: the repartition by key, whose replay is certain to be in another order
def test_a_streaming_aggregation_replayed_is_repaired(
    shuffled: Pipeline, capsys: pytest.CaptureFixture[str]
) -> None:
    """A streaming aggregation before the sink (Append mode, behind a watermark): batch 1
    writes the groups that batch 0's watermark closed, out of the state store, through the
    aggregation's shuffle; the replay computes them again from batch 0's state. Every record is
    its own group and keeps its key and value, so every id leaves once, in batch 1 or in the
    batch that the last record (`flush`, far ahead in event time) closes."""
    shuffled.shape = [
        *("--select", "key", "--select", "value", "--select", "offset"),
        *("--aggregate", "--partition-by-task"),
    ]
    ids = kill_at_batch_1_and_wait_for_the_timeout(
        shuffled, "driver.after_decision", then_produce=lambda: produce_flush(shuffled)
    )

    restarted = shuffled.run()

    assert restarted.returncode == 0, restarted.error
    assert_repaired(shuffled, ids)
    orders = first_and_replayed_orders(shuffled)
    assert all(sorted(first) == sorted(again) for first, again in orders.values()), orders
    with capsys.disabled():  # the state store, not the fetch order, orders these rows
        moved = sum(first != again for first, again in orders.values())
        print(f"\naggregation: batch 1 written in another order in {moved} of {len(orders)}")


@pytest.mark.full  # CI: the repartition by key
def test_round_robin_repartition_replayed_with_rows_in_other_tasks_is_repaired(
    pipeline: Pipeline,
) -> None:
    """`repartition(2)` without keys deals each map task's rows round robin from a position
    drawn from the map task's number, which the replay changes: the reduce tasks get other
    rows. The batch was lost whole, so the repair takes the replay's tasks together. (Records
    are partitioned by key here: a partition column of the task's number would make the moved
    rows other records.)"""
    shuffled = reading_a_reordering_topic(pipeline, moving_rows=True)
    shuffled.partitions = 2
    ids = kill_at_batch_1_and_wait_for_the_timeout(shuffled, "driver.after_decision")

    restarted = shuffled.run()

    assert restarted.returncode == 0, restarted.error
    completion, repair = assert_repaired(shuffled, ids)
    assert len(completion.lost) == 2
    # No replayed task holds a lost one's records: the rows moved between tasks.
    lost_digests = {x.digest for x in completion.lost}
    assert not lost_digests & {p.digest for p in repair.participants}, lost_digests
