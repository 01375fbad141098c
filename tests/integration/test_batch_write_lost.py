"""A batch write re-run after its rows were recorded lost fails, naming them, on the real broker.

The loss is made as the brokers' transaction timeout makes it: write `nightly` prepared a
participant, its batch was decided, and the participant was aborted before the driver could
commit it (fenced here, as the coordinator's timeout abort would). Completing the batch records
the loss (`TransactionLostError`, once). Re-running the write with the same writeId goes through
the data source's `writer()`, the driver's start of a batch write, as Spark calls it: it must
fail naming the write, the batch and the lost rows, publish nothing and leave nothing open.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
from pyspark.sql.types import StringType, StructField, StructType

from kafka_txn_sink.commit_log import JsonCommitLog
from kafka_txn_sink.datasource import KafkaTxnDataSource
from kafka_txn_sink.errors import TransactionLostError
from kafka_txn_sink.kafka.cluster import Cluster
from kafka_txn_sink.kafka.producer import TaskTransaction, producer_config
from kafka_txn_sink.kafka.txn_admin import TxnAdmin
from kafka_txn_sink.protocol.batch_writer import KafkaTxnBatchWriter
from kafka_txn_sink.protocol.complete import Settler
from kafka_txn_sink.protocol.messages import Decision, Participant, SinkMeta
from kafka_txn_sink.protocol.prepare import write_query_id
from kafka_txn_sink.protocol.txn_ids import transactional_id
from kafka_txn_sink.storage import LocalStorage
from kafka_txn_sink.testing.topics import read_topic
from tests.e2e.harness import create_topics, open_transactions

pytestmark = pytest.mark.kafka

SCHEMA = StructType([StructField("key", StringType()), StructField("value", StringType())])
ROWS = 7


@dataclass
class Sink:
    bootstrap: str
    sink_id: str
    topic: str
    log_dir: Path
    commit_log: JsonCommitLog

    def options(self, write_id: str) -> dict[str, str]:
        return {
            "kafka.bootstrap.servers": self.bootstrap,
            "sinkId": self.sink_id,
            "commitLog": str(self.log_dir),
            "topic": self.topic,
            "writeId": write_id,
            "transactionTimeoutMs": "600000",
        }


@pytest.fixture
def sink(kafka_bootstrap: str, tmp_path: Path, unique: Callable[[str], str]) -> Sink:
    sink_id, topic = unique("lostw"), unique("out")
    create_topics(kafka_bootstrap, 1, topic)
    commit_log = JsonCommitLog(LocalStorage(tmp_path / "log"))
    commit_log.create(SinkMeta(sink_id, created_at_ms=int(time.time() * 1000)))
    return Sink(kafka_bootstrap, sink_id, topic, tmp_path / "log", commit_log)


def aborted_participant(sink: Sink, partition: int) -> Participant:
    """A participant of write `nightly` that prepared ROWS rows and was then aborted."""
    config = producer_config(
        sink.bootstrap, {}, transactional_id(sink.sink_id, partition, slot=0), 600_000
    )
    txn = TaskTransaction(config, 30)
    txn.init()
    for n in range(ROWS):
        txn.send(sink.topic, value=f"nightly-{partition}-{n}".encode(), key=str(n).encode())
    prepared = txn.prepare()
    txn.detach()
    assert prepared is not None
    fence = TaskTransaction(config, 30)
    fence.init()  # aborts the prepared transaction, as the coordinator's timeout would
    fence.abort()
    fence.detach()
    return Participant(partition, 0, prepared.triple, prepared.rows, prepared.offsets)


def write_decided_then_lost(sink: Sink) -> Participant:
    """Write `nightly` as batch 0: decided, then its participant lost; the loss recorded."""
    lost = aborted_participant(sink, 1)
    decision = Decision(
        sink.sink_id,
        write_query_id("nightly"),
        0,
        (lost,),
        tasks=2,
        rows=ROWS,
        decided_at_ms=int(time.time() * 1000),
        run=0,
    )
    sink.commit_log.put_decision(decision)
    settler = Settler(
        sink.sink_id, sink.commit_log, TxnAdmin(sink.bootstrap, {}), Cluster(sink.bootstrap, {}), 30
    )
    with pytest.raises(TransactionLostError):
        settler.complete_or_raise_loss(decision)
    completion = sink.commit_log.completion(0)
    assert completion is not None and [x.partition for x in completion.lost] == [1]
    return lost


def test_rerunning_a_write_whose_rows_were_recorded_lost_fails_naming_them(sink: Sink) -> None:
    lost = write_decided_then_lost(sink)

    with pytest.raises(TransactionLostError) as caught:
        KafkaTxnDataSource(sink.options("nightly")).writer(SCHEMA, overwrite=False)

    message = str(caught.value)
    assert "write 'nightly'" in message and "batch 0" in message
    assert f"Spark partition 1 ({lost.transactional_id}, {ROWS} row(s)" in message
    assert "repair" in message and "not available yet" in message
    assert "new writeId" in message and "kafka-txn-sink verify" in message
    assert read_topic(sink.bootstrap, sink.topic) == []  # nothing published, before or now
    assert open_transactions(sink.bootstrap, sink.sink_id) == []
    owners = sink.commit_log.owners()
    assert [o.run for o in owners] == [0]
    assert sink.commit_log.released_runs() == {0}  # the refused re-run holds no slot


def test_a_new_write_id_after_the_loss_is_the_next_batch(sink: Sink) -> None:
    write_decided_then_lost(sink)

    writer = KafkaTxnDataSource(sink.options("nightly-again")).writer(SCHEMA, overwrite=False)

    assert isinstance(writer, KafkaTxnBatchWriter)
    assert writer.batch.batch_id == 1
