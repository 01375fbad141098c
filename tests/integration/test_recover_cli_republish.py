"""`kafka-txn-sink status | recover` agree with the driver on what a files-mode sink holds.

A decided participant is "aborted by the broker" by fencing it, as the coordinator's timeout
abort would. The driver then starts republishing its file references and dies after recording
the round (failpoint `driver.republish_recorded`): the round's transaction is open on the
brokers and held by the incomplete batch. The CLI must neither offer to abort it nor report a
failure when it commits it.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import fastavro
import pytest

from kafka_txn_sink import cli, failpoints
from kafka_txn_sink.commit_log import JsonCommitLog
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
BATCH = 7
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
    files: Path
    commit_log: JsonCommitLog

    def cli(self, capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, Any]:
        """Run the CLI with --json on this sink's log and brokers: exit code, parsed output."""
        log = ["--log", self.commit_log.uri, "--bootstrap", self.bootstrap]
        code = cli.main(["--json", *args, *log])
        captured = capsys.readouterr()
        assert "Traceback" not in captured.err
        return code, json.loads(captured.out) if captured.out.strip() else captured.err

    def files_options(self, *extra: str) -> list[str]:
        """The recover options of files mode."""
        return ["--path", str(self.files), "--references-topic", self.references, *extra]

    def references_seen(self) -> list[dict[str, Any]]:
        """The reference messages a read_committed consumer sees."""
        return [json.loads(r.value or b"{}") for r in read_topic(self.bootstrap, self.references)]

    def referenced(self) -> Counter[str]:
        """How often each file is referenced, read_committed."""
        seen = read_topic(self.bootstrap, self.references)
        return Counter(parse_reference(r.value or b"").location for r in seen)


@pytest.fixture
def bed(kafka_bootstrap: str, tmp_path: Path, unique: Callable[[str], str]) -> Bed:
    sink_id, references = unique("drift"), unique("refs")
    create_topics(kafka_bootstrap, 1, references)
    commit_log = JsonCommitLog(LocalStorage(tmp_path / "log"))
    commit_log.create(SinkMeta(sink_id, created_at_ms=int(time.time() * 1000)))
    return Bed(kafka_bootstrap, sink_id, references, tmp_path / "files", commit_log)


@pytest.fixture(autouse=True)
def no_failpoints(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[None]:
    monkeypatch.delenv(failpoints.ENV, raising=False)
    monkeypatch.setenv(failpoints.ENV_DIR, str(tmp_path))
    monkeypatch.setenv(failpoints.ENV_SWITCH, "1")
    yield


def aborted_participant(bed: Bed, partition: int, files: int) -> Participant:
    """A prepared participant holding the references of `files` Avro files, then fenced."""
    config = producer_config(
        bed.bootstrap, {}, transactional_id(bed.sink_id, partition, slot=0), TIMEOUT_MS
    )
    txn = TaskTransaction(config, 30)
    txn.init()
    refs = tuple(write_file(bed, partition, seq) for seq in range(files))
    for ref in refs:
        txn.send(bed.references, value=b'{"original": true}', key=ref.location.encode())
    prepared = txn.prepare()
    txn.detach()
    assert prepared is not None
    fence = TaskTransaction(config, 30)
    fence.init()  # aborts the prepared transaction, as the coordinator's timeout would
    fence.abort()
    fence.detach()
    return Participant(partition, 0, prepared.triple, prepared.rows, prepared.offsets, refs)


def write_file(bed: Bed, partition: int, seq: int) -> FileRef:
    directory = bed.files / f"user=u{partition}"
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"part-{partition:05d}-{seq:05d}.avro"
    rows = [{"id": f"{partition}-{seq}-{i}", "n": i} for i in range(3)]
    with path.open("wb") as out:
        fastavro.writer(out, SCHEMA, rows, codec="deflate")
    return FileRef(
        location=str(path),
        partition_path=f"user=u{partition}",
        partition_values={"user": f"u{partition}"},
        records=len(rows),
        bytes=path.stat().st_size,
        schema_fingerprint="f" * 64,
    )


def decide(bed: Bed, *participants: Participant) -> Decision:
    decision = Decision(
        sink_id=bed.sink_id,
        query_id="q",
        batch_id=BATCH,
        participants=participants,
        tasks=len(participants),
        rows=sum(p.rows for p in participants),
        decided_at_ms=int(time.time() * 1000),
    )
    bed.commit_log.put_decision(decision)
    return decision


def driver_dies_after_recording_a_round(
    bed: Bed, decision: Decision, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The driver's roll-forward records republish round 0, then its process dies."""
    republisher = Republisher(
        sink_id=bed.sink_id,
        bootstrap_servers=bed.bootstrap,
        kafka={},
        transaction_timeout_ms=TIMEOUT_MS,
        client_timeout_s=30,
        references_topic=bed.references,
        path=str(bed.files),
        s3=None,
        inline_max_bytes=64 * 1024,
    )
    settler = Settler(
        bed.sink_id,
        bed.commit_log,
        TxnAdmin(bed.bootstrap, {}),
        Cluster(bed.bootstrap, {}),
        deadline_s=30,
        republisher=republisher,
    )
    monkeypatch.setenv(failpoints.ENV, "driver.republish_recorded=raise")
    with pytest.raises(failpoints.FailpointError):
        settler.complete(decision)
    monkeypatch.delenv(failpoints.ENV)


def test_recover_commits_a_recorded_republish_round_and_never_offers_to_abort_it(
    bed: Bed, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    participant = aborted_participant(bed, 0, files=2)
    decision = decide(bed, participant)
    driver_dies_after_recording_a_round(bed, decision, monkeypatch)
    round0 = bed.commit_log.republish(BATCH, 0)
    assert round0 is not None and bed.commit_log.completion(BATCH) is None
    republishing = republish_id(bed.sink_id)

    status_code, status = bed.cli(capsys, "status")
    plan_code, plan = bed.cli(capsys, "recover")
    code, done = bed.cli(capsys, "recover", "--execute", "--force", *bed.files_options())

    assert status_code == 0
    held = {t["transactional_id"]: t["held_by_batch"] for t in status["open_transactions"]}
    assert held == {republishing: BATCH}
    assert plan_code == 0
    assert [b["batch"] for b in plan["roll_forward"]] == [BATCH]
    assert plan["abort"] == []
    assert code == 0, done
    assert done["result"] == {
        "ok": True,
        "completed": [{"batch": BATCH, "lost_rows": 0}],
        "aborted": [],
        "error": None,
    }
    completion = bed.commit_log.completion(BATCH)
    assert completion is not None and completion.republished == (0,) and completion.lost == ()
    assert bed.commit_log.republish(BATCH, 1) is None  # round 0 was committed, not superseded
    assert bed.referenced() == Counter(ref.location for ref in participant.files)
    assert open_transactions(bed.bootstrap, bed.sink_id) == []


def test_recover_republishes_with_the_sinks_schema_inline_limit(
    bed: Bed, capsys: pytest.CaptureFixture[str]
) -> None:
    participant = aborted_participant(bed, 0, files=1)
    decide(bed, participant)
    options = bed.files_options("--schema-inline-max-bytes", "16")

    code, done = bed.cli(capsys, "recover", "--execute", "--force", *options)

    assert code == 0, done
    [published] = bed.references_seen()
    assert "schema" not in published  # larger than 16 bytes: stored beside the files instead
    assert published["schema_location"].startswith(str(bed.files / "_schemas"))
