"""A batch write re-run after its rows were recorded lost repairs them, on the real broker; one
whose lost rows a repair refused fails, naming them.

The loss is made as the brokers' transaction timeout makes it: write `nightly` prepared a
participant, its batch was decided, and the participant was aborted before the driver could
commit it (fenced here, as the coordinator's timeout abort would). Completing the batch records
the loss (`TransactionLostError`). Re-running the write with the same writeId goes through the
data source's `writer()`, the driver's start of a batch write, as Spark calls it: its tasks get
the repair of the lost participant to write (protocol/repair.py); if a repair refused it
before, the re-run fails naming the write, the batch and the lost rows, publishes nothing and
leaves nothing open.
"""

from __future__ import annotations

import time
from dataclasses import replace

import pytest
from pyspark.sql.types import StringType, StructField, StructType

from kafka_txn_sink.datasource import KafkaTxnDataSource
from kafka_txn_sink.errors import TransactionLostError
from kafka_txn_sink.kafka.cluster import Cluster
from kafka_txn_sink.kafka.producer import TaskTransaction
from kafka_txn_sink.kafka.producer_settings import producer_config
from kafka_txn_sink.kafka.txn_admin import TxnAdmin
from kafka_txn_sink.protocol.batch_writer import KafkaTxnBatchWriter
from kafka_txn_sink.protocol.complete import Settler
from kafka_txn_sink.protocol.messages import Decision, Participant
from kafka_txn_sink.protocol.txn_ids import transactional_id
from kafka_txn_sink.protocol.write_ids import write_query_id
from kafka_txn_sink.testing.topics import read_topic
from tests.e2e.harness import open_transactions
from tests.integration.test_cli_cluster import Sink, prepare, sink

__all__ = ["sink"]  # the fixture

pytestmark = pytest.mark.kafka

SCHEMA = StructType([StructField("key", StringType()), StructField("value", StringType())])


def options(sink: Sink, write_id: str) -> dict[str, str]:
    """The options of batch write `write_id` to `sink`."""
    return {
        "kafka.bootstrap.servers": sink.bootstrap,
        "sinkId": sink.sink_id,
        "commitLog": str(sink.log_dir),
        "topic": sink.topic,
        "writeId": write_id,
        "transactionTimeoutMs": "600000",
    }


def aborted_participant(sink: Sink, partition: int) -> Participant:
    """A participant of write `nightly` that prepared ROWS rows and was then aborted."""
    txn_id = transactional_id(sink.sink_id, partition, slot=0)
    participant = prepare(sink, txn_id, 600_000)  # another process, as a Spark task
    fence = TaskTransaction(producer_config(sink.bootstrap, {}, txn_id, 600_000), 30)
    fence.init()  # aborts the prepared transaction, as the coordinator's timeout would
    fence.detach()
    return participant


def write_decided_then_lost(sink: Sink) -> Participant:
    """Write `nightly` as batch 0: decided, then its participant lost; the loss recorded."""
    lost = aborted_participant(sink, 1)
    decision = Decision(
        sink.sink_id,
        write_query_id("nightly"),
        0,
        (lost,),
        tasks=2,
        rows=lost.rows,
        decided_at_ms=int(time.time() * 1000),
        run=0,
    )
    sink.log.put_decision(decision)
    settler = Settler(
        sink.sink_id, sink.log, TxnAdmin(sink.bootstrap, {}), Cluster(sink.bootstrap, {}), 30
    )
    with pytest.raises(TransactionLostError):
        settler.complete_or_raise_loss(decision)
    completion = sink.log.completion(0)
    assert completion is not None and [x.partition for x in completion.lost] == [1]
    return lost


def test_rerunning_a_write_whose_rows_were_recorded_lost_plans_their_repair(sink: Sink) -> None:
    lost = write_decided_then_lost(sink)

    writer = KafkaTxnDataSource(options(sink, "nightly")).writer(SCHEMA, overwrite=False)

    assert isinstance(writer, KafkaTxnBatchWriter)
    assert writer.batch.batch_id == 0
    repair = writer.plan.repair
    assert repair is not None and (repair.batch_id, repair.level) == (0, 1)
    assert [x.triple for x in repair.lost] == [lost.triple]
    assert read_topic(sink.bootstrap, sink.topic) == []
    assert sink.log.released_runs() == set()  # the re-run holds its slot: it writes


def test_rerunning_a_write_whose_lost_rows_a_repair_refused_fails_naming_them(
    sink: Sink,
) -> None:
    lost = write_decided_then_lost(sink)
    decision, completion = sink.log.decision(0), sink.log.completion(0)
    assert decision is not None and completion is not None
    refused = replace(
        decision, participants=(), level=1, refused=completion.lost, run=0, tasks=2, rows=0
    )
    sink.log.put_repair(refused)
    sink.log.put_completion(replace(completion, lost=(), level=1))

    with pytest.raises(TransactionLostError) as caught:
        KafkaTxnDataSource(options(sink, "nightly")).writer(SCHEMA, overwrite=False)

    message = str(caught.value)
    assert "write 'nightly'" in message and "batch 0" in message
    assert f"Spark partition 1 ({lost.transactional_id}, {lost.rows} row(s)" in message
    assert "did not produce the same rows" in message
    assert "new writeId" in message and "kafka-txn-sink verify" in message
    assert read_topic(sink.bootstrap, sink.topic) == []  # nothing published, before or now
    assert open_transactions(sink.bootstrap, sink.sink_id) == []
    assert [o.run for o in sink.log.owners()] == [0]
    assert sink.log.released_runs() == {0}  # the refused re-run holds no slot


def test_a_new_write_id_after_the_loss_is_the_next_batch(sink: Sink) -> None:
    write_decided_then_lost(sink)

    writer = KafkaTxnDataSource(options(sink, "nightly-again")).writer(SCHEMA, overwrite=False)

    assert isinstance(writer, KafkaTxnBatchWriter)
    assert writer.batch.batch_id == 1
