"""Keyed records go to the partition Java clients (and Spark's Kafka sink) pick (murmur2), and
a batch is split by partition in order."""

from __future__ import annotations

from typing import cast

import numpy as np
import pytest

from kafka_txn_sink.kafka.partitioner import key_partitions
from kafka_txn_sink.kafka.producer import _by_partition

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

    assert key_partitions(keys, partitions).tolist() == expected


def test_a_batch_gives_each_key_the_partition_it_gets_alone() -> None:
    keys = [bytes(range(n % 50)) for n in range(200)]

    together = key_partitions(keys, 7)

    assert together.tolist() == [int(key_partitions([k], 7)[0]) for k in keys]
    assert set(together.tolist()) <= set(range(7)) and together.dtype == np.int64


def test_a_null_key_is_refused_so_the_caller_places_it() -> None:
    with pytest.raises(TypeError):
        key_partitions(cast(list[bytes], [b"a", None]), 3)


def test_a_batch_is_split_by_partition_keeping_each_partitions_order() -> None:
    partitions = np.array([2, 0, 2, 1, 0, 2])
    values = [b"v0", b"v1", b"v2", b"v3", b"v4", b"v5"]
    keys = [b"k0", b"k1", b"k2", b"k3", b"k4", b"k5"]

    groups = list(_by_partition(partitions, values, keys))

    assert groups == [
        (0, [b"v1", b"v4"], [b"k1", b"k4"]),
        (1, [b"v3"], [b"k3"]),
        (2, [b"v0", b"v2", b"v5"], [b"k0", b"k2", b"k5"]),
    ]


def test_a_batch_of_one_partition_is_sent_as_it_is() -> None:
    values = [b"a", None, b"c"]

    [(partition, sent, keys)] = _by_partition(np.array([4, 4, 4]), values, None)

    assert (partition, sent, keys) == (4, values, None)
