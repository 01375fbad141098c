"""The digest of a task's records (records/digest.py): what a repair matches a replay by."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from kafka_txn_sink.records.digest import DigestingTransaction


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
    swapped = [*VALUES]
    swapped[1], swapped[2] = swapped[2], swapped[1]
    assert digest_in_groups(10, swapped) != base
    # A null and an empty value differ, and so do the same bytes split across two values.
    assert digest_in_groups(10, [*VALUES[:100], b"", None]) != base
    assert digest_in_groups(10, [b"ab", b"c", *VALUES[2:]]) != digest_in_groups(
        10, [b"a", b"bc", *VALUES[2:]]
    )


def test_topics_partitions_and_headers_count() -> None:
    def one(topic: str, partition: int | None, headers: Any) -> str:
        txn = DigestingTransaction(Sink())
        txn.send(topic, b"v", b"k", partition, headers)
        return txn.digest()

    plain = one("out", None, None)
    assert one("out2", None, None) != plain
    assert one("out", 1, None) != plain
    assert one("out", None, [("h", b"1")]) != plain


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
