"""Opens a transaction the way a task does, prints its triple and offsets, and exits without
closing the producer: the transaction must stay open for another process to complete."""

from __future__ import annotations

import json
import sys

from kafka_txn_sink.kafka.producer import TaskTransaction
from kafka_txn_sink.kafka.producer_settings import producer_config


def main(bootstrap: str, txn_id: str, topic: str, rows: int, timeout_ms: int) -> None:
    txn = TaskTransaction(producer_config(bootstrap, {}, txn_id, timeout_ms), timeout_s=30)
    txn.init()
    for i in range(rows):
        txn.send(topic, value=f"{txn_id}:{i}".encode(), key=str(i).encode())
    prepared = txn.prepare()
    assert prepared is not None
    offsets = {
        t: {str(p): list(r) for p, r in parts.items()} for t, parts in prepared.offsets.items()
    }
    print(
        json.dumps(
            {
                "transactional_id": prepared.triple.transactional_id,
                "producer_id": prepared.triple.producer_id,
                "producer_epoch": prepared.triple.producer_epoch,
                "offsets": offsets,
            }
        ),
        flush=True,
    )
    txn.detach()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5]))
