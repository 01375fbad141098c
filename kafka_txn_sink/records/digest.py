"""A digest of the records one task produced: what tells a replay of a batch from other rows.

A repair (protocol/repair.py) writes again the rows of a decided transaction the brokers
aborted; it takes a replayed task's transaction for that only when the replay produced the same
records. Spark's Kafka source does not keep a batch's partition indexes on a replay, so the
driver matches by records, not by index: by this digest.

The digest is of the records as a multiset: their order does not enter it. A shuffle before the
sink (`repartition(n, key)`, an aggregation, a join) hands a replayed reduce task the same rows
in another order whenever the map outputs are fetched in another order, and that replay must
still match. Nor does it depend on how rows were grouped into calls (`send` or `send_many`, the
row or the Arrow writer).

Each record hashes to 128 bits with XXH3: its value, seeded with the 64-bit XXH3 of its key
under its topic's seed (a fixed mark for a null key; a null value hashes as an empty one under a
flipped seed), and, when it has an explicit partition or headers, those folded into the seed as
well. The digest is the record count and the sum of the records' hashes modulo 2^128, so the
digest of several tasks' records together is the sum of theirs (`combine`). Two different
multisets of records share a digest only when hashes collide: about 2^-128 for records that
differ in their values, about 2^-64 for records that differ only outside their values (topic,
key, null-ness, partition, headers go through the 64-bit seed). Both are far below the chance
of undetected corruption under the brokers' own CRC-32C; the digest tells a replay from other
rows, not a forgery (XXH3 is not a cryptographic hash). File references (files mode) are
produced past it.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from itertools import repeat
from typing import cast

import xxhash

from kafka_txn_sink.protocol.output import Headers, Transaction

_hash128 = xxhash.xxh3_128_intdigest
_hash64 = xxhash.xxh3_64_intdigest

_MODULUS = 1 << 128
_MARK = "-m"  # between the count and the sum: earlier sink versions wrote CRCs after a "-"
_NULL_KEY = 0x6B65_792D_6E75_6C6C  # the seed of a record without a key ("key-null")
_NULL_VALUE = 0x7661_6C75_652D_6E75  # flips the seed of a record without a value


class DigestingTransaction:
    """A `Transaction` that digests every record it passes on to `txn`."""

    def __init__(self, txn: Transaction):
        self._txn = txn
        self._count = 0
        self._sum = 0  # of the records' hashes, reduced modulo 2^128 when read
        self._topic_seeds: dict[str, int] = {}

    def send(
        self,
        topic: str,
        value: bytes | None,
        key: bytes | None = None,
        partition: int | None = None,
        headers: Headers | None = None,
        timestamp_ms: int | None = None,
        undigested: Headers | None = None,
    ) -> None:
        """Produce one record into the transaction, and digest it (its timestamp too, when
        the row gives one: a replay of the same rows gives the same). `undigested` headers go
        after `headers` into the record but not into the digest (records/provenance.py)."""
        sent = headers if not undigested else [*(headers or []), *undigested]
        self._txn.send(topic, value, key, partition, sent, timestamp_ms)
        seed = _key_seed(key, self._topic_seed(topic))
        if partition is not None or headers:
            seed = _hash64(repr((partition, headers)).encode(), seed)
        if timestamp_ms is not None:
            seed = _hash64(timestamp_ms.to_bytes(8, "big", signed=True), seed)
        self._count += 1
        self._sum += _value_hash(value, seed)

    def send_many(
        self, topic: str, values: Sequence[bytes | None], keys: Sequence[bytes | None] | None
    ) -> None:
        """Produce `values[i]` with `keys[i]` to `topic`, for every i, and digest them."""
        self._txn.send_many(topic, values, keys)
        self._count += len(values)
        self._sum += sum_of_hashes(values, keys, self._topic_seed(topic))

    def partition_count(self, topic: str) -> int:
        """How many partitions `topic` has (the transaction's producer asks the brokers once).

        Raises:
            InputError: the topic does not exist (reason `topic`).
        """
        count: int = self._txn.partition_count(topic)  # type: ignore[attr-defined]
        return count

    def digest(self) -> str:
        """The digest of every record so far: their count, then 32 hex digits."""
        return _format(self._count, self._sum)

    def _topic_seed(self, topic: str) -> int:
        seed = self._topic_seeds.get(topic)
        if seed is None:
            seed = self._topic_seeds[topic] = _hash64(topic.encode())
        return seed


def combine(digests: Iterable[str]) -> str | None:
    """The digest of the records of several digests together; None when one is not of this
    kind (empty, or written by a sink version with another digest)."""
    count = total = 0
    for digest in digests:
        records, mark, hashes = digest.partition(_MARK)
        if not mark or not records.isdigit() or len(hashes) != 32:
            return None
        count += int(records)
        total += int(hashes, 16)
    return _format(count, total)


def sum_of_hashes(
    values: Sequence[bytes | None], keys: Sequence[bytes | None] | None, topic_seed: int
) -> int:
    """The sum of the hashes (not reduced) of the records `values[i]` with `keys[i]` to the
    topic of `topic_seed`, none with a partition or headers. Without nulls, one C-level map per
    column."""
    seeds: Iterable[int]
    if keys is None:
        seeds = repeat(topic_seed ^ _NULL_KEY)
    elif None in keys:
        seeds = [_key_seed(key, topic_seed) for key in keys]
    else:
        seeds = map(_hash64, cast("Sequence[bytes]", keys), repeat(topic_seed))
    if None in values:
        return sum(map(_value_hash, values, seeds))
    return sum(map(_hash128, cast("Sequence[bytes]", values), seeds))


def _format(count: int, total: int) -> str:
    return f"{count}{_MARK}{total % _MODULUS:032x}"


def _key_seed(key: bytes | None, topic_seed: int) -> int:
    return topic_seed ^ _NULL_KEY if key is None else _hash64(key, topic_seed)


def _value_hash(value: bytes | None, seed: int) -> int:
    return _hash128(b"", seed ^ _NULL_VALUE) if value is None else _hash128(value, seed)
