"""Kafka's default partition of keyed records, for a whole column of keys at once (numpy).

Java clients, and so Spark's own Kafka sink, send a record with a key to partition
`(murmur2(key) & 0x7fffffff) % partitions`; librdkafka's `murmur2_random` partitioner (the
producer's setting here) does the same. Knowing the partitions before producing lets the producer
send each partition's records with an explicit partition and collect their delivery reports per
partition without a Python call per record (`producer.TaskTransaction.send_many`).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

SEED = 0x9747B28C
MULTIPLIER = np.uint32(0x5BD1E995)
POSITIVE = 0x7FFFFFFF


def key_partitions(keys: Sequence[bytes], partitions: int) -> np.ndarray:
    """The partition (int64) Kafka's default partitioner picks for each key.

    Raises:
        TypeError: a key is None (null keys have no hash; the caller picks their partition).
    """
    lengths = np.fromiter(map(len, keys), np.int64, len(keys))
    data = np.frombuffer(b"".join(keys), np.uint8)
    starts = np.zeros(len(keys), np.int64)
    np.cumsum(lengths[:-1], out=starts[1:])
    hashes = murmur2(data, starts, lengths).astype(np.int64)
    partition: np.ndarray = (hashes & POSITIVE) % partitions
    return partition


def murmur2(data: np.ndarray, starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """Kafka's murmur2 (`Utils.murmur2`, seed 0x9747b28c) of `data[starts[i]:][:lengths[i]]`.

    Vectorised over the keys: one pass per 4-byte block of the longest key. uint32 arrays wrap
    on overflow as Java's int arithmetic does.
    """
    hashes = np.uint32(SEED) ^ lengths.astype(np.uint32)
    blocks = lengths // 4
    for block in range(int(blocks.max(initial=0))):
        live = np.flatnonzero(blocks > block)
        word = _word(data, starts[live] + 4 * block)
        word *= MULTIPLIER
        word ^= word >> 24
        word *= MULTIPLIER
        hashes[live] = (hashes[live] * MULTIPLIER) ^ word
    tail = lengths & 3
    end = starts + (lengths & ~3)
    _mix_tail(hashes, data, end, tail)
    hashes ^= hashes >> 13
    hashes *= MULTIPLIER
    hashes ^= hashes >> 15
    return hashes


def _word(data: np.ndarray, at: np.ndarray) -> np.ndarray:
    """The little-endian 32-bit words at byte positions `at`."""
    word = data[at].astype(np.uint32)
    for byte in (1, 2, 3):
        word |= data[at + byte].astype(np.uint32) << (8 * byte)
    return word


def _mix_tail(hashes: np.ndarray, data: np.ndarray, end: np.ndarray, tail: np.ndarray) -> None:
    """The last 1-3 bytes of each key, as murmur2's fall-through switch takes them."""
    for byte in (2, 1, 0):
        has = np.flatnonzero(tail > byte)
        hashes[has] ^= data[end[has] + byte].astype(np.uint32) << (8 * byte)
    has = np.flatnonzero(tail > 0)
    hashes[has] *= MULTIPLIER
