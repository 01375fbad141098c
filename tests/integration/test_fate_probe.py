"""Settling a participant whose EndTxn failed, on a real broker, when its records are not all
there any more.

The settler reads a participant's records back (the fate probe) to learn whether the broker
committed or aborted it. Retention or deleteRecords may have removed some or all of them since:
a missing record is no evidence of an abort. Each test commits or aborts one transaction,
removes records with deleteRecords, and settles a decision naming it with a triple the
coordinator no longer maps (INVALID_PRODUCER_ID_MAPPING, as for an expired transactional id).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
from confluent_kafka import OFFSET_END, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from kafka_txn_sink.commit_log import JsonCommitLog
from kafka_txn_sink.errors import TransactionFateUnknownError
from kafka_txn_sink.kafka.admin_api import Fate
from kafka_txn_sink.kafka.cluster import Cluster
from kafka_txn_sink.kafka.producer import Prepared, TaskTransaction
from kafka_txn_sink.kafka.producer_settings import producer_config
from kafka_txn_sink.kafka.txn_admin import TxnAdmin
from kafka_txn_sink.protocol.complete import Settler
from kafka_txn_sink.protocol.messages import Decision, Participant, Triple
from kafka_txn_sink.protocol.run_records import SinkMeta
from kafka_txn_sink.protocol.txn_ids import transactional_id
from kafka_txn_sink.storage import LocalStorage
from kafka_txn_sink.testing.topics import read_topic
from tests.e2e.harness import create_topics

pytestmark = pytest.mark.kafka

TIMEOUT_MS = 60_000
BATCH = 7


@dataclass
class Bed:
    bootstrap: str
    sink_id: str
    topic: str
    commit_log: JsonCommitLog

    def settler(self) -> Settler:
        return Settler(
            self.sink_id,
            self.commit_log,
            TxnAdmin(self.bootstrap, {}),
            Cluster(self.bootstrap, {}, timeout_ms=10_000),
            deadline_s=30,
        )


@pytest.fixture
def bed(kafka_bootstrap: str, tmp_path: Path, unique: Callable[[str], str]) -> Bed:
    sink_id, topic = unique("fate"), unique("out")
    create_topics(kafka_bootstrap, 2, topic)
    commit_log = JsonCommitLog(LocalStorage(tmp_path / "log"))
    commit_log.create(SinkMeta(sink_id, created_at_ms=int(time.time() * 1000)))
    return Bed(kafka_bootstrap, sink_id, topic, commit_log)


def finished(
    bed: Bed, rows: dict[int, int], commit: bool, keys: tuple[bytes, ...] = ()
) -> Prepared:
    """One transaction with `rows[p]` records in partition p (with `keys`, one record per key
    in partition 0), committed or aborted."""
    txn_id = transactional_id(bed.sink_id, 0, slot=0)
    config = producer_config(bed.bootstrap, {}, txn_id, TIMEOUT_MS)
    txn = TaskTransaction(config, 30)
    txn.init()
    for partition, count in rows.items():
        for i in range(count):
            txn.send(bed.topic, value=f"{partition}-{i}".encode(), partition=partition)
    for key in keys:
        txn.send(bed.topic, value=b"v", key=key, partition=0)
    prepared = txn.prepare()
    txn.detach()
    assert prepared is not None
    with TxnAdmin(bed.bootstrap, {}) as txn_admin:
        [result] = txn_admin.end_transactions([prepared.triple], commit=commit, deadline_s=30)
    assert result.ok, result.error
    return prepared


def delete_before(bed: Bed, partition: int, offset: int) -> None:
    """deleteRecords: every record of the partition below `offset` (OFFSET_END: all)."""
    admin = AdminClient({"bootstrap.servers": bed.bootstrap})
    [future] = admin.delete_records([TopicPartition(bed.topic, partition, offset)]).values()
    future.result(timeout=30)


def decide(bed: Bed, prepared: Prepared) -> Decision:
    """A decision naming the transaction with a producer id its coordinator does not map."""
    triple = prepared.triple
    expired = Triple(triple.transactional_id, triple.producer_id + 1000, triple.producer_epoch)
    participant = Participant(0, 0, expired, prepared.rows, prepared.offsets)
    decision = Decision(
        sink_id=bed.sink_id,
        query_id="q",
        batch_id=BATCH,
        participants=(participant,),
        tasks=1,
        rows=prepared.rows,
        decided_at_ms=int(time.time() * 1000),
    )
    bed.commit_log.put_decision(decision)
    return decision


def test_a_committed_transaction_whose_first_record_was_deleted_is_not_lost(bed: Bed) -> None:
    prepared = finished(bed, {0: 3}, commit=True)
    first, _ = prepared.offsets[bed.topic][0]
    delete_before(bed, 0, first + 1)

    settled = bed.settler().complete(decide(bed, prepared))

    assert settled.completion.lost == ()


def test_a_committed_transaction_is_read_from_a_partition_still_there(bed: Bed) -> None:
    prepared = finished(bed, {0: 2, 1: 2}, commit=True)
    delete_before(bed, 0, OFFSET_END)

    settled = bed.settler().complete(decide(bed, prepared))

    assert settled.completion.lost == ()


def test_a_transaction_whose_records_are_all_gone_stops_the_batch(bed: Bed) -> None:
    prepared = finished(bed, {0: 3}, commit=True)
    first, last = prepared.offsets[bed.topic][0]
    delete_before(bed, 0, OFFSET_END)
    decision = decide(bed, prepared)

    with pytest.raises(TransactionFateUnknownError) as caught:
        bed.settler().complete(decision)

    message = str(caught.value)
    for part in (
        f"batch {BATCH}",
        "Spark partition 0",
        prepared.triple.transactional_id,
        f"{bed.topic}[0]@{first}-{last}",
        "log start",
        "retention or deleteRecords",
        "by hand",
    ):
        assert part in message, message
    assert bed.commit_log.completion(BATCH) is None
    with pytest.raises(TransactionFateUnknownError, match="gone"):
        bed.settler().complete(decision)  # asked again, the same answer: never a loss


def test_an_aborted_transaction_whose_records_are_there_is_still_lost(bed: Bed) -> None:
    prepared = finished(bed, {0: 3}, commit=False)

    settled = bed.settler().complete(decide(bed, prepared))

    assert [x.partition for x in settled.completion.lost] == [0]


def test_an_aborted_transaction_whose_first_record_was_deleted_is_still_lost(bed: Bed) -> None:
    prepared = finished(bed, {0: 3}, commit=False)
    first, _ = prepared.offsets[bed.topic][0]
    delete_before(bed, 0, first + 1)

    settled = bed.settler().complete(decide(bed, prepared))

    assert [x.partition for x in settled.completion.lost] == [0]


def test_records_removed_by_compaction_tell_nothing_and_the_rest_still_tells(
    kafka_bootstrap: str, tmp_path: Path, unique: Callable[[str], str]
) -> None:
    log = JsonCommitLog(LocalStorage(tmp_path))
    bed = Bed(kafka_bootstrap, unique("fate"), unique("compacted"), log)
    compacted(bed)
    kept = finished(bed, {}, commit=True, keys=(b"a", b"b"))  # a is superseded below, b stays
    gone = finished(bed, {}, commit=True, keys=(b"c",))  # superseded below
    finished(bed, {}, commit=True, keys=(b"a", b"c"))
    time.sleep(0.5)  # past segment.ms: the next record rolls the segment, which is then cleaned
    roll = Producer({"bootstrap.servers": bed.bootstrap})
    roll.produce(bed.topic, b"v", b"roll", partition=0)
    roll.flush(30)
    wait_until_cleaned(bed, kept.offsets[bed.topic][0][0], gone.offsets[bed.topic][0][0])
    cluster = Cluster(bed.bootstrap, {}, timeout_ms=10_000)

    assert cluster.fate(kept.offsets).fate is Fate.COMMITTED
    answer = cluster.fate(gone.offsets)
    assert answer.fate is Fate.UNDETERMINED, answer
    assert "compaction" in answer.evidence


def compacted(bed: Bed) -> None:
    """A one-partition topic the log cleaner compacts as soon as a segment rolls."""
    config = {
        "cleanup.policy": "compact",
        "segment.ms": "100",
        "min.cleanable.dirty.ratio": "0.0001",
        "min.compaction.lag.ms": "0",
        "delete.retention.ms": "100",
    }
    admin = AdminClient({"bootstrap.servers": bed.bootstrap})
    [future] = admin.create_topics([NewTopic(bed.topic, 1, 1, config=config)]).values()
    future.result(timeout=30)


def wait_until_cleaned(bed: Bed, *offsets: int, timeout_s: float = 120.0) -> None:
    """Until the log cleaner removed the records at `offsets` (it wakes every 15 s)."""
    deadline = time.monotonic() + timeout_s
    while {r.offset for r in read_topic(bed.bootstrap, bed.topic, "read_uncommitted")} & {
        *offsets
    }:
        assert time.monotonic() < deadline, f"the cleaner kept {bed.topic}@{offsets}"
        time.sleep(1)
