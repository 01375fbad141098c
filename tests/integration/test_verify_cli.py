"""`kafka-txn-sink verify` on a real broker (and the S3 server for files on S3).

No Spark: each test plays the sink by hand with the project's own parts. A batch is written as
a task writes it (TaskTransaction: records and/or Avro files through FileSet plus one reference
per file), decided in a JSON commit log, committed with EndTxn and marked complete. Anomalies
are planted on top, and the command must report each one, and exactly that.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

import fastavro
import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from pyspark.sql.types import StringType, StructField, StructType

from kafka_txn_sink import cli
from kafka_txn_sink.commit_log import CommitLog, LogFormat, open_commit_log
from kafka_txn_sink.files.naming import FileNaming
from kafka_txn_sink.files.plan import plan_files
from kafka_txn_sink.files.references import reference
from kafka_txn_sink.files.writer import FileSet
from kafka_txn_sink.kafka.producer import TaskTransaction
from kafka_txn_sink.kafka.producer_settings import producer_config
from kafka_txn_sink.kafka.txn_admin import TxnAdmin
from kafka_txn_sink.protocol.messages import Completion, Decision, FileRef, Participant
from kafka_txn_sink.protocol.run_records import SinkMeta
from kafka_txn_sink.storage import S3Settings, open_file_sink
from kafka_txn_sink.storage.files import FileSink, LocalFileSink
from tests.conftest import S3_TEST_SECRET
from tests.e2e.harness import create_topics

pytestmark = pytest.mark.kafka

TXN_TIMEOUT_MS = 60_000
PLAN = plan_files(
    StructType([StructField("id", StringType()), StructField("user", StringType())]),
    partition_by=("user",),
)


@dataclass
class Bed:
    """One sink: its input, records and references topics, commit log and files."""

    bootstrap: str
    sink_id: str
    input: str
    output: str
    references: str
    log_dir: Path
    files: FileSink
    ids: list[str] = field(default_factory=list)
    log_format: LogFormat = "json"

    @cached_property
    def log(self) -> CommitLog:
        return open_commit_log(str(self.log_dir), None, self.log_format)

    def records_args(self, *extra: str) -> list[str]:
        return [
            "verify",
            "--bootstrap",
            self.bootstrap,
            "--input-topic",
            self.input,
            "--output-topic",
            self.output,
            "--log",
            str(self.log_dir),
            *extra,
        ]

    def files_args(self, *extra: str) -> list[str]:
        return [
            "verify",
            "--bootstrap",
            self.bootstrap,
            "--input-topic",
            self.input,
            "--log",
            str(self.log_dir),
            "--references-topic",
            self.references,
            "--path",
            self.files.uri,
            *extra,
        ]


@pytest.fixture
def bed(kafka_bootstrap: str, unique: Callable[[str], str], tmp_path: Path) -> Bed:
    return new_bed(kafka_bootstrap, unique, tmp_path, LocalFileSink(tmp_path / "files"))


def new_bed(
    bootstrap: str,
    unique: Callable[[str], str],
    tmp_path: Path,
    files: FileSink,
    log_format: LogFormat = "json",
) -> Bed:
    sink_id = unique("vsink")
    bed = Bed(
        bootstrap,
        sink_id,
        unique("v_in"),
        unique("v_out"),
        unique("v_refs"),
        tmp_path / "log",
        files,
        log_format=log_format,
    )
    create_topics(bootstrap, 3, bed.input, bed.output, bed.references)
    bed.log.create(SinkMeta(sink_id, created_at_ms=int(time.time() * 1000)))
    bed.ids = [f"id-{n:04d}" for n in range(60)]
    produce_input(bed, bed.ids)
    return bed


def produce_input(bed: Bed, ids: Sequence[str]) -> None:
    producer = Producer({"bootstrap.servers": bed.bootstrap, "linger.ms": 5})
    for n, ident in enumerate(ids):
        value = json.dumps({"id": ident, "user": f"u{n % 3}"})
        producer.produce(bed.input, key=ident.encode(), value=value.encode())
    assert producer.flush(30) == 0


# -- playing the sink ----------------------------------------------------------------------


@dataclass
class Task:
    """What one Spark task of a batch writes: records to the output, rows into files."""

    records: list[str] = field(default_factory=list)
    rows: list[str] = field(default_factory=list)
    attempt: int = 0


def prepare(bed: Bed, batch_id: int, partition: int, task: Task) -> Participant:
    txn_id = f"{bed.sink_id}-{partition}"
    txn = TaskTransaction(producer_config(bed.bootstrap, {}, txn_id, TXN_TIMEOUT_MS), 30)
    txn.init()
    for ident in task.records:
        txn.send(bed.output, value=json.dumps({"id": ident}).encode(), key=ident.encode())
    refs = write_files(bed, txn, batch_id, partition, task)
    prepared = txn.prepare()
    txn.detach()
    assert prepared is not None
    return Participant(
        partition,
        task.attempt,
        prepared.triple,
        prepared.rows,
        prepared.offsets,
        refs,
    )


def write_files(
    bed: Bed, txn: TaskTransaction, batch_id: int, partition: int, task: Task
) -> tuple[FileRef, ...]:
    if not task.rows:
        return ()
    written = upload(bed, batch_id, partition, task.attempt, task.rows)
    for item in written:
        message = reference(
            item,
            sink=bed.files,
            sink_id=bed.sink_id,
            batch_id=batch_id,
            codec="null",
            inline_max_bytes=65536,
        )
        txn.send(bed.references, value=message.value, key=message.key)
    return tuple(w.ref for w in written)


def upload(bed: Bed, batch_id: int, partition: int, attempt: int, rows: Sequence[str]) -> Any:
    files = FileSet(PLAN, bed.files, FileNaming(batch_id, partition, attempt))
    for n, ident in enumerate(rows):
        files.add((ident, f"u{n % 2}"))
    return files.close()


def commit_batch(bed: Bed, batch_id: int, tasks: Sequence[Task]) -> Decision:
    """Prepare every task, decide the batch, commit it, mark it complete: the sink's commit."""
    participants = tuple(prepare(bed, batch_id, p, t) for p, t in enumerate(tasks))
    decision = Decision(
        bed.sink_id,
        "query-1",
        batch_id,
        participants,
        tasks=len(tasks),
        rows=sum(p.rows for p in participants),
        decided_at_ms=int(time.time() * 1000),
    )
    bed.log.put_decision(decision)
    with TxnAdmin(bed.bootstrap, {}) as txn_admin:
        results = txn_admin.end_transactions(
            [p.triple for p in participants], commit=True, deadline_s=30
        )
    assert all(r.ok for r in results), results
    bed.log.put_completion(Completion(bed.sink_id, batch_id, int(time.time() * 1000)))
    return decision


def records_batches(bed: Bed, ids: Sequence[str]) -> None:
    """Records mode: the ids in two batches of two tasks each."""
    half = len(ids) // 2
    for batch_id, part in enumerate([ids[:half], ids[half:]]):
        commit_batch(bed, batch_id, [Task(records=list(part[::2])), Task(records=list(part[1::2]))])


def files_batches(bed: Bed, ids: Sequence[str], records: bool = False) -> None:
    """Files mode (and records mode too with `records`): two batches of two tasks each."""
    half = len(ids) // 2
    for batch_id, part in enumerate([ids[:half], ids[half:]]):
        tasks = [
            Task(rows=list(p), records=list(p) if records else []) for p in (part[::2], part[1::2])
        ]
        commit_batch(bed, batch_id, tasks)


def run(capsys: pytest.CaptureFixture[str], args: list[str]) -> tuple[int, dict[str, Any]]:
    code = cli.main(["--json", *args])
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err
    return code, json.loads(captured.out) if captured.out.strip() else {"stderr": captured.err}


def nonzero(body: dict[str, Any]) -> dict[str, int]:
    return {k: v for k, v in body["anomalies"].items() if v}


# -- records mode --------------------------------------------------------------------------


def test_a_clean_run_is_exact(bed: Bed, capsys: pytest.CaptureFixture[str]) -> None:
    records_batches(bed, bed.ids)

    code, body = run(capsys, bed.records_args())
    table_code = cli.main(bed.records_args())
    table = capsys.readouterr().out

    assert code == 0, body
    assert body["exact"] is True and nonzero(body) == {}
    assert body["input"]["records"] == 60 and body["records"]["records"] == 60
    assert body["records"]["lost"] == [] and body["records"]["duplicated"] == {}
    assert body["log"]["decided"] == 2 and body["log"]["count_mismatches"] == []
    assert body["log"]["unchecked"] == {"topics_not_read": [], "beyond_read_end": []}
    assert table_code == 0
    assert "verify: exact" in table
    assert "no --checkpoint" in table  # the input range is said


def test_a_delta_commit_log_is_read_the_same(
    kafka_bootstrap: str,
    unique: Callable[[str], str],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    bed = new_bed(kafka_bootstrap, unique, tmp_path, LocalFileSink(tmp_path / "f"), "delta")
    records_batches(bed, [i for i in bed.ids if i != bed.ids[9]])

    code, body = run(capsys, bed.records_args())  # --log-format found out: delta

    assert code == 1
    assert body["log"]["decided"] == 2 and body["log"]["count_mismatches"] == []
    assert nonzero(body) == {"records.lost": 1}
    assert body["records"]["lost"] == [bed.ids[9]]


def test_a_duplicate_produced_by_hand(bed: Bed, capsys: pytest.CaptureFixture[str]) -> None:
    records_batches(bed, bed.ids)
    producer = Producer({"bootstrap.servers": bed.bootstrap})
    producer.produce(bed.output, key=bed.ids[5].encode(), value=b"{}")
    assert producer.flush(30) == 0

    code, body = run(capsys, bed.records_args())

    assert code == 1
    records = body["records"]
    assert records["duplicated"] == {bed.ids[5]: 2}
    assert records["lost"] == [] and records["unexpected"] == []
    # Written outside every decided batch: an aborted read too, naming the record.
    [aborted] = records["aborted_reads"]
    assert aborted["id"] == bed.ids[5] and aborted["topic"] == bed.output
    assert nonzero(body) == {"records.duplicated": 1, "records.aborted_reads": 1}


def test_a_missing_id(bed: Bed, capsys: pytest.CaptureFixture[str]) -> None:
    records_batches(bed, [i for i in bed.ids if i != bed.ids[7]])

    code, body = run(capsys, bed.records_args())

    assert code == 1
    assert body["records"]["lost"] == [bed.ids[7]]
    assert nonzero(body) == {"records.lost": 1}


def test_a_duplicate_and_a_missing_id_do_not_cancel_out(
    bed: Bed, capsys: pytest.CaptureFixture[str]
) -> None:
    # ids[3] never written, ids[4] written twice: as many records out as in.
    written = [bed.ids[4] if i == bed.ids[3] else i for i in bed.ids]
    records_batches(bed, written)

    code, body = run(capsys, bed.records_args())

    assert code == 1
    assert body["input"]["records"] == body["records"]["records"] == 60
    assert body["records"]["lost"] == [bed.ids[3]]
    assert body["records"]["duplicated"] == {bed.ids[4]: 2}
    assert nonzero(body) == {"records.lost": 1, "records.duplicated": 1}


def test_rows_of_an_aborted_transaction_are_not_output(
    bed: Bed, capsys: pytest.CaptureFixture[str]
) -> None:
    records_batches(bed, bed.ids)
    # A task attempt that wrote every id again, then was aborted (never decided).
    txn = TaskTransaction(
        producer_config(bed.bootstrap, {}, f"{bed.sink_id}-9", TXN_TIMEOUT_MS), 30
    )
    txn.init()
    for ident in [*bed.ids, "ghost"]:
        txn.send(bed.output, value=b"{}", key=ident.encode())
    assert txn.prepare() is not None
    txn.abort()

    code, body = run(capsys, bed.records_args())

    assert code == 0, nonzero(body)
    assert body["records"]["records"] == 60
    assert body["records"]["duplicated"] == {} and body["records"]["unexpected"] == []


def test_a_record_outside_every_decided_batch_is_an_aborted_read(
    bed: Bed, capsys: pytest.CaptureFixture[str]
) -> None:
    records_batches(bed, bed.ids)
    # Committed, but no decision names it: nothing of an undecided batch may be visible.
    undecided = prepare(bed, 2, 0, Task(records=["ghost-1", "ghost-2"]))
    with TxnAdmin(bed.bootstrap, {}) as txn_admin:
        [result] = txn_admin.end_transactions([undecided.triple], commit=True, deadline_s=30)
    assert result.ok

    code, body = run(capsys, bed.records_args())

    assert code == 1
    records = body["records"]
    assert sorted(a["id"] for a in records["aborted_reads"]) == ["ghost-1", "ghost-2"]
    assert records["unexpected"] == ["ghost-1", "ghost-2"]
    assert nonzero(body) == {"records.aborted_reads": 2, "records.unexpected": 2}


def test_json_lists_every_id_and_the_table_caps_them(
    bed: Bed, capsys: pytest.CaptureFixture[str]
) -> None:
    lost = bed.ids[10:35]
    records_batches(bed, [i for i in bed.ids if i not in lost])

    code, body = run(capsys, bed.records_args())
    table_code = cli.main(bed.records_args("--max-print", "5"))
    table = capsys.readouterr().out

    assert code == table_code == 1
    assert body["records"]["lost"] == lost
    assert body["records"]["lost_count"] == 25
    assert "NOT exact" in table
    assert ", ".join(lost[:5]) + " … and 20 more" in table
    assert lost[5] not in table


def test_a_decided_but_incomplete_batch_is_said(
    bed: Bed, capsys: pytest.CaptureFixture[str]
) -> None:
    records_batches(bed, bed.ids[:30])
    # Batch 2 decided, its transactions still open (the driver died before EndTxn): invisible.
    participant = prepare(bed, 2, 0, Task(records=bed.ids[30:]))
    bed.log.put_decision(
        Decision(bed.sink_id, "query-1", 2, (participant,), 1, participant.rows, 1)
    )
    try:
        code, body = run(capsys, [*bed.records_args(), "--stall-timeout-s", "5"])
    finally:
        with TxnAdmin(bed.bootstrap, {}) as txn_admin:
            txn_admin.end_transactions([participant.triple], commit=False, deadline_s=30)

    # Its open transaction holds read_committed readers back at its first offset; the ends
    # taken at the start stop there, so the verification finishes and reports the loss.
    assert code == 1, body
    assert body["records"]["lost"] == bed.ids[30:]
    assert body["log"]["incomplete"] == [2]
    assert body["log"]["unchecked"]["beyond_read_end"] == [2]
    assert any("recover" in note for note in body["notes"])


# -- the input range -----------------------------------------------------------------------


def input_ends(bed: Bed) -> dict[str, int]:
    consumer = Consumer({"bootstrap.servers": bed.bootstrap, "group.id": "verify-test-ends"})
    try:
        return {
            str(p): consumer.get_watermark_offsets(TopicPartition(bed.input, p), timeout=10)[1]
            for p in range(3)
        }
    finally:
        consumer.close()


def write_checkpoint(path: Path, topic: str, ends: dict[int, dict[str, int]], commits: int) -> None:
    """A Spark checkpoint: offsets/N per batch (end offsets), commits/0..commits-1."""
    for directory in ("offsets", "commits", "sources/0"):
        (path / directory).mkdir(parents=True, exist_ok=True)
    (path / "sources/0/0").write_bytes(
        b"\0v1\n" + json.dumps({topic: {"0": 0, "1": 0, "2": 0}}).encode()
    )
    for batch, end in ends.items():
        meta = json.dumps({"batchWatermarkMs": 0, "batchTimestampMs": 1, "conf": {}})
        (path / "offsets" / str(batch)).write_text(f"v1\n{meta}\n{json.dumps({topic: end})}")
        if batch < commits:
            (path / "commits" / str(batch)).write_text('v1\n{"nextBatchWatermarkMs":0}')


def test_the_checkpoint_bounds_the_input(
    kafka_bootstrap: str,
    unique: Callable[[str], str],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    bed = new_bed(kafka_bootstrap, unique, tmp_path, LocalFileSink(tmp_path / "files"))
    first = input_ends(bed)
    later = [f"late-{n}" for n in range(10)]
    produce_input(bed, later)
    second = input_ends(bed)
    produce_input(bed, [f"unread-{n}" for n in range(5)])  # the query has not read these
    records_batches(bed, [*bed.ids, *later])
    checkpoint = tmp_path / "checkpoint"
    # Batch 0 (the first 60 ids) committed in Spark; batch 1 decided by the sink only.
    write_checkpoint(checkpoint, bed.input, {0: first, 1: second}, commits=1)

    code, body = run(capsys, bed.records_args("--checkpoint", str(checkpoint)))
    code_without, without = run(capsys, bed.records_args())

    assert code == 0, nonzero(body)
    span = body["input"]["range"]
    assert (span["source"], span["batch"], span["committed_batch"]) == ("checkpoint", 1, 0)
    assert span["end"] == {bed.input: second}
    assert body["input"]["records"] == 70
    assert any("batch 1 is decided in the commit log" in n for n in body["notes"])
    assert code_without == 1
    assert without["records"]["lost"] == [f"unread-{n}" for n in range(5)]


# -- errors --------------------------------------------------------------------------------


def test_cannot_run_exits_2_with_one_line(bed: Bed, capsys: pytest.CaptureFixture[str]) -> None:
    cases = {
        "nothing to verify": ["verify", "--bootstrap", bed.bootstrap, "--input-topic", bed.input],
        "--output-topic nope_": [*bed.records_args()[:5], "--output-topic", "nope_" + bed.output],
        "--input-id must be key, json:FIELD": bed.records_args("--input-id", "value"),
        "--path needs --log": [
            "verify",
            "--bootstrap",
            bed.bootstrap,
            "--input-topic",
            bed.input,
            "--path",
            "x",
        ],
        "not a Spark streaming checkpoint": bed.records_args("--checkpoint", str(bed.log_dir)),
        "no commit log there": [*bed.records_args()[:-2], "--log", str(bed.log_dir / "none")],
    }
    for expected, args in cases.items():
        code = cli.main(args)
        captured = capsys.readouterr()
        assert code == 2, (expected, captured)
        assert captured.out == ""
        assert captured.err.count("\n") == 1, captured.err
        assert captured.err.startswith("kafka-txn-sink: error: ")
        assert expected in captured.err


def test_unreachable_broker_is_one_line_without_secrets(
    capsys: pytest.CaptureFixture[str],
) -> None:
    args = ["verify", "--bootstrap", "127.0.0.1:1", "--input-topic", "t", "--output-topic", "o"]
    args += ["--timeout-ms", "2000", "--kafka", "sasl.password=hunter2"]

    started = time.monotonic()
    code = cli.main(args)
    captured = capsys.readouterr()

    assert code == 2
    assert time.monotonic() - started < 30
    assert captured.err.count("\n") == 1
    assert captured.err.startswith("kafka-txn-sink: error: cannot reach Kafka at 127.0.0.1:1")
    assert "hunter2" not in captured.err


# -- files mode ----------------------------------------------------------------------------


def test_files_and_records_together_are_exact_and_leftovers_are_no_anomaly(
    bed: Bed, capsys: pytest.CaptureFixture[str]
) -> None:
    files_batches(bed, bed.ids, records=True)
    # A failed attempt of batch 0 (attempt 1 lost to attempt 0), and an undecided batch 2.
    upload(bed, 0, 0, 1, bed.ids[:3])
    upload(bed, 2, 0, 0, bed.ids[:3])

    code, body = run(capsys, bed.files_args("--output-topic", bed.output))

    assert code == 0, nonzero(body)
    files = body["files"]
    assert files["references"] == files["files_read"] == 8  # 2 batches x 2 tasks x 2 users
    assert files["rows"] == 60 and files["lost"] == [] and files["orphan_files"] == []
    assert files["left_by_failed_attempts"]["count"] == 4
    assert body["records"]["records"] == 60
    # Records and references of one batch together match its decided rows.
    assert body["log"]["count_mismatches"] == []
    assert body["log"]["unchecked"] == {"topics_not_read": [], "beyond_read_end": []}


def test_files_orphan_and_a_reference_to_a_missing_file(
    bed: Bed, capsys: pytest.CaptureFixture[str]
) -> None:
    files_batches(bed, bed.ids)
    decision = bed.log.decision(1)
    assert decision is not None
    gone = decision.participants[0].files[0]
    Path(gone.location).unlink()
    stray = Path(bed.files.location("user=u0/part-notes.avro"))
    stray.write_bytes(b"not ours")

    code, body = run(capsys, bed.files_args())
    table_code = cli.main(bed.files_args())
    table = capsys.readouterr().out

    assert code == table_code == 1
    files = body["files"]
    assert files["missing_files"] == [gone.location]
    assert [o["name"] for o in files["orphan_files"]] == ["user=u0/part-notes.avro"]
    assert len(files["lost"]) == gone.records > 0
    assert nonzero(body) == {
        "files.missing_files": 1,
        "files.orphan_files": 1,
        "files.lost": gone.records,
    }
    assert "referenced files missing" in table and "part-notes.avro" in table


def test_files_a_reference_published_twice(bed: Bed, capsys: pytest.CaptureFixture[str]) -> None:
    files_batches(bed, bed.ids)
    decision = bed.log.decision(0)
    assert decision is not None
    again = decision.participants[1].files[0]
    # A reference that escaped its transaction (published by hand): its file counts twice.
    txn = TaskTransaction(
        producer_config(bed.bootstrap, {}, f"{bed.sink_id}-8", TXN_TIMEOUT_MS), 30
    )
    txn.init()
    txn.send(bed.references, value=republished(bed, again), key=b"k")
    prepared = txn.prepare()
    txn.detach()
    assert prepared is not None
    with TxnAdmin(bed.bootstrap, {}) as txn_admin:
        txn_admin.end_transactions([prepared.triple], commit=True, deadline_s=30)

    code, body = run(capsys, bed.files_args())

    assert code == 1
    files = body["files"]
    assert files["duplicate_references"] == [{"location": again.location, "count": 2}]
    assert sorted(files["duplicated"]) == sorted(ids_in(again))
    assert len(files["aborted_reads"]) == 1
    assert files["lost"] == []


def republished(bed: Bed, ref: FileRef) -> bytes:
    body = {"kind": "kafka_txn_sink.file", "version": 1, "sink_id": bed.sink_id, "batch_id": 0}
    return json.dumps({**body, **ref.to_json(), "codec": "null"}).encode()


def ids_in(ref: FileRef) -> list[str]:
    with open(ref.location, "rb") as stream:
        return [str(row["id"]) for row in fastavro.reader(stream) if isinstance(row, dict)]


@pytest.mark.s3
def test_files_on_s3(
    kafka_bootstrap: str,
    unique: Callable[[str], str],
    tmp_path: Path,
    s3_bucket: str,
    s3_settings: S3Settings,
    capsys: pytest.CaptureFixture[str],
) -> None:
    sink = open_file_sink(f"s3://{s3_bucket}/data", s3_settings)
    bed = new_bed(kafka_bootstrap, unique, tmp_path, sink)
    files_batches(bed, bed.ids)
    upload(bed, 5, 1, 0, bed.ids[:2])  # an undecided batch's files (one per user)
    args = [*bed.files_args(), "--s3-endpoint", str(s3_settings.endpoint_url)]

    code, body = run(capsys, [*args, "--s3-region", "us-east-1"])

    assert code == 0, nonzero(body)
    assert body["files"]["files_read"] == 8 and body["files"]["rows"] == 60
    assert body["files"]["left_by_failed_attempts"]["count"] == 2

    decision = bed.log.decision(0)
    assert decision is not None
    gone = decision.participants[0].files[0]
    sink.delete(gone.location.removeprefix(f"s3://{s3_bucket}/data/"))
    code, body = run(capsys, [*args, "--s3-region", "us-east-1"])

    assert code == 1
    assert body["files"]["missing_files"] == [gone.location]
    assert S3_TEST_SECRET not in json.dumps(body)
