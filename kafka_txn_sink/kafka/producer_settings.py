"""The settings of every transactional producer the sink opens (a task's, the progress
transaction's, a republish's), apart from the producer itself: the driver builds them for its
checks without loading the task's send path (pyarrow, the C loop).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

# The producer id and epoch are read from a statistics sample taken inside the transaction
# (after begin_transaction); prepare waits for one only when none has come yet, so this bounds
# that wait. A sample costs little: only its last object, `eos`, is decoded.
STATS_INTERVAL_MS = 25
MAX_MESSAGE_TIMEOUT_MS = 120_000
# The partitioner `send_many` computes itself (kafka/partitioner.py); with any other, it sends
# record by record and lets librdkafka partition.
KEY_HASH_PARTITIONER = "murmur2_random"


def producer_config(
    bootstrap: str, kafka: Mapping[str, str], txn_id: str, txn_timeout_ms: int
) -> dict[str, Any]:
    """Every setting the protocol depends on is set here explicitly; users tune the rest."""
    config: dict[str, Any] = {
        "partitioner": KEY_HASH_PARTITIONER,  # the partitions Java clients (and Spark's sink) pick
        "linger.ms": 20,
        # librdkafka 2.16 with sparse connections (its default) looks for the transaction
        # coordinator before it has connected to any broker, and then waits for a 50 ms or
        # 500 ms retry timer: init_transactions took 52-506 ms, against 2-7 ms when every
        # known broker is connected at once (measured on the test bed's broker).
        "enable.sparse.connections": False,
        "socket.timeout.ms": 30_000,
        "message.timeout.ms": min(MAX_MESSAGE_TIMEOUT_MS, txn_timeout_ms),
    }
    config.update(kafka)
    config.update(
        {
            "bootstrap.servers": bootstrap,
            "transactional.id": txn_id,
            "enable.idempotence": True,
            "acks": "all",
            "transaction.timeout.ms": txn_timeout_ms,
            "statistics.interval.ms": STATS_INTERVAL_MS,
        }
    )
    # librdkafka refuses a producer whose waits exceed its transaction timeout.
    for name in ("message.timeout.ms", "socket.timeout.ms"):
        config[name] = min(int(config[name]), txn_timeout_ms)
    return config
