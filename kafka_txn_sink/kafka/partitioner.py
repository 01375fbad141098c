"""Kafka's default partition of keyed records, for a whole column of keys at once (Arrow).

Java clients, and so Spark's own Kafka sink, send a record with a key to partition
`(murmur2(key) & 0x7fffffff) % partitions`; librdkafka's `murmur2_random` partitioner (the
producer's setting here) does the same. Knowing the partitions before producing lets the producer
send each partition's records with an explicit partition and collect their delivery reports per
partition without a Python call per record (`producer.TaskTransaction.send_many`);
`by_partition` splits a batch's records that way, each partition's in their order.

The arithmetic runs in pyarrow's compute kernels (a core dependency) rather than numpy, which
only files mode and the verifier install: unchecked uint32 arithmetic wraps on overflow as Java's
int arithmetic does.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Sequence
from operator import itemgetter

import pyarrow as pa
import pyarrow.compute as pc

SEED = 0x9747B28C
# A plain int, made a uint32 scalar where used (_u32): a scalar made at import would make
# pyarrow import pandas (hundreds of ms) in every process that imports the sink, Spark's
# short-lived commit workers included.
MULTIPLIER = 0x5BD1E995
POSITIVE = 0x7FFFFFFF


def _u32(value: int) -> pa.Scalar:
    """A uint32 operand: a plain int would widen the uint32 arrays to int64 (no wrapping)."""
    return pa.scalar(value, pa.uint32())


def key_partitions(keys: Sequence[bytes], partitions: int) -> pa.Int64Array:
    """The partition Kafka's default partitioner picks for each key, as int64.

    Raises:
        TypeError: a key is None (null keys have no hash; the caller picks their partition).
    """
    column = pa.array(keys, pa.large_binary())
    if column.null_count:
        raise TypeError("a null key has no murmur2 hash")
    offsets = pa.Array.from_buffers(pa.int64(), len(column) + 1, [None, column.buffers()[1]])
    data_buffer = column.buffers()[2]
    size = 0 if data_buffer is None else data_buffer.size
    data = pa.Array.from_buffers(pa.uint8(), size, [None, data_buffer])
    starts = offsets.slice(0, len(column))
    lengths = pc.subtract(offsets.slice(1), starts)
    positive = pc.bit_wise_and(pc.cast(murmur2(data, starts, lengths), pa.int64()), POSITIVE)
    # positive % partitions (pyarrow has no modulo kernel; integer division truncates)
    partition: pa.Int64Array = pc.subtract(
        positive, pc.multiply(pc.divide(positive, partitions), partitions)
    )
    return partition


def murmur2(data: pa.Array, starts: pa.Array, lengths: pa.Array) -> pa.UInt32Array:
    """Kafka's murmur2 (`Utils.murmur2`, seed 0x9747b28c) of `data[starts[i]:][:lengths[i]]`.

    Vectorised over the keys: one pass per 4-byte block of the longest key, each over the keys
    that long (`replace_with_mask` writes their new hashes back in place of the old).
    """
    hashes = pc.bit_wise_xor(_u32(SEED), pc.cast(lengths, pa.uint32()))
    blocks = pc.divide(lengths, 4)
    longest = pc.max(blocks).as_py() or 0
    for block in range(longest):
        live = pc.greater(blocks, block)
        at = pc.add(pc.filter(starts, live), 4 * block)
        word = _mixed(_word(data, at))
        mixed = pc.bit_wise_xor(pc.multiply(pc.filter(hashes, live), _u32(MULTIPLIER)), word)
        hashes = pc.replace_with_mask(hashes, live, mixed)
    tail = pc.bit_wise_and(lengths, 3)
    end = pc.add(starts, pc.subtract(lengths, tail))
    hashes = _mix_tail(hashes, data, end, tail)
    hashes = pc.bit_wise_xor(hashes, pc.shift_right(hashes, _u32(13)))
    hashes = pc.multiply(hashes, _u32(MULTIPLIER))
    return pc.bit_wise_xor(hashes, pc.shift_right(hashes, _u32(15)))


def _word(data: pa.Array, at: pa.Array) -> pa.Array:
    """The little-endian 32-bit words at byte positions `at`."""
    word = pc.cast(pc.take(data, at), pa.uint32())
    for byte in (1, 2, 3):
        taken = pc.cast(pc.take(data, pc.add(at, byte)), pa.uint32())
        shifted = pc.shift_left(taken, _u32(8 * byte))
        word = pc.bit_wise_or(word, shifted)
    return word


def _mixed(word: pa.Array) -> pa.Array:
    """A block's word as murmur2 mixes it: k *= m; k ^= k >>> 24; k *= m."""
    word = pc.multiply(word, _u32(MULTIPLIER))
    word = pc.bit_wise_xor(word, pc.shift_right(word, _u32(24)))
    return pc.multiply(word, _u32(MULTIPLIER))


def _mix_tail(hashes: pa.Array, data: pa.Array, end: pa.Array, tail: pa.Array) -> pa.Array:
    """The last 1-3 bytes of each key, as murmur2's fall-through switch takes them."""
    for byte in (2, 1, 0):
        has = pc.greater(tail, byte)
        at = pc.add(pc.filter(end, has), byte)
        shifted = pc.shift_left(pc.cast(pc.take(data, at), pa.uint32()), _u32(8 * byte))
        hashes = pc.replace_with_mask(hashes, has, pc.bit_wise_xor(pc.filter(hashes, has), shifted))
    has = pc.greater(tail, 0)
    return pc.replace_with_mask(hashes, has, pc.multiply(pc.filter(hashes, has), _u32(MULTIPLIER)))


def by_partition(
    partitions: pa.Int64Array,
    values: Sequence[bytes | None],
    keys: Sequence[bytes | None] | None,
) -> Iterator[tuple[int, Sequence[bytes | None], Sequence[bytes | None] | None]]:
    """(partition, its values, its keys) for each partition used, records in their order."""
    low, high = pc.min_max(partitions).values()
    if low == high:
        yield low.as_py(), values, keys
        return
    order = pc.sort_indices(partitions)  # stable: each partition keeps its records' order
    ordered = pc.take(partitions, order)
    changes = pc.not_equal(ordered.slice(1), ordered.slice(0, len(ordered) - 1))
    bounds = [0, *(pc.add(pc.indices_nonzero(changes), 1).to_pylist()), len(ordered)]
    firsts = pc.take(ordered, bounds[:-1]).to_pylist()
    picks = order.to_pylist()
    values_by = split_at(values, picks, bounds)
    keys_by = split_at(keys, picks, bounds) if keys is not None else [None] * len(firsts)
    yield from zip(firsts, values_by, keys_by, strict=True)


def split_at(
    items: Sequence[bytes | None], picks: list[int], bounds: list[int]
) -> list[list[bytes | None]]:
    """`items` taken in the order of `picks`, cut at `bounds` (itemgetter moves them in C)."""
    taken = list(itemgetter(*picks)(items)) if len(picks) > 1 else [items[i] for i in picks]
    return [taken[start:end] for start, end in itertools.pairwise(bounds)]
