"""The three-node test bed's pure parts: which `__transaction_state` partition coordinates a
transactional id (as the broker computes it), and the settings that make a node loss harmless."""

from __future__ import annotations

from pathlib import Path

import pytest

from kafka_txn_sink.testing.kafka_cluster import (
    KafkaCluster,
    cluster_config,
    java_string_hash,
    transaction_state_partition,
)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("", 0),
        ("hello", 99162322),
        ("Aa", 2112),
        ("BB", 2112),  # Java's classic collision
        ("polygenelubricants", -(2**31)),  # the one hash whose abs() is negative in Java
        ("é𝄞", 1996307),  # a BMP char and a surrogate pair: UTF-16 code units
    ],
)
def test_java_string_hash_matches_java(text: str, expected: int) -> None:
    assert java_string_hash(text) == expected


def test_the_partition_is_the_brokers_abs_hash_modulo_the_partitions() -> None:
    assert transaction_state_partition("hello", 50) == 99162322 % 50
    assert transaction_state_partition("polygenelubricants", 7) == 0
    negative = "sink_orders-3"
    assert java_string_hash(negative) < 0
    assert transaction_state_partition(negative, 50) == abs(java_string_hash(negative)) % 50
    assert transaction_state_partition(negative, 1) == 0


def test_three_nodes_survive_losing_one() -> None:
    config = cluster_config(nodes=3, transaction_state_partitions=1)

    assert config["transaction.state.log.replication.factor"] == 3
    assert config["transaction.state.log.min.isr"] == 2
    assert config["offsets.topic.replication.factor"] == 3
    assert config["default.replication.factor"] == 3
    assert config["min.insync.replicas"] == 2
    assert config["transaction.state.log.num.partitions"] == 1


def test_every_node_votes_and_has_ports_of_its_own(tmp_path: Path) -> None:
    cluster = KafkaCluster(tmp_path, version="4.4.0")
    voters = cluster.nodes[1].config()["controller.quorum.voters"]
    addresses = [node.bootstrap for node in cluster.nodes.values()]

    assert [n.config()["node.id"] for n in cluster.nodes.values()] == [1, 2, 3]
    assert all(n.config()["controller.quorum.voters"] == voters for n in cluster.nodes.values())
    assert [v.split("@")[0] for v in str(voters).split(",")] == ["1", "2", "3"]
    assert len(set(addresses)) == 3 and cluster.bootstrap == ",".join(addresses)
    assert cluster.running() == []
