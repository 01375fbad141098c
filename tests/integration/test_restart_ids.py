"""Restarts of a sink keep the brokers' set of its transactional ids bounded (issue 14).

Each restart is a new driver (a new run of the query, `protocol/runs.py`) that takes an id slot,
prepares a batch on the real broker through the task's producer, and decides and completes it
through the driver's `commit()`. However many runs there were, the brokers know at most
SLOTS x partitions task ids of the sink (ListTransactions counts them), and every row is seen
once at read_committed.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest

from kafka_txn_sink.commit_log import open_commit_log
from kafka_txn_sink.kafka.producer import TaskTransaction
from kafka_txn_sink.kafka.txn_admin import TxnAdmin
from kafka_txn_sink.options import SinkOptions, parse_options
from kafka_txn_sink.protocol import runs
from kafka_txn_sink.protocol.decide import commit_batch
from kafka_txn_sink.protocol.runs import RunRef, take_over
from kafka_txn_sink.protocol.task_commit import TaskCommit
from kafka_txn_sink.protocol.txn_ids import SLOTS, owns, transactional_id
from kafka_txn_sink.testing import create_topic
from kafka_txn_sink.testing.topics import read_topic

pytestmark = [pytest.mark.kafka]

PARTITIONS = 2
# 100 in the count; KTS_RESTARTS lowers it for a quick look.
RESTARTS = int(os.environ.get("KTS_RESTARTS", "100"))


def prepare(options: SinkOptions, run: RunRef, batch_id: int, partition: int) -> TaskCommit:
    """What a task of `run` returns after preparing its rows: one record, transaction open."""
    txn_id = transactional_id(options.sink_id, partition, slot=run.slot)
    txn = TaskTransaction(options.producer_config(txn_id), options.client_timeout_s)
    try:
        txn.init()
        assert options.topic is not None
        txn.send(options.topic, value=f"{batch_id}-{partition}".encode(), partition=partition)
        prepared = txn.prepare()
    finally:
        txn.detach()
    assert prepared is not None
    return TaskCommit(
        "query-1",
        batch_id,
        partition,
        0,
        "prepared",
        rows=prepared.rows,
        triple=prepared.triple,
        offsets=prepared.offsets,
        prepared_at_ms=prepared.prepared_at_ms,
    )


def test_a_hundred_restarts_leave_a_bounded_set_of_ids(
    kafka_bootstrap: str,
    tmp_path: Path,
    unique: Callable[[str], str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    topic = unique("restarts_out")
    create_topic(kafka_bootstrap, topic, partitions=PARTITIONS)
    options = parse_options(
        {
            "kafka.bootstrap.servers": kafka_bootstrap,
            "topic": topic,
            "sinkId": unique("restarts"),
            "commitLog": str(tmp_path / "log"),
            "commitTimeoutMs": "5000",
            "commitLogTimeoutMs": "5000",
            "clockSkewMs": "1000",
        }
    # Well above the margin these settings make (58.3 s): with 60 s, a prepare that took 2.1 s on
    # a loaded machine left too little time and the batch was refused as too old.
    ).with_transaction_timeout(120_000)
    commit_log = open_commit_log(options.commit_log)

    for restart in range(RESTARTS):
        monkeypatch.setattr(runs, "driver_identity", lambda r=restart: f"driver-{r}")
        owner = take_over(options.sink_id, commit_log, fresh_ms=0)
        run = RunRef(owner.run, owner.slot)
        tasks = [prepare(options, run, restart, p) for p in range(PARTITIONS)]
        commit_batch(options, tasks, restart, run)

    with TxnAdmin(kafka_bootstrap, {}) as txn_admin:
        known = sorted(i for i in txn_admin.list_ids() if owns(options.sink_id, i))
    print(f"{RESTARTS} restarts: the brokers know {len(known)} ids of the sink: {known}")
    assert len(known) <= SLOTS * PARTITIONS
    assert [o.run for o in commit_log.owners()] == list(range(RESTARTS))
    seen = [r.value.decode() for r in read_topic(kafka_bootstrap, topic) if r.value]
    assert sorted(seen) == sorted(f"{b}-{p}" for b in range(RESTARTS) for p in range(PARTITIONS))
