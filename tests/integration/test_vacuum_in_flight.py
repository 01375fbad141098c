"""`kafka-txn-sink vacuum` while a files-only task is in flight, on the S3 server and the broker.

In files-only mode a task's transaction opens at its first reference message, at `close()`,
but its files are uploaded as they roll. A task of batch 1 has uploaded files, no decision
names batch 1 yet, and vacuum runs with a clock two days later than the files (S3 servers set
LastModified themselves): the task's files must survive, and once batch 1 is decided every
reference names a file that is there. A file of decided batch 0 that no decision names is still
vacuumed.
"""

from __future__ import annotations

import io
import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, cast

import fastavro
import pytest
from pyspark.sql.types import LongType, StringType, StructField, StructType

from kafka_txn_sink import cli
from kafka_txn_sink.commit_log import JsonCommitLog
from kafka_txn_sink.files.naming import FileNaming, parse_file_name
from kafka_txn_sink.files.plan import plan_for_options
from kafka_txn_sink.files.references import parse_reference
from kafka_txn_sink.options import SinkOptions, parse_options
from kafka_txn_sink.protocol import prepare
from kafka_txn_sink.protocol.decide import commit_batch
from kafka_txn_sink.protocol.messages import Decision, FileRef, Participant, Triple
from kafka_txn_sink.protocol.prepare import ROWS_PER_CALL, prepare_task
from kafka_txn_sink.protocol.run_records import SinkMeta
from kafka_txn_sink.protocol.runs import RunRef
from kafka_txn_sink.protocol.task_plan import TaskPlan
from kafka_txn_sink.protocol.write_ids import BatchWrite
from kafka_txn_sink.storage import LocalStorage, open_file_sink
from kafka_txn_sink.testing.topics import read_topic
from tests.conftest import S3_TEST_SECRET
from tests.e2e.harness import create_topics, open_transactions

pytestmark = [pytest.mark.kafka, pytest.mark.s3]

SCHEMA = StructType([StructField("id", StringType(), False), StructField("n", LongType())])
# The row writer hands the first row alone, then groups of ROWS_PER_CALL: the task asks for the
# row after the first group once that group's files are written, and vacuum runs then.
IN_FLIGHT_AT = 1 + ROWS_PER_CALL
ROWS = IN_FLIGHT_AT + 10
PER_FILE = 1024
TWO_DAYS_MS = 48 * 3600 * 1000


class _Context:
    """What prepare_task reads of Spark's TaskContext in a batch write: partition, attempt."""

    def partitionId(self) -> int:
        return 0

    def attemptNumber(self) -> int:
        return 0

    def getLocalProperty(self, key: str) -> str | None:
        return None


@pytest.fixture
def options(
    kafka_bootstrap: str,
    s3_endpoint: str,
    s3_bucket: str,
    tmp_path: Path,
    unique: Callable[[str], str],
) -> SinkOptions:
    references = unique("refs")
    create_topics(kafka_bootstrap, 1, references)
    given = {
        "kafka.bootstrap.servers": kafka_bootstrap,
        "sinkId": unique("vac"),
        "commitLog": str(tmp_path / "log"),
        "path": f"s3://{s3_bucket}/data",
        "referencesTopic": references,
        "maxRecordsPerFile": str(PER_FILE),
        "writeId": "in-flight",
        "s3.endpoint": s3_endpoint,
        "s3.region": "us-east-1",
        "s3.accessKeyId": "testing",
        "s3.secretAccessKey": S3_TEST_SECRET,
    }
    return parse_options(given).with_transaction_timeout(600_000)


def upload(options: SinkOptions, tmp_path: Path, naming: FileNaming) -> str:
    """Upload a small data file under `naming`'s first name; its stored name."""
    assert options.files is not None
    sink = open_file_sink(options.files.path, options.s3)
    local = tmp_path / naming.name(0)
    local.write_bytes(b"not read by vacuum")
    sink.upload(local, naming.name(0))
    return naming.name(0)


def decide_batch_0(options: SinkOptions, name: str) -> None:
    """Batch 0 decided (and complete) with one file: the log a running sink would have."""
    assert options.files is not None
    sink = open_file_sink(options.files.path, options.s3)
    commit_log = JsonCommitLog(LocalStorage(Path(options.commit_log)))
    commit_log.create(SinkMeta(options.sink_id, created_at_ms=int(time.time() * 1000)))
    ref = FileRef(sink.location(name), "", {}, 1, 10, "0" * 64)
    participant = Participant(0, 0, Triple(f"{options.sink_id}-0-0", 1, 0), 1, {}, (ref,))
    decision = Decision(
        options.sink_id, "write:earlier", 0, (participant,), 1, 1, int(time.time() * 1000)
    )
    commit_log.put_decision(decision)


def vacuum(options: SinkOptions, capsys: pytest.CaptureFixture[str]) -> dict[str, Any]:
    """`vacuum --execute` with a clock two days ahead: every file is past the retention."""
    assert options.files is not None
    later = int(time.time() * 1000) + TWO_DAYS_MS
    s3 = ["--s3-endpoint", options.s3.endpoint_url or "", "--s3-region", "us-east-1"]
    args = ["--json", "vacuum", "--log", options.commit_log, "--path", options.files.path]
    code = cli.main([*args, *s3, "--now-ms", str(later), "--execute"])
    body: dict[str, Any] = json.loads(capsys.readouterr().out)
    assert code == 0, body
    return body


def rows_with_vacuum(run_vacuum: Callable[[], None]) -> Iterator[tuple[str, int]]:
    """The task's rows; vacuum runs when the task has uploaded files and asks for more."""
    for n in range(ROWS):
        if n == IN_FLIGHT_AT:
            run_vacuum()
        yield f"row-{n:06d}", n


def read_ids(options: SinkOptions, s3_client: Any, location: str) -> list[str]:
    bucket, _, key = location.removeprefix("s3://").partition("/")
    body = s3_client.get_object(Bucket=bucket, Key=key)["Body"].read()
    return [cast(dict[str, str], record)["id"] for record in fastavro.reader(io.BytesIO(body))]


def test_vacuum_keeps_a_running_tasks_files_and_deletes_decided_orphans(
    options: SinkOptions,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    s3_client: Any,
) -> None:
    assert options.files is not None
    kept_of_0 = upload(options, tmp_path, FileNaming(0, 0, 0))
    orphan_of_0 = upload(options, tmp_path, FileNaming(0, 1, 1))  # a failed attempt's file
    decide_batch_0(options, kept_of_0)
    monkeypatch.setattr(prepare.TaskContext, "get", staticmethod(_Context))
    write = BatchWrite("in-flight", 1)
    plan = TaskPlan(
        options=options,
        columns=None,
        files_plan=plan_for_options(options.files, SCHEMA),
        log_query_id=None,
        last_decided=0,
        run=RunRef(0, 0),
        write=write,
    )
    sink = open_file_sink(options.files.path, options.s3)
    vacuumed: list[dict[str, Any]] = []

    def in_flight_vacuum() -> None:
        names = (parse_file_name(f.name) for f in sink.list())
        uploaded = [n for n in names if n is not None and n.batch_id == write.batch_id]
        assert len(uploaded) == IN_FLIGHT_AT // PER_FILE  # the task's files are up already
        vacuumed.append(vacuum(options, capsys))

    task = prepare_task(plan, rows_with_vacuum(in_flight_vacuum), arrow=False)
    commit_batch(options, [task], 1, plan.run, write)

    [done] = vacuumed
    assert [f["name"] for f in done["delete"]["files"]] == [orphan_of_0]
    assert done["result"]["deleted"] == 1
    stored = {sink.location(f.name) for f in sink.list()}
    assert sink.location(orphan_of_0) not in stored
    assert sink.location(kept_of_0) in stored
    seen = read_topic(options.bootstrap_servers, options.files.references_topic)
    referenced = [parse_reference(r.value or b"").location for r in seen]
    assert len(referenced) == len(task.files) == -(-ROWS // PER_FILE)
    missing = [location for location in referenced if location not in stored]
    assert missing == [], "references name files vacuum deleted"
    ids = sorted(i for location in referenced for i in read_ids(options, s3_client, location))
    assert ids == [f"row-{n:06d}" for n in range(ROWS)]
    assert open_transactions(options.bootstrap_servers, options.sink_id) == []
