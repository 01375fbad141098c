"""Every reason a row is set aside, from outside, through kills at random failpoints.

Avro values through the real Schema Registry, and one bad row in every 40 or so, of six reasons:
a null where the registered schema needs an id (`value_encoding`), a value too large for the
topic (`too_large`), a topic that does not exist (`topic`), a partition the topic lacks
(`partition`), a timestamp at the epoch (`timestamp`) and a header without a key (`header`).
With `badRows=deadLetter` the query is killed at seeded random driver and task failpoints of
several batches and run again each time: a read_committed consumer sees every input id once, in
exactly one of the output and the dead-letter topic; each dead letter names its reason, and its
ordinal (`kts.seq`, with `provenanceHeaders` on the output too) is the row's place in its task.
With the default `badRows=fail` the same stream stops at its first batch, with an error naming
the row's fault, and nothing of it is published.
"""

from __future__ import annotations

import json
import os
import random
import uuid
import zlib
from collections import defaultdict

import pytest
from confluent_kafka import Consumer, TopicPartition

from kafka_txn_sink import testing
from kafka_txn_sink.failpoints import DRIVER_POINTS, TASK_POINTS
from kafka_txn_sink.testing.topics import read_topic
from tests.e2e.conftest import NEWEST, SPARK_LINES
from tests.e2e.harness import (
    Pipeline,
    create_topics,
    kill_group,
    open_transactions,
    produce_ids,
)
from tests.e2e.test_dead_letters import Records, assert_each_id_once

pytestmark = [pytest.mark.kafka, pytest.mark.spark, pytest.mark.registry]

EVERY = 40  # crc32(key) % EVERY picks a row's reason
REASONS = {
    0: "value_encoding",
    1: "too_large",
    2: "topic",
    3: "partition",
    4: "timestamp",
    5: "header",
}
# What each reason's error says (badRows=fail shows the first fault a task meets).
FAULTS = {
    "value_encoding": ("does not fit its avro schema",),
    "too_large": ("bytes topic", "exceeds message.max.bytes"),
    "topic": ("does not exist",),
    "partition": ("column partition holds", "names a partition that topic"),
    "timestamp": ("column timestamp holds",),
    "header": ("a header without a key",),
}
SCHEMA = {
    "type": "record",
    "name": "Order",
    "fields": [
        {"name": "id", "type": "string"},
        {"name": "note", "type": ["null", "string"], "default": None},
    ],
}
BATCH = 300  # maxOffsetsPerTrigger
KILLS = 3


def reason_of(key: str) -> str | None:
    return REASONS.get(zlib.crc32(key.encode()) % EVERY)


def bad_rows(pipeline: Pipeline, registry: testing.SchemaRegistry, output: str, dead: str) -> None:
    """The query's options and columns: Avro values, every row routed by its topic column, the
    six reasons drawn by the key's crc32."""
    pipeline.output = ""  # the topic column routes every row
    pipeline.max_offsets = BATCH
    pipeline.options.update(
        {
            "valueFormat": "avro",
            "schema.registry.url": registry.url,
            "valueSchema": json.dumps(SCHEMA),
            "valueSubject": f"{output}-value",
            "deadLetterTopic": dead,
        }
    )
    pick = f"crc32(key) % {EVERY}"
    note = f"CASE WHEN {pick} = 1 THEN repeat('x', 1200000) END"
    pipeline.select = [
        "key",
        f"named_struct('id', IF({pick} = 0, NULL, CAST(key AS STRING)), 'note', {note}) AS value",
        f"CASE WHEN {pick} = 2 THEN 'no_such_topic_{dead}' ELSE '{output}' END AS topic",
        f"CASE WHEN {pick} = 3 THEN 99 END AS partition",
        f"CASE WHEN {pick} = 4 THEN timestamp_millis(0) END AS timestamp",
        f"array(named_struct('key', IF({pick} = 5, NULL, 'source'), "
        "'value', CAST('orders' AS BINARY))) AS headers",
    ]


def next_batch(pipeline: Pipeline) -> int:
    """The first batch the next run plans anew (after any batch it runs again)."""
    offsets = pipeline.checkpoint / "offsets"
    planned = (
        [int(p.name) for p in offsets.iterdir() if p.name.isdigit()] if offsets.exists() else []
    )
    return max(planned, default=-1) + 1


def input_positions(bootstrap: str, topic: str, count: int) -> dict[str, tuple[int, int]]:
    """Each input key's (partition, offset)."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"in-{uuid.uuid4().hex}",
            "enable.auto.commit": False,
        }
    )
    try:
        consumer.assign([TopicPartition(topic, p, 0) for p in range(3)])
        found: dict[str, tuple[int, int]] = {}
        for _ in range(30):
            for message in consumer.consume(500, timeout=1.0):
                key, partition, offset = message.key(), message.partition(), message.offset()
                if isinstance(key, bytes) and partition is not None and offset is not None:
                    found[key.decode()] = (partition, offset)
            if len(found) >= count:
                break
        return found
    finally:
        consumer.close()


@pytest.mark.full  # CI: test_dead_letters.py's kill (four reasons) and the refusal below
@pytest.mark.parametrize("pipeline", SPARK_LINES, indirect=True)
def test_every_reason_goes_to_the_dead_letter_topic_once_through_random_kills(
    pipeline: Pipeline,
    schema_registry: testing.SchemaRegistry,
    capsys: pytest.CaptureFixture[str],
) -> None:
    seed = int(os.environ.get("KTS_DEAD_LETTER_SEED", str(random.randrange(1 << 30))))
    rng = random.Random(seed)
    output, dead = pipeline.output, f"dlq_{uuid.uuid4().hex[:8]}"
    create_topics(pipeline.bootstrap, 3, dead)
    bad_rows(pipeline, schema_registry, output, dead)
    pipeline.options.update({"badRows": "deadLetter", "provenanceHeaders": "true"})

    ids = produce_ids(pipeline.bootstrap, pipeline.input, 2 * BATCH)
    kills = []
    for _ in range(KILLS):
        point, batch = rng.choice(DRIVER_POINTS + TASK_POINTS), next_batch(pipeline)
        # The clean-up point fires at a run's start, whatever batch comes next.
        kills.append(point if point == "driver.before_cleanup" else f"{point}@{batch}")
        # An earlier run's arrival at the same point leaves its mark: this run's must count.
        (pipeline.signals / f"{point}.reached").unlink(missing_ok=True)
        process = pipeline.start(f"{point}=block@{batch}")
        pipeline.wait_reached(point, process)
        kill_group(process)
        ids += produce_ids(pipeline.bootstrap, pipeline.input, BATCH)
    with capsys.disabled():
        print(f"\ndead letters: seed {seed} (KTS_DEAD_LETTER_SEED), kills {kills}")
    outcome = pipeline.run()
    assert outcome.returncode == 0, outcome.error

    bad = {i: reason for i in ids if (reason := reason_of(i))}
    assert set(bad.values()) == set(REASONS.values())  # every reason is in the stream
    written, set_aside = assert_each_id_once(pipeline, output, dead, bad, ids, capsys)
    for key, headers in set_aside:
        message = (headers["kts.error.message"] or b"").decode()
        assert any(fault in message for fault in FAULTS[bad[key.decode()]]), message
    assert_ordinals(pipeline, written + set_aside)
    assert open_transactions(pipeline.bootstrap, pipeline.sink_id) == []


def assert_ordinals(pipeline: Pipeline, records: Records) -> None:
    """Each (batch, task) numbers its rows 0..n-1 across both topics, in the order the task
    read them: one input partition, offsets rising."""
    positions = input_positions(pipeline.bootstrap, pipeline.input, len(records))
    tasks: dict[tuple[bytes | None, bytes | None], list[tuple[int, str]]] = defaultdict(list)
    for key, headers in records:
        seq = int(headers["kts.seq"] or b"-1")
        tasks[(headers["kts.batch"], headers["kts.task"])].append((seq, key.decode()))
    for task, rows in tasks.items():
        rows.sort()
        assert [seq for seq, _ in rows] == list(range(len(rows))), (task, rows[:5])
        read_at = [positions[key] for _, key in rows]
        assert len({partition for partition, _ in read_at}) == 1, (task, read_at[:5])
        assert read_at == sorted(read_at), (task, read_at[:5])


@pytest.mark.parametrize("pipeline", [NEWEST], indirect=True)
def test_by_default_a_bad_row_fails_its_batch_naming_the_fault_and_nothing_is_published(
    pipeline: Pipeline, schema_registry: testing.SchemaRegistry
) -> None:
    output, dead = pipeline.output, f"dlq_{uuid.uuid4().hex[:8]}"
    create_topics(pipeline.bootstrap, 3, dead)
    bad_rows(pipeline, schema_registry, output, dead)
    del pipeline.options["deadLetterTopic"]  # badRows=fail, the default, needs none
    produce_ids(pipeline.bootstrap, pipeline.input, BATCH)  # one batch, bad rows of each reason

    outcome = pipeline.run()

    assert outcome.returncode != 0
    faults = [fault for faults in FAULTS.values() for fault in faults]
    assert any(fault in outcome.error for fault in faults), outcome.error
    assert read_topic(pipeline.bootstrap, output, "read_committed") == []
    assert read_topic(pipeline.bootstrap, dead, "read_uncommitted") == []
    assert pipeline.open_log().decided_batches() == []
    assert open_transactions(pipeline.bootstrap, pipeline.sink_id) == []
