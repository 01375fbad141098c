from __future__ import annotations

import pytest

from kafka_txn_sink.protocol.txn_ids import (
    id_pattern,
    owns,
    partition_of,
    republish_id,
    slot_of,
    transactional_id,
)


def test_ids_are_sink_dash_slot_dash_partition() -> None:
    assert transactional_id("orders.v2", 7, slot=3) == "orders.v2-3-7"
    assert partition_of("orders.v2", "orders.v2-3-7") == 7
    assert slot_of("orders.v2", "orders.v2-3-7") == 3


def test_ids_from_before_slots_still_belong_to_the_sink() -> None:
    assert partition_of("orders", "orders-7") == 7
    assert slot_of("orders", "orders-7") is None


def test_slots_are_a_bounded_pool() -> None:
    with pytest.raises(ValueError, match="slot"):
        transactional_id("orders", 0, slot=4)


@pytest.mark.parametrize(
    ("txn_id", "owned"),
    [
        ("orders-0", True),
        ("orders-123", True),
        ("orders_b-0", False),  # another sink sharing the prefix
        ("orders-0-1", True),
        ("orders-0-1-2", False),
        ("orders-0-republish", False),
        ("orders-", False),
        ("xorders-1", False),
        ("orders-1x", False),
        ("orders-republish", True),
        ("orders_b-republish", False),
        ("orders-republish-0", False),
    ],
)
def test_only_exactly_this_sinks_ids_match(txn_id: str, owned: bool) -> None:
    assert owns("orders", txn_id) is owned


def test_dots_in_sink_ids_are_literal() -> None:
    assert id_pattern("a.b").match("a.b-1")
    assert not id_pattern("a.b").match("axb-1")


def test_the_republish_id_is_the_sinks_but_no_partitions() -> None:
    assert republish_id("orders") == "orders-republish"
    with pytest.raises(ValueError, match="not a transactional id"):
        partition_of("orders", "orders-republish")
