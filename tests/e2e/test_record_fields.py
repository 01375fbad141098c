"""What a record carries beyond its key and value, as a consumer reads it: the timestamp a
`timestamp` column sets, the headers option headerColumns makes of named columns and those of
option provenanceHeaders, on both Spark lines (the row writer of 4.0, the Arrow writer of
4.3)."""

from __future__ import annotations

import time
import uuid
import zlib

import pytest
from confluent_kafka import TIMESTAMP_CREATE_TIME, Consumer, TopicPartition

from tests.e2e.conftest import on_both_spark_lines
from tests.e2e.harness import Pipeline, assert_exactly_once, produce_ids

pytestmark = [pytest.mark.kafka, pytest.mark.spark]

N = 300
# Within the test broker's retention (7 days): a record's timestamp also decides when time
# retention deletes it, and timestamps older than that vanish at the next retention check.
BASE_MS = int(time.time() * 1000) - 86_400_000 + 123
SPREAD_MS = 3_600_000  # crc32(key) modulo this: within an hour after BASE_MS


def read_all(bootstrap: str, topic: str, partitions: int) -> list[tuple[bytes, int, list]]:
    """(key, (timestamp type, ms), headers) of every committed record of `topic`."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"fields-{uuid.uuid4().hex}",
            "isolation.level": "read_committed",
            "enable.auto.commit": False,
        }
    )
    try:
        consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
        seen = []
        for _ in range(60):
            for message in consumer.consume(500, timeout=1.0):
                if message.error() is None:
                    seen.append((message.key(), message.timestamp(), message.headers() or []))
            if len(seen) >= N:
                break
        return seen
    finally:
        consumer.close()


@on_both_spark_lines
def test_the_timestamp_column_header_columns_and_provenance_reach_the_consumer(
    pipeline: Pipeline,
) -> None:
    pipeline.select = [
        "key",
        "value",
        f"timestamp_millis({BASE_MS} + crc32(key) % {SPREAD_MS}) AS timestamp",
        "concat('t-', CAST(key AS STRING)) AS trace",
        "CASE WHEN crc32(key) % 2 = 0 THEN NULL ELSE key END AS origin",
    ]
    pipeline.options["headerColumns"] = "trace,origin"
    pipeline.options["provenanceHeaders"] = "true"
    ids = produce_ids(pipeline.bootstrap, pipeline.input, N)

    outcome = pipeline.run()

    assert outcome.returncode == 0, outcome.error
    assert_exactly_once(pipeline, ids)
    seen = read_all(pipeline.bootstrap, pipeline.output, 3)
    assert len(seen) == N
    decided = set(pipeline.open_log().decided_batches())
    ordinals: dict[tuple[bytes, bytes], list[int]] = {}
    for key, (kind, millis), headers in seen:
        assert key is not None
        assert (kind, millis) == (TIMESTAMP_CREATE_TIME, BASE_MS + zlib.crc32(key) % SPREAD_MS), key
        origin = None if zlib.crc32(key) % 2 == 0 else key
        assert headers[:2] == [("trace", b"t-" + key), ("origin", origin)], key
        # Provenance after every other header: this sink, a decided batch, each row's
        # ordinal in its task once.
        names = [name for name, _ in headers[2:]]
        assert names == ["kts.sink", "kts.batch", "kts.task", "kts.seq"], headers
        sink, batch, task, seq = (value for _, value in headers[2:])
        assert sink == pipeline.sink_id.encode() and batch is not None and task is not None
        assert int(batch) in decided
        ordinals.setdefault((batch, task), []).append(int(seq or b"-1"))
    for task_rows in ordinals.values():
        assert sorted(task_rows) == list(range(len(task_rows)))
