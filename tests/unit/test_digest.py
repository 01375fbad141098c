"""The digest of a task's records (records/digest.py): what a repair matches a replay by."""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from kafka_txn_sink.records.digest import DigestingTransaction, combine


@dataclass
class Sink:
    """A transaction that keeps what it was given."""

    records: list[tuple[Any, ...]] = field(default_factory=list)

    def send(
        self,
        topic: str,
        value: bytes | None,
        key: bytes | None = None,
        partition: int | None = None,
        headers: list[tuple[str, bytes | None]] | None = None,
        timestamp_ms: int | None = None,
    ) -> None:
        self.records.append((topic, value, key, partition, headers))

    def send_many(
        self, topic: str, values: Sequence[bytes | None], keys: Sequence[bytes | None] | None
    ) -> None:
        for i, value in enumerate(values):
            self.records.append((topic, value, keys[i] if keys else None, None, None))


VALUES = [f"value-{i}".encode() for i in range(100)] + [None, b""]
KEYS = [f"k{i % 7}".encode() for i in range(101)] + [None]


def digest_in_groups(size: int, values: list[bytes | None] = VALUES) -> str:
    txn = DigestingTransaction(Sink())
    for start in range(0, len(values), size):
        txn.send_many("out", values[start : start + size], KEYS[start : start + size])
    return txn.digest()


def test_the_digest_does_not_depend_on_the_order_of_the_records() -> None:
    """What a shuffle before the sink does to a replayed task (issue 39): the same records,
    in another order, grouped into other calls, by both paths."""
    records = list(zip(VALUES, KEYS, strict=True))
    shuffled = records[:]
    random.Random(39).shuffle(shuffled)
    assert shuffled != records
    first = DigestingTransaction(Sink())
    first.send_many("out", [v for v, _ in records], [k for _, k in records])
    replay = DigestingTransaction(Sink())
    for value, key in shuffled[:40]:
        replay.send("out", value, key)
    rest = shuffled[40:]
    replay.send_many("out", [v for v, _ in rest], [k for _, k in rest])
    assert replay.digest() == first.digest()
    # Across topics, partitions and headers too.
    mixed = [("a", b"1", None, 0, None), ("b", b"1", b"k", None, [("h", b"x")]), ("a", None, b"")]
    assert digest_of(mixed) == digest_of(mixed[::-1])


def digest_of(records: list[tuple[Any, ...]]) -> str:
    txn = DigestingTransaction(Sink())
    for record in records:
        txn.send(*record)
    return txn.digest()


def test_records_that_differ_in_one_part_have_another_digest() -> None:
    base: list[tuple[Any, ...]] = [("out", b"v", b"k", None, None), ("out", b"w", None, None, None)]
    assert digest_of(base).startswith("2-")
    variants: list[list[tuple[Any, ...]]] = [
        [("out", b"k", b"v", None, None), base[1]],  # key and value swapped
        [("out2", b"v", b"k", None, None), base[1]],  # another topic
        [("out", b"v", b"", None, None), base[1]],  # an empty key, not the key
        [base[0], ("out", b"w", b"", None, None)],  # an empty key, not a null one
        [base[0], ("out", b"", None, None, None)],  # an empty value
        [base[0], ("out", None, None, None, None)],  # a null value
        [("out", b"v", b"k", 0, None), base[1]],  # an explicit partition
        [("out", b"v", b"k", None, [("h", None)]), base[1]],  # a header
        [base[0], base[0]],  # one record twice, the other not at all
    ]
    digests = {digest_of(v) for v in variants}
    assert len(digests) == len(variants) and digest_of(base) not in digests


def test_the_digest_does_not_depend_on_how_rows_are_grouped_into_calls() -> None:
    one_by_one = DigestingTransaction(Sink())
    for value, key in zip(VALUES, KEYS, strict=True):
        one_by_one.send("out", value, key)
    assert {digest_in_groups(n) for n in (1, 7, 4096)} == {one_by_one.digest()}


def test_the_records_reach_the_transaction_unchanged() -> None:
    sink = Sink()
    txn = DigestingTransaction(sink)
    txn.send_many("out", VALUES[:2], KEYS[:2])
    txn.send("other", b"v", b"k", partition=3, headers=[("h", b"x")])
    assert sink.records == [
        ("out", b"value-0", b"k0", None, None),
        ("out", b"value-1", b"k1", None, None),
        ("other", b"v", b"k", 3, [("h", b"x")]),
    ]


def test_other_records_have_another_digest() -> None:
    base = digest_in_groups(10)
    assert base.startswith("102-")
    changed = [*VALUES]
    changed[50] = b"value-5O"
    assert digest_in_groups(10, changed) != base
    # The same value once more and another once less: a multiset, not a set.
    assert digest_in_groups(10, [VALUES[1], *VALUES[1:]]) != base
    # A null and an empty value differ, and so do the same bytes split across two values.
    assert digest_in_groups(10, [*VALUES[:100], b"", None]) != base
    assert digest_in_groups(10, [b"ab", b"c", *VALUES[2:]]) != digest_in_groups(
        10, [b"a", b"bc", *VALUES[2:]]
    )


def test_topics_partitions_headers_and_timestamps_count() -> None:
    def one(topic: str, partition: int | None, headers: Any, stamp: int | None = None) -> str:
        txn = DigestingTransaction(Sink())
        txn.send(topic, b"v", b"k", partition, headers, stamp)
        return txn.digest()

    plain = one("out", None, None)
    assert one("out2", None, None) != plain
    assert one("out", 1, None) != plain
    assert one("out", None, [("h", b"1")]) != plain
    assert one("out", None, None, 1772951400123) != plain
    assert one("out", None, None, 1772951400123) != one("out", None, None, 1772951400124)


def test_records_without_keys_and_empty_values_digest_alike_on_both_paths() -> None:
    values: list[bytes | None] = [b"", b"", None, b"x"]
    many = DigestingTransaction(Sink())
    many.send_many("out", values, None)
    one_by_one = DigestingTransaction(Sink())
    for value in values:
        one_by_one.send("out", value, None)
    assert many.digest() == one_by_one.digest()
    empty_not_null = DigestingTransaction(Sink())
    empty_not_null.send_many("out", [b"", b"", b"", b"x"], None)
    assert many.digest() != empty_not_null.digest()


def test_the_digests_of_several_tasks_combine_into_the_digest_of_their_records() -> None:
    """What lets a repair take a replay whose rows moved between tasks (round-robin
    `repartition(n)`): the lost transactions' records together against the replay's."""
    records = list(zip(VALUES, KEYS, strict=True))
    whole = DigestingTransaction(Sink())
    whole.send_many("out", [v for v, _ in records], [k for _, k in records])
    parts = [DigestingTransaction(Sink()) for _ in range(3)]
    for index, (value, key) in enumerate(records):
        parts[index % 3].send("out", value, key)
    assert combine(p.digest() for p in parts) == whole.digest()
    assert combine(p.digest() for p in parts[:2]) != whole.digest()
    assert combine([]) == DigestingTransaction(Sink()).digest()
    # A digest of an earlier sink version (CRCs) or none at all combines with nothing.
    assert combine([whole.digest(), "102-" + "0" * 48]) is None
    assert combine([whole.digest(), ""]) is None
