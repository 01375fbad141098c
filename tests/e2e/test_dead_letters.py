"""Option badRows=deadLetter from outside: a stream with bad rows of several reasons (a value
too large for the topic, a topic that does not exist, a partition the topic lacks, a timestamp
at the epoch), its driver killed after a decision and the query run again; a read_committed
consumer of the output and of the dead-letter topic sees every input id once, in exactly one of
the two, and each dead letter says why; `verify`, given both topics, finds each id once. Both
Spark lines: the row writer and the Arrow one."""

from __future__ import annotations

import uuid
import zlib

import pytest
from confluent_kafka import Consumer, TopicPartition

from tests.e2e.conftest import NEWEST, SPARK_LINES
from tests.e2e.harness import Pipeline, create_topics, kill_group, produce_ids
from tests.e2e.test_repair import cli_json

pytestmark = [pytest.mark.kafka, pytest.mark.spark]

N = 500
EVERY = 37  # one bad row in every 37 or so: crc32(key) % EVERY picks the reason
REASONS = {0: "too_large", 1: "topic", 2: "partition", 3: "timestamp"}


def read(bootstrap: str, topic: str, wanted: int) -> list[tuple[bytes, dict[str, bytes | None]]]:
    """(key, headers) of every committed record of `topic` (3 partitions)."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"dead-{uuid.uuid4().hex}",
            "isolation.level": "read_committed",
            "enable.auto.commit": False,
            "fetch.message.max.bytes": 2_000_000,
        }
    )
    try:
        consumer.assign([TopicPartition(topic, p, 0) for p in range(3)])
        seen: list[tuple[bytes, dict[str, bytes | None]]] = []
        for _ in range(30):
            for message in consumer.consume(500, timeout=1.0):
                if message.error() is None:
                    seen.append((message.key(), dict(message.headers() or [])))
            if len(seen) >= wanted:
                break
        return seen
    finally:
        consumer.close()


def expected_reason(key: str) -> str | None:
    return REASONS.get(zlib.crc32(key.encode()) % EVERY)


# CI: the newest line, whose Arrow batches fall back to rows around a bad one; 4.0 (rows
# throughout) in the full tier.
@pytest.mark.parametrize(
    "pipeline", [pytest.param(SPARK_LINES[0], marks=pytest.mark.full), NEWEST], indirect=True
)
def test_bad_rows_go_to_the_dead_letter_topic_once_through_a_kill(
    pipeline: Pipeline, capsys: pytest.CaptureFixture[str]
) -> None:
    output, dead = pipeline.output, f"dlq_{uuid.uuid4().hex[:8]}"
    create_topics(pipeline.bootstrap, 3, dead)
    pipeline.output = ""  # the topic column routes every row
    pipeline.options.update({"badRows": "deadLetter", "deadLetterTopic": dead})
    pick = f"crc32(key) % {EVERY}"
    pipeline.select = [
        "key",
        f"CASE WHEN {pick} = 0 THEN repeat('x', 1200000) ELSE CAST(value AS STRING) END AS value",
        f"CASE WHEN {pick} = 1 THEN 'no_such_topic_{dead}' ELSE '{output}' END AS topic",
        f"CASE WHEN {pick} = 2 THEN 99 END AS partition",
        f"CASE WHEN {pick} = 3 THEN timestamp_millis(0) END AS timestamp",
    ]
    ids = produce_ids(pipeline.bootstrap, pipeline.input, N)
    bad = {i: expected_reason(i) for i in ids if expected_reason(i)}
    assert set(bad.values()) == set(REASONS.values())  # every reason is in the stream

    process = pipeline.start("driver.after_decision=block@1")
    pipeline.wait_reached("driver.after_decision", process)
    kill_group(process)
    outcome = pipeline.run()
    assert outcome.returncode == 0, outcome.error

    assert_each_id_once(pipeline, output, dead, bad, ids, capsys)


Records = list[tuple[bytes, dict[str, bytes | None]]]


def assert_each_id_once(
    pipeline: Pipeline,
    output: str,
    dead: str,
    bad: dict[str, str],
    ids: list[str],
    capsys: pytest.CaptureFixture[str],
) -> tuple[Records, Records]:
    """Every input id once, in exactly one of `output` and `dead`; the `bad` ones set aside,
    each with its reason and this sink's id; the decisions counting them; `verify`, given both
    topics, finding each id once. Returns what each topic holds."""
    written = read(pipeline.bootstrap, output, len(ids) - len(bad))
    set_aside = read(pipeline.bootstrap, dead, len(bad))
    out_keys = [key.decode() for key, _ in written]
    dead_keys = [key.decode() for key, _ in set_aside]
    assert sorted(out_keys + dead_keys) == sorted(ids)  # each once, in exactly one topic
    assert sorted(dead_keys) == sorted(bad)
    for key, headers in set_aside:
        assert headers["kts.error.kind"] == bad[key.decode()].encode(), headers
        assert headers["kts.sink"] == pipeline.sink_id.encode()
    decided = [pipeline.open_log().decision(b) for b in pipeline.open_log().decided_batches()]
    counted = sum(p.dead_lettered for d in decided if d is not None for p in d.participants)
    assert counted == len(bad)
    where = ["--log", str(pipeline.commit_log), "--checkpoint", str(pipeline.checkpoint)]
    topics = ["--input-topic", pipeline.input, "--output-topic", output, "--output-topic", dead]
    code, report = cli_json(capsys, "verify", "--bootstrap", pipeline.bootstrap, *topics, *where)
    assert code == 0, report
    return written, set_aside
