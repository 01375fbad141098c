"""Files mode on a real broker and real Spark: partitioned Avro files, one reference per file,
each input row in exactly one referenced file, each file referenced once."""

from __future__ import annotations

import uuid
from collections import Counter
from pathlib import Path

import fastavro
import pytest

from kafka_txn_sink.files_mode import parse_reference
from kafka_txn_sink.verify import compare_ids, read_topic
from tests.e2e.harness import Pipeline, create_topics, kill_group, open_transactions, produce_events

pytestmark = [pytest.mark.kafka, pytest.mark.spark]

SELECT = [
    "CAST(key AS STRING) AS id",
    "get_json_object(CAST(value AS STRING), '$.user') AS user",
    "to_timestamp(get_json_object(CAST(value AS STRING), '$.ts')) AS ts",
    "CAST(value AS STRING) AS payload",
]


@pytest.fixture
def files_pipeline(pipeline: Pipeline) -> Pipeline:
    references = f"refs_{uuid.uuid4().hex[:8]}"
    create_topics(pipeline.bootstrap, 3, references)
    pipeline.output = ""  # files mode alone
    pipeline.select = SELECT
    pipeline.options.update(
        {
            "path": str(pipeline.workdir / "files"),
            "referencesTopic": references,
            "partitionBy": "user",
            "timePartitionColumn": "ts",
            "timePartitionPattern": "date=yyyy-MM-dd/hour=HH",
            "payloadColumn": "payload",
            "avroCodec": "snappy",
        }
    )
    return pipeline


def referenced_ids(pipeline: Pipeline) -> tuple[list[str], Counter[str]]:
    """Ids in the files that read_committed references name, and how often each file is named."""
    topic = pipeline.options["referencesTopic"]
    refs = [parse_reference(r.value or b"") for r in read_topic(pipeline.bootstrap, topic)]
    named = Counter(ref.location for ref in refs)
    ids: list[str] = []
    for ref in refs:
        path = Path(ref.location)
        assert path.parent.relative_to(pipeline.workdir / "files").as_posix() == ref.partition_path
        with path.open("rb") as avro:
            records = list(fastavro.reader(avro))
        assert len(records) == ref.records
        assert {r["user"] for r in records} == {ref.partition_values["user"]}
        ids.extend(r["id"] for r in records)
    return ids, named


def test_files_partitioned_and_referenced_exactly_once(files_pipeline: Pipeline) -> None:
    ids = produce_events(files_pipeline.bootstrap, files_pipeline.input, 900, users=4)

    outcome = files_pipeline.run()

    assert outcome.returncode == 0, outcome.error
    seen, named = referenced_ids(files_pipeline)
    report = compare_ids(ids, seen)
    assert report.exact, report.summary()
    assert set(named.values()) == {1}, "a file is referenced more than once"
    partitions = {
        Path(loc).parent.relative_to(files_pipeline.workdir / "files").as_posix() for loc in named
    }
    assert "user=user0/date=2026-11-21/hour=00" in partitions
    decided = files_pipeline.open_log().decision(0)
    assert decided is not None and all(p.files for p in decided.participants)
    assert open_transactions(files_pipeline.bootstrap, files_pipeline.sink_id) == []


def test_files_mode_killed_after_the_decision(files_pipeline: Pipeline) -> None:
    ids = produce_events(files_pipeline.bootstrap, files_pipeline.input, 900, users=4)

    process = files_pipeline.start("driver.after_decision=block@1")
    files_pipeline.wait_reached("driver.after_decision", process)
    kill_group(process)
    outcome = files_pipeline.run()

    assert outcome.returncode == 0, outcome.error
    seen, named = referenced_ids(files_pipeline)
    report = compare_ids(ids, seen)
    assert report.exact, report.summary()
    assert set(named.values()) == {1}
    assert logged_files(files_pipeline) == sorted(named), "the log lists the referenced files"


def logged_files(pipeline: Pipeline) -> list[str]:
    commit_log = pipeline.open_log()
    locations = []
    for batch in commit_log.decided_batches():
        decision = commit_log.decision(batch)
        assert decision is not None
        locations += [f.location for p in decision.participants for f in p.files]
    return sorted(locations)
