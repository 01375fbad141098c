"""Republishing the file references of a decided batch the broker aborted, on a real broker.

A decided participant is "aborted by the broker" here by fencing it (a new producer of the
same transactional id), which is what the coordinator's timeout abort does to it too. Each
test then settles the batch and reads the references topic as a read_committed consumer.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import fastavro
import pytest
from confluent_kafka import OFFSET_END, TopicPartition
from confluent_kafka.admin import AdminClient

from kafka_txn_sink import cli, failpoints
from kafka_txn_sink.commit_log import JsonCommitLog
from kafka_txn_sink.errors import TransactionCompletionError, TransactionFateUnknownError
from kafka_txn_sink.files.references import parse_reference
from kafka_txn_sink.files.republish import Republisher
from kafka_txn_sink.kafka.cluster import Cluster
from kafka_txn_sink.kafka.producer import TaskTransaction
from kafka_txn_sink.kafka.producer_settings import producer_config
from kafka_txn_sink.kafka.txn_admin import TxnAdmin
from kafka_txn_sink.protocol.complete import Settler
from kafka_txn_sink.protocol.messages import Decision, FileRef, Participant
from kafka_txn_sink.protocol.run_records import SinkMeta
from kafka_txn_sink.protocol.txn_ids import republish_id, transactional_id
from kafka_txn_sink.storage import LocalStorage
from kafka_txn_sink.testing.topics import read_topic
from tests.e2e.harness import create_topics, open_transactions

pytestmark = pytest.mark.kafka

TIMEOUT_MS = 60_000
SCHEMA = {
    "type": "record",
    "name": "event",
    "fields": [{"name": "id", "type": "string"}, {"name": "n", "type": "long"}],
}


@dataclass
class Bed:
    bootstrap: str
    sink_id: str
    references: str
    records: str
    files: Path
    commit_log: JsonCommitLog

    def settler(self, republish: bool = True) -> Settler:
        republisher = Republisher(
            sink_id=self.sink_id,
            bootstrap_servers=self.bootstrap,
            kafka={},
            transaction_timeout_ms=TIMEOUT_MS,
            client_timeout_s=30,
            references_topic=self.references,
            path=str(self.files),
            s3=None,
            inline_max_bytes=64 * 1024,
        )
        return Settler(
            self.sink_id,
            self.commit_log,
            TxnAdmin(self.bootstrap, {}),
            Cluster(self.bootstrap, {}),
            deadline_s=30,
            republisher=republisher if republish else None,
        )

    def referenced(self) -> Counter[str]:
        seen = read_topic(self.bootstrap, self.references)
        return Counter(parse_reference(r.value or b"").location for r in seen)


@pytest.fixture
def bed(kafka_bootstrap: str, tmp_path: Path, unique: Callable[[str], str]) -> Bed:
    sink_id, references, records = unique("rp"), unique("refs"), unique("recs")
    create_topics(kafka_bootstrap, 1, references, records)
    commit_log = JsonCommitLog(LocalStorage(tmp_path / "log"))
    commit_log.create(SinkMeta(sink_id, created_at_ms=int(time.time() * 1000)))
    return Bed(kafka_bootstrap, sink_id, references, records, tmp_path / "files", commit_log)


@pytest.fixture(autouse=True)
def no_failpoints(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[None]:
    monkeypatch.delenv(failpoints.ENV, raising=False)
    monkeypatch.setenv(failpoints.ENV_DIR, str(tmp_path))
    monkeypatch.setenv(failpoints.ENV_SWITCH, "1")
    yield


def write_files(bed: Bed, partition: int, count: int) -> tuple[FileRef, ...]:
    refs = []
    for seq in range(count):
        directory = bed.files / f"user=u{partition}"
        directory.mkdir(parents=True, exist_ok=True)
        path = directory / f"part-{partition:05d}-{seq:05d}.avro"
        rows = [{"id": f"{partition}-{seq}-{i}", "n": i} for i in range(3)]
        with path.open("wb") as out:
            fastavro.writer(out, SCHEMA, rows, codec="deflate")
        refs.append(
            FileRef(
                location=str(path),
                partition_path=f"user=u{partition}",
                partition_values={"user": f"u{partition}"},
                records=len(rows),
                bytes=path.stat().st_size,
                schema_fingerprint="f" * 64,
            )
        )
    return tuple(refs)


def fenced_participant(
    bed: Bed, partition: int, files: int, records: int = 0, committed: bool = False
) -> Participant:
    """A prepared participant with `files` references (and records), then fenced: aborted, or
    committed before (the coordinator then refuses its triple all the same)."""
    txn_id = transactional_id(bed.sink_id, partition, slot=0)
    config = producer_config(bed.bootstrap, {}, txn_id, TIMEOUT_MS)
    txn = TaskTransaction(config, 30)
    txn.init()
    refs = write_files(bed, partition, files)
    for ref in refs:
        txn.send(bed.references, value=b'{"original": true}', key=ref.location.encode())
    for i in range(records):
        txn.send(bed.records, value=f"{partition}-{i}".encode())
    prepared = txn.prepare()
    txn.detach()
    assert prepared is not None
    if committed:
        with TxnAdmin(bed.bootstrap, {}) as txn_admin:
            [result] = txn_admin.end_transactions([prepared.triple], commit=True, deadline_s=30)
        assert result.ok, result.error
    fence = TaskTransaction(config, 30)
    fence.init()  # aborts the prepared transaction, as the coordinator's timeout would
    fence.abort()
    fence.detach()
    triple = prepared.triple
    return Participant(
        partition,
        0,
        triple,
        prepared.rows,
        prepared.offsets,
        refs,
    )


def decide(bed: Bed, *participants: Participant) -> Decision:
    decision = Decision(
        sink_id=bed.sink_id,
        query_id="q",
        batch_id=7,
        participants=participants,
        tasks=len(participants),
        rows=sum(p.rows for p in participants),
        decided_at_ms=int(time.time() * 1000),
    )
    bed.commit_log.put_decision(decision)
    return decision


def expected(*participants: Participant) -> Counter[str]:
    return Counter(ref.location for p in participants for ref in p.files)


def test_aborted_references_are_published_once_with_the_files_schema(bed: Bed) -> None:
    first, second = fenced_participant(bed, 0, files=2), fenced_participant(bed, 1, files=1)
    decision = decide(bed, first, second)

    settled = bed.settler().complete(decision)

    assert settled.completion.republished == (0, 1)
    assert settled.completion.lost == ()
    assert bed.referenced() == expected(first, second)
    values = [parse_reference_body(r.value) for r in read_topic(bed.bootstrap, bed.references)]
    assert all(v["schema"] == SCHEMA and v["codec"] == "deflate" for v in values)
    assert all(v["batch_id"] == 7 and v["sink_id"] == bed.sink_id for v in values)
    again = bed.settler().complete(decision)
    assert not again.newly_written
    assert bed.referenced() == expected(first, second)


def parse_reference_body(value: bytes | None) -> dict[str, object]:
    body = json.loads(value or b"{}")
    assert isinstance(body, dict)
    return body


@pytest.mark.parametrize("point", ["driver.republish_prepared", "driver.republish_recorded"])
def test_a_crash_while_republishing_never_duplicates(
    bed: Bed, point: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    participant = fenced_participant(bed, 0, files=3)
    decision = decide(bed, participant)
    monkeypatch.setenv(failpoints.ENV, f"{point}=raise")
    with pytest.raises(failpoints.FailpointError):
        bed.settler().complete(decision)
    assert bed.commit_log.completion(7) is None
    monkeypatch.delenv(failpoints.ENV)

    settled = bed.settler().complete(decision)

    assert settled.completion.republished == (0,)
    assert bed.referenced() == expected(participant)
    recorded = bed.commit_log.republish(7, 0)
    assert recorded is not None and recorded.partitions == (0,)
    assert bed.commit_log.republish(7, 1) is None
    assert open_transactions(bed.bootstrap, bed.sink_id) == []


def test_a_recorded_round_the_broker_aborted_is_superseded(
    bed: Bed, monkeypatch: pytest.MonkeyPatch
) -> None:
    participant = fenced_participant(bed, 0, files=2)
    decision = decide(bed, participant)
    monkeypatch.setenv(failpoints.ENV, "driver.republish_recorded=raise")
    with pytest.raises(failpoints.FailpointError):
        bed.settler().complete(decision)
    monkeypatch.delenv(failpoints.ENV)
    round0 = bed.commit_log.republish(7, 0)
    assert round0 is not None
    config = producer_config(bed.bootstrap, {}, republish_id(bed.sink_id), TIMEOUT_MS)
    fence = TaskTransaction(config, 30)
    fence.init()  # the broker aborts round 0 before anyone commits it
    fence.abort()
    fence.detach()

    settled = bed.settler().complete(decision)

    round1 = bed.commit_log.republish(7, 1)
    assert round1 is not None and round1.triple != round0.triple
    assert settled.completion.republished == (0,)
    assert bed.referenced() == expected(participant)


def test_records_beside_the_references_stay_reported_lost(bed: Bed) -> None:
    participant = fenced_participant(bed, 0, files=1, records=5)
    decision = decide(bed, participant)

    settled = bed.settler().complete(decision)

    assert settled.completion.republished == (0,)
    assert [x.partition for x in settled.completion.lost] == [0]
    assert bed.referenced() == expected(participant)
    assert read_topic(bed.bootstrap, bed.records) == []


def test_without_the_files_options_nothing_is_marked_complete(bed: Bed) -> None:
    decision = decide(bed, fenced_participant(bed, 0, files=1))

    with pytest.raises(TransactionCompletionError, match="restart the query"):
        bed.settler(republish=False).complete(decision)

    assert bed.commit_log.completion(7) is None
    assert bed.referenced() == Counter()


def test_references_whose_records_are_gone_are_never_published_again(bed: Bed) -> None:
    participant = fenced_participant(bed, 0, files=2, committed=True)
    admin = AdminClient({"bootstrap.servers": bed.bootstrap})
    [deleted] = admin.delete_records([TopicPartition(bed.references, 0, OFFSET_END)]).values()
    deleted.result(timeout=30)  # deleteRecords: the references' records are gone
    decision = decide(bed, participant)

    with pytest.raises(TransactionFateUnknownError, match=r"Spark partition 0 .*log start"):
        bed.settler().complete(decision)

    assert bed.commit_log.completion(7) is None
    assert bed.commit_log.republish(7, 0) is None
    assert bed.referenced() == Counter()


def test_recover_republishes_with_the_files_options(
    bed: Bed, capsys: pytest.CaptureFixture[str]
) -> None:
    participant = fenced_participant(bed, 0, files=2)
    decide(bed, participant)
    root = bed.commit_log.storage.uri
    common = ["--json", "recover", "--log", root, "--bootstrap", bed.bootstrap]
    common += ["--execute", "--force"]

    refused = cli.main([*common, "--path", str(bed.files)])
    capsys.readouterr()
    code = cli.main([*common, "--path", str(bed.files), "--references-topic", bed.references])

    assert refused == 2
    assert code == 0, capsys.readouterr()
    completion = bed.commit_log.completion(7)
    assert completion is not None and completion.republished == (0,)
    assert bed.referenced() == expected(participant)
