"""Keyed records go to the partition Java clients (and Spark's Kafka sink) pick (murmur2), and
a batch is split by partition in order."""

from __future__ import annotations

from typing import cast

import pyarrow as pa
import pytest

from kafka_txn_sink.kafka.partitioner import by_partition, key_partitions

# Kafka's own test vectors of Utils.murmur2 (signed Java ints).
MURMUR2 = {
    b"21": -973932308,
    b"foobar": -790332482,
    b"a-little-bit-long-string": -985981536,
    b"a-little-bit-longer-string": -1486304829,
    b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8": -58897971,
    b"abc": 479470107,
}


def test_partitions_follow_kafkas_murmur2_for_every_key_length() -> None:
    keys = list(MURMUR2)
    partitions = 1_000_003  # a prime above the hashes' spread keeps the remainders telling
    expected = [(h & 0x7FFFFFFF) % partitions for h in MURMUR2.values()]

    assert key_partitions(keys, partitions).to_pylist() == expected


def test_a_batch_gives_each_key_the_partition_it_gets_alone() -> None:
    keys = [bytes(range(n % 50)) for n in range(200)]

    together = key_partitions(keys, 7)

    assert together.to_pylist() == [key_partitions([k], 7)[0].as_py() for k in keys]
    assert set(together.to_pylist()) <= set(range(7)) and together.type == pa.int64()


def test_a_null_key_is_refused_so_the_caller_places_it() -> None:
    with pytest.raises(TypeError):
        key_partitions(cast(list[bytes], [b"a", None]), 3)


def test_a_batch_is_split_by_partition_keeping_each_partitions_order() -> None:
    partitions = pa.array([2, 0, 2, 1, 0, 2], pa.int64())
    values = [b"v0", b"v1", b"v2", b"v3", b"v4", b"v5"]
    keys = [b"k0", b"k1", b"k2", b"k3", b"k4", b"k5"]

    groups = list(by_partition(partitions, values, keys))

    assert groups == [
        (0, [b"v1", b"v4"], [b"k1", b"k4"]),
        (1, [b"v3"], [b"k3"]),
        (2, [b"v0", b"v2", b"v5"], [b"k0", b"k2", b"k5"]),
    ]


def test_a_batch_of_one_partition_is_sent_as_it_is() -> None:
    values = [b"a", None, b"c"]

    [(partition, sent, keys)] = by_partition(pa.array([4, 4, 4], pa.int64()), values, None)

    assert (partition, sent, keys) == (4, values, None)


def test_keys_of_every_length_hash_as_kafka_python_does() -> None:
    from kafka.partitioner.default import murmur2  # kafka-python's port of Utils.murmur2

    keys = [bytes((n * 7 + i) % 256 for i in range(n % 41)) for n in range(500)]

    assert key_partitions(keys, 13).to_pylist() == [(murmur2(k) & 0x7FFFFFFF) % 13 for k in keys]


def test_null_keys_take_one_partition_and_keyed_ones_their_hash() -> None:
    from kafka_txn_sink.kafka.producer import TaskTransaction

    transaction = TaskTransaction.__new__(TaskTransaction)
    transaction.partition_count = lambda topic: 5  # type: ignore[method-assign]
    keys = [b"a", None, b"b", None]

    partitions = transaction._partitions_of("t", keys, 4).to_pylist()

    assert partitions[0] == key_partitions([b"a"], 5)[0].as_py()
    assert partitions[2] == key_partitions([b"b"], 5)[0].as_py()
    assert partitions[1] == partitions[3] and 0 <= partitions[1] < 5
