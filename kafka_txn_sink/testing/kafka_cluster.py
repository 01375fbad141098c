"""A cluster of Apache Kafka nodes (KRaft) on loopback ports, for tests that kill one of them.

Every node is a broker and a voter of the controller quorum, started from the same jars and with
the same process handling as ``KafkaBroker``, so a cluster of three goes on when any one node
dies. Internal and new topics are replicated to every node with a majority as minimum ISR (3 and
2 for three nodes), as in production: a SIGKILLed node loses nothing that was acknowledged.

``transaction_coordinator`` names the node that leads the ``__transaction_state`` partition of a
transactional id, the node to kill to make its transactions fail over to another coordinator.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kafka_txn_sink.testing.errors import TestbedError
from kafka_txn_sink.testing.jars import default_kafka_version
from kafka_txn_sink.testing.kafka_broker import (
    BROKER_DEFAULTS_4X,
    CONTROLLER,
    KafkaBroker,
    admin_client,
    create_topic,
)
from kafka_txn_sink.testing.processes import LOOPBACK, free_port, wait_for

TRANSACTION_STATE_TOPIC = "__transaction_state"
OFFSETS_TOPIC = "__consumer_offsets"

_INT_MIN = -(2**31)


def java_string_hash(text: str) -> int:
    """Java's ``String.hashCode()``: over UTF-16 code units, in 32-bit two's complement."""
    data = text.encode("utf-16-be")
    value = 0
    for unit in struct.unpack(f">{len(data) // 2}H", data):
        value = (31 * value + unit) & 0xFFFFFFFF
    return value - 2**32 if value >= 2**31 else value


def transaction_state_partition(txn_id: str, partitions: int) -> int:
    """The ``__transaction_state`` partition of ``txn_id`` among ``partitions`` (and the
    ``__consumer_offsets`` partition of a group id), as the broker computes it
    (``Utils.abs(hashCode) % partitions``, where ``Utils.abs(MIN_VALUE)`` is 0)."""
    value = java_string_hash(txn_id)
    return (0 if value == _INT_MIN else abs(value)) % partitions


def cluster_config(nodes: int, transaction_state_partitions: int) -> dict[str, object]:
    """Broker settings of a cluster of ``nodes``: every internal and new topic on all nodes,
    a majority of them in sync for a write to count."""
    majority = nodes // 2 + 1
    config: dict[str, object] = {
        "transaction.state.log.replication.factor": nodes,
        "transaction.state.log.min.isr": majority,
        "transaction.state.log.num.partitions": transaction_state_partitions,
        "offsets.topic.replication.factor": nodes,
        "default.replication.factor": nodes,
        "min.insync.replicas": majority,
    }
    # The share-group state topic, when the version has one (3.9 just logs unknown keys).
    for key in BROKER_DEFAULTS_4X:
        config[key] = nodes if key.endswith("replication.factor") else majority
    return config


@dataclass
class Quorum:
    """What every node of one cluster shares: the cluster id and the controllers' addresses."""

    controller_ports: dict[int, int]
    cluster_id: str = ""

    def voters(self) -> str:
        """``controller.quorum.voters``: ``id@host:port`` of every node."""
        return ",".join(
            f"{node_id}@{LOOPBACK}:{port}" for node_id, port in self.controller_ports.items()
        )


class ClusterNode(KafkaBroker):
    """One node of a ``KafkaCluster``: a broker and a voter of the cluster's quorum."""

    def __init__(
        self,
        workdir: Path,
        node_id: int,
        ports: Mapping[str, int],
        quorum: Quorum,
        version: str,
        extra_config: Mapping[str, object],
        heap: str,
    ) -> None:
        super().__init__(workdir, version, {**extra_config, "node.id": node_id}, heap)
        self.node_id = node_id
        self._quorum = quorum
        self._ports = dict(ports)

    def _quorum_voters(self) -> str:
        return self._quorum.voters()

    def _cluster_id(self) -> str:
        if not self._quorum.cluster_id:
            raise TestbedError("the cluster id is set by KafkaCluster.start before a node starts")
        return self._quorum.cluster_id


class KafkaCluster:
    """``nodes`` combined broker+controller KRaft nodes on loopback, data under ``workdir``.

    Node ids are 1..nodes. ``kill`` a node (SIGKILL), ``launch`` it again (same ports, same
    data) and ``wait_healthy`` until it serves again and every partition is fully in sync.
    ``transaction_state_partitions`` defaults to 1: every transactional id then has the same
    coordinator, so killing it hits every open transaction at once.
    """

    def __init__(
        self,
        workdir: Path | str,
        nodes: int = 3,
        version: str | None = None,
        extra_config: Mapping[str, object] | None = None,
        heap: str = "384m",
        transaction_state_partitions: int = 1,
    ) -> None:
        self.workdir = Path(workdir).resolve()
        self.version = version or default_kafka_version()
        ports = _distinct_ports(nodes, list(KafkaBroker.LISTENERS))
        self._quorum = Quorum({node_id: ports[node_id][CONTROLLER] for node_id in ports})
        config = {**cluster_config(nodes, transaction_state_partitions), **(extra_config or {})}
        self.nodes = {
            node_id: ClusterNode(
                self.workdir / f"node{node_id}",
                node_id,
                ports[node_id],
                self._quorum,
                self.version,
                config,
                heap,
            )
            for node_id in ports
        }

    @property
    def bootstrap(self) -> str:
        """Every node's address, comma-separated: clients skip the nodes that are down."""
        return ",".join(node.bootstrap for node in self.nodes.values())

    def node(self, node_id: int) -> ClusterNode:
        """The node with ``node_id``."""
        if node_id not in self.nodes:
            raise TestbedError(f"no node {node_id} in the cluster (nodes {sorted(self.nodes)})")
        return self.nodes[node_id]

    # ---- lifecycle ----------------------------------------------------------------------------

    def start(self, timeout: float = 180.0) -> str:
        """Start every node that is not running and wait until the cluster is healthy."""
        if not self._quorum.cluster_id:
            self._quorum.cluster_id = self.nodes[1].new_cluster_id()
        for node in self.nodes.values():
            if not node.is_running():
                node.launch()
        self.wait_healthy(timeout)
        return self.bootstrap

    def launch(self, node_id: int) -> None:
        """Start a stopped node again without waiting for it (see ``wait_healthy``)."""
        node = self.node(node_id)
        if node.is_running():
            raise TestbedError(f"node {node_id} is running already")
        node.launch()

    def restart(self, node_id: int, timeout: float = 120.0) -> None:
        """Start a stopped node again and wait until the cluster is healthy."""
        self.launch(node_id)
        self.wait_healthy(timeout)

    def kill(self, node_id: int) -> None:
        """Crash one node: SIGKILL, no shutdown hooks."""
        self.node(node_id).kill()

    def stop(self) -> None:
        """End every node with SIGKILL: once the quorum is gone, the last nodes cannot shut
        down gracefully, and the data is scratch."""
        for node in self.nodes.values():
            node.kill()

    def running(self) -> list[int]:
        """The ids of the nodes whose process is alive."""
        return [node_id for node_id, node in self.nodes.items() if node.is_running()]

    def wait_healthy(self, timeout: float = 120.0) -> None:
        """Wait until every node serves transactions and every partition of every topic has a
        leader and all its replicas in sync."""
        stopped = [node_id for node_id, node in self.nodes.items() if not node.is_running()]
        if stopped:
            raise TestbedError(f"node(s) {stopped} are not running: launch them first")
        for node in self.nodes.values():
            node.wait_ready(timeout)
        wait_for(
            self._out_of_sync,
            timeout,
            "every partition fully in sync",
            on_timeout=lambda: f"out of sync: {self._lagging()}",
        )

    def _out_of_sync(self) -> bool | None:
        return True if not self._lagging() else None

    def _lagging(self) -> list[str]:
        """``topic[partition]`` of every partition without a leader or with a replica out of
        sync."""
        metadata = self._admin().list_topics(timeout=10)
        return [
            f"{name}[{number}]"
            for name, topic in metadata.topics.items()
            for number, partition in topic.partitions.items()
            if partition.leader < 0 or set(partition.isrs) != set(partition.replicas)
        ]

    # ---- topics and coordinators ------------------------------------------------------------

    def create_topic(
        self,
        name: str,
        partitions: int = 3,
        config: Mapping[str, str] | None = None,
        timeout: float = 30.0,
    ) -> str:
        """Create topic ``name`` with a replica on every node; returns the name."""
        create_topic(
            self.bootstrap, name, partitions, config, timeout, replication_factor=len(self.nodes)
        )
        return name

    def leader(self, topic: str, partition: int, timeout: float = 30.0) -> int:
        """The node leading ``topic[partition]`` (waits while it has none, e.g. in a fail-over)."""

        def led_by() -> int | None:
            found = self._admin().list_topics(topic=topic, timeout=10).topics.get(topic)
            if found is None or found.error is not None or partition not in found.partitions:
                return None
            leader = found.partitions[partition].leader
            return leader if leader >= 0 else None

        return wait_for(led_by, timeout, f"a leader of {topic}[{partition}]")

    def transaction_coordinator(self, txn_id: str, timeout: float = 30.0) -> int:
        """The node coordinating ``txn_id``: the leader of its ``__transaction_state``
        partition (the topic exists once any transactional producer has initialised)."""
        return self._coordinator(TRANSACTION_STATE_TOPIC, txn_id, timeout)

    def group_coordinator(self, group: str, timeout: float = 30.0) -> int:
        """The node coordinating consumer group ``group``: the leader of its
        ``__consumer_offsets`` partition (the topic exists once any group request was made)."""
        return self._coordinator(OFFSETS_TOPIC, group, timeout)

    def _coordinator(self, state_topic: str, key: str, timeout: float) -> int:
        def partition_count() -> int | None:
            found = self._admin().list_topics(topic=state_topic, timeout=10).topics.get(state_topic)
            if found is None or found.error is not None or not found.partitions:
                return None
            return len(found.partitions)

        count = wait_for(partition_count, timeout, f"the partitions of {state_topic}")
        return self.leader(state_topic, transaction_state_partition(key, count), timeout)

    def coordinators(self, txn_ids: Iterable[str], timeout: float = 30.0) -> dict[int, list[str]]:
        """Node id -> the ids of ``txn_ids`` it coordinates."""
        found: dict[int, list[str]] = {}
        for txn_id in txn_ids:
            found.setdefault(self.transaction_coordinator(txn_id, timeout), []).append(txn_id)
        return found

    def _admin(self) -> Any:
        return admin_client(self.bootstrap)

    def __repr__(self) -> str:
        return (
            f"KafkaCluster(version={self.version}, nodes={sorted(self.nodes)}, "
            f"workdir={self.workdir})"
        )


def _distinct_ports(nodes: int, listeners: list[str]) -> dict[int, dict[str, int]]:
    """Node id (1..nodes) -> listener -> a free loopback port (``free_port`` never gives one
    twice in a process)."""
    return {node_id: {name: free_port() for name in listeners} for node_id in range(1, nodes + 1)}
