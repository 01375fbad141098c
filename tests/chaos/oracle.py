"""The oracle: every input id, one by one, against what read_committed consumers see in the
records topic and in the files the references name, both checked against the commit log."""

from __future__ import annotations

import bisect
import io
import json
import os
import subprocess
import sys
from collections import Counter, defaultdict
from collections.abc import Collection, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlparse

import fastavro

from kafka_txn_sink.commit_log import CommitLog, open_commit_log
from kafka_txn_sink.files.references import parse_reference
from kafka_txn_sink.protocol.messages import Decision
from kafka_txn_sink.protocol.repair import batch_levels
from kafka_txn_sink.storage import S3Settings
from kafka_txn_sink.testing.topics import IdReport, Seen, compare_ids, read_topic
from tests.chaos.bed import Bed, Sink
from tests.chaos.removed import removed_records
from tests.e2e.harness import open_transactions


@dataclass
class OracleReport:
    """Every anomaly, id by id: nothing is summed so that a loss and a duplicate cancel out."""

    input_ids: int
    records: IdReport
    files: IdReport
    excused_ids: list[str] = field(default_factory=list)  # none since repairs (issue 26)
    aborted_reads: list[str] = field(default_factory=list)  # "partition:offset" in no decision
    duplicate_references: list[str] = field(default_factory=list)
    missing_files: list[str] = field(default_factory=list)
    unreferenced_files: list[str] = field(default_factory=list)  # decided, never referenced
    unlogged_references: list[str] = field(default_factory=list)  # referenced, in no decision
    lost_batches: list[int] = field(default_factory=list)  # the sink's own loss reports
    excused_batches: list[int] = field(default_factory=list)  # held beyond the bound, repaired
    open_transactions: list[str] = field(default_factory=list)
    late_attempts_not_skipped: list[str] = field(default_factory=list)  # from the trials
    # inflight trials whose batch's outcome key took another record than the one delivered
    # first (from the trials)
    inflight_not_as_delivered: list[str] = field(default_factory=list)
    # gone trials not settled as committed, vacuum trials that deleted files in flight
    retention_faults_failed: list[str] = field(default_factory=list)
    # after a trial or the drain, the consumer group not at a completed batch's end (group.py)
    group_not_at_a_batch_end: list[str] = field(default_factory=list)
    decided_batches: int = 0
    orphan_files: int = 0  # uploaded by failed attempts, in no decision: expected, not anomalies

    def anomalies(self) -> dict[str, list[str]]:
        return {
            "records: lost ids": sorted(set(self.records.missing) - set(self.excused_ids)),
            "records: duplicated ids": sorted(self.records.duplicated),
            "records: unexpected ids": self.records.unexpected,
            "records: aborted reads": self.aborted_reads,
            "files: lost ids": self.files.missing,
            "files: duplicated ids": sorted(self.files.duplicated),
            "files: unexpected ids": self.files.unexpected,
            "files: referenced twice": self.duplicate_references,
            "files: referenced but missing": self.missing_files,
            "files: decided, not referenced": self.unreferenced_files,
            "files: referenced, not decided": self.unlogged_references,
            "batches the sink reports lost": [str(b) for b in self.lost_batches],
            "transactions left open": self.open_transactions,
            "late attempts not skipped": self.late_attempts_not_skipped,
            "in-doubt decisions not settled as delivered": self.inflight_not_as_delivered,
            "retention faults not settled as expected": self.retention_faults_failed,
            "consumer group not at a completed batch's end": self.group_not_at_a_batch_end,
        }

    @property
    def exact(self) -> bool:
        return not any(self.anomalies().values())

    def counts(self) -> dict[str, Any]:
        return {
            "input_ids": self.input_ids,
            "decided_batches": self.decided_batches,
            "orphan_files": self.orphan_files,
            "excused_ids": len(self.excused_ids),
            "excused_batches": self.excused_batches,
            "anomalies": {k: len(v) for k, v in self.anomalies().items()},
            "examples": {k: v[:20] for k, v in self.anomalies().items() if v},
        }


def oracle(bed: Bed, sink: Sink, beyond_bound: Collection[int] = ()) -> OracleReport:
    """Compare the input topic, id by id, with what read_committed consumers see: the records
    topic, and the ids inside the files the references name; check both against the log.
    Batches in `beyond_bound` were held on purpose until the broker aborted them: the replay
    of each must have repaired what the brokers aborted (protocol/repair.py), so nothing is
    excused; their repairs' transactions count as decided.

    The one place to switch to `kafka-txn-sink verify` once it exists."""
    expected = [key_of(r.key) for r in read_topic(bed.bootstrap, sink.input, timeout_s=120)]
    commit_log = commit_log_of(bed, sink)
    decided = decisions(commit_log)
    levels = {b: batch_levels(commit_log, d) for b, d in decided.items()}
    losses = {b: found for b, lv in levels.items() if (found := [*lv.waiting(), *lv.refused()])}
    seen = with_removed(sink, sink.output, read_topic(bed.bootstrap, sink.output, timeout_s=120))
    references = with_removed(sink, sink.references, read_topic(bed.bootstrap, sink.references))
    refs = [parse_reference(r.value or b"") for r in references]
    named = Counter(ref.location for ref in refs)
    contents = read_files(bed, sorted(named))
    file_ids = [i for location, n in named.items() for i in contents.get(location, []) * n]
    logged = {f.location for d in decided.values() for p in d.participants for f in p.files}
    records = compare_ids(expected, [key_of(r.key) for r in seen])
    return OracleReport(
        input_ids=len(expected),
        records=records,
        files=compare_ids(expected, file_ids),
        aborted_reads=outside_decisions(
            seen, [d for lv in levels.values() for d in lv.levels], sink.output
        ),
        duplicate_references=sorted(loc for loc, n in named.items() if n > 1),
        missing_files=sorted(loc for loc in named if loc not in contents),
        unreferenced_files=sorted(logged - set(named)),
        unlogged_references=sorted(set(named) - logged),
        lost_batches=sorted(losses),
        excused_batches=sorted(b for b in beyond_bound if len(levels[b].levels) > 1),
        open_transactions=[str(t.triple) for t in open_transactions(bed.bootstrap, sink.sink_id)],
        decided_batches=len(decided),
        orphan_files=len(list_files(bed, sink) - logged),
    )


def verify_command(bed: Bed, sink: Sink) -> dict[str, Any]:
    """The product's own check, run as a user runs it: exit 0 when exact, 1 on any anomaly.

    It reads only what is in the log now: the records a `gone` trial deleted are lost to it."""
    command = [sys.executable, "-m", "kafka_txn_sink", "--json", "verify"]
    command += ["--bootstrap", bed.bootstrap, "--input-topic", sink.input]
    command += ["--checkpoint", str(sink.checkpoint), "--output-topic", sink.output]
    command += ["--log", sink.commit_log, "--log-format", sink.log_format]
    command += ["--references-topic", sink.references]
    command += ["--path", sink.files, "--s3-endpoint", bed.endpoint, "--s3-region", "us-east-1"]
    env = {**os.environ, "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing"}
    done = subprocess.run(command, capture_output=True, text=True, timeout=900, env=env)
    try:
        body = json.loads(done.stdout)
    except ValueError:
        body = {}
    found = {kind: n for kind, n in body.get("anomalies", {}).items() if n}
    return {"exit": done.returncode, "anomalies": found, "error": done.stderr[-2000:]}


def with_removed(
    sink: Sink, topic: str, records: Sequence[Seen], committed_only: bool = True
) -> list[Seen]:
    """`records` and the records of `topic` a `gone` trial deleted (retention.py), each once:
    read before the deletion, in case the suite stopped between its read and the deletion."""
    by_place = {(r.partition, r.offset): r for r in removed_records(sink, topic, committed_only)}
    by_place.update({(r.partition, r.offset): r for r in records})
    return [by_place[place] for place in sorted(by_place)]


def key_of(key: bytes | None) -> str:
    return (key or b"").decode()


def commit_log_of(bed: Bed, sink: Sink) -> CommitLog:
    """The sink's commit log, in its format, read from the bed's S3 server directly."""
    return open_commit_log(sink.commit_log, s3_settings(bed), sink.log_format)


def s3_settings(bed: Bed) -> S3Settings:
    return S3Settings(
        endpoint_url=bed.endpoint,
        region="us-east-1",
        access_key_id="testing",
        secret_access_key="testing",
    )


def decisions(commit_log: CommitLog) -> dict[int, Any]:
    found = {}
    for batch in commit_log.decided_batches():
        decision = commit_log.decision(batch)
        if decision is not None:
            found[batch] = decision
    return found


def outside_decisions(seen: Sequence[Any], decided: Sequence[Decision], topic: str) -> list[str]:
    """Visible records that no decided participant's offsets cover: rows of an undecided batch.

    Participants of one batch write to the same partitions at once, so their offset ranges
    overlap; they are merged per partition. (A consumer does not see which transaction wrote a
    record, so a record inside a decided range is taken as decided.)"""
    spans: dict[int, list[tuple[int, int]]] = defaultdict(list)
    for decision in decided:
        for participant in decision.participants:
            for partition, span in participant.offsets.get(topic, {}).items():
                spans[int(partition)].append(span)
    merged = {partition: merge(found) for partition, found in spans.items()}
    return [
        f"{r.partition}:{r.offset}"
        for r in seen
        if not within(merged.get(r.partition, []), r.offset)
    ]


def merge(spans: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Inclusive ranges, sorted and without overlaps: [(1, 5), (3, 9)] -> [(1, 9)]."""
    merged: list[tuple[int, int]] = []
    for first, last in sorted(spans):
        if merged and first <= merged[-1][1] + 1:
            merged[-1] = (merged[-1][0], max(merged[-1][1], last))
        else:
            merged.append((first, last))
    return merged


def within(merged: list[tuple[int, int]], offset: int) -> bool:
    index = bisect.bisect_right(merged, (offset, sys.maxsize)) - 1
    return index >= 0 and merged[index][0] <= offset <= merged[index][1]


def read_files(bed: Bed, locations: list[str]) -> dict[str, list[str]]:
    """The ids in each Avro object (absent: the object does not exist)."""
    client = bed.s3_client()

    def read(location: str) -> tuple[str, list[str] | None]:
        parsed = urlparse(location)
        try:
            body = client.get_object(Bucket=parsed.netloc, Key=parsed.path.lstrip("/"))
        except client.exceptions.NoSuchKey:
            return location, None
        records = fastavro.reader(io.BytesIO(body["Body"].read()))
        return location, [str(r["id"]) for r in records]  # type: ignore[call-overload,index]

    with ThreadPoolExecutor(8) as pool:
        return {loc: ids for loc, ids in pool.map(read, locations) if ids is not None}


def list_files(bed: Bed, sink: Sink) -> set[str]:
    """Every Avro object under the sink's path (the schemas beside them left out)."""
    parsed = urlparse(sink.files)
    prefix = parsed.path.lstrip("/") + "/"
    pages = (
        bed.s3_client()
        .get_paginator("list_objects_v2")
        .paginate(Bucket=parsed.netloc, Prefix=prefix)
    )
    return {
        f"s3://{parsed.netloc}/{item['Key']}"
        for page in pages
        for item in page.get("Contents", [])
        if item["Key"].endswith(".avro") and "/_schemas/" not in item["Key"]
    }
