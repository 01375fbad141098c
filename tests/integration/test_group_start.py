"""Option consumerGroup's checks before a batch, against a real broker and a checkpoint laid out as
Spark writes it: a group with an active member, an input topic not on the output cluster, and a
source that is not Kafka each stop the start with an error naming the group or topic and the
cause. (tests/e2e/test_consumer_group.py runs the first and the last through Spark in the full
tier.)"""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest
from confluent_kafka import Consumer

from kafka_txn_sink.errors import ConfigError
from kafka_txn_sink.kafka.cluster import Cluster
from kafka_txn_sink.options import SinkOptions, parse_options
from kafka_txn_sink.protocol.progress import check_progress_start
from tests.e2e.harness import create_topics

pytestmark = pytest.mark.kafka

META = '{"batchWatermarkMs":0,"batchTimestampMs":0,"conf":{}}'


def checkpoint(path: Path, source_line: str) -> Path:
    """A checkpoint whose one batch (0) has `source_line` as its only source's offsets."""
    (path / "offsets").mkdir(parents=True)
    (path / "offsets" / "0").write_text(f"v1\n{META}\n{source_line}")
    return path


def options(bootstrap: str, path: Path, group: str) -> SinkOptions:
    return parse_options({
        "kafka.bootstrap.servers": bootstrap, "topic": "unused", "sinkId": "s",
        "commitLog": str(path / "log"), "checkpointLocation": str(path / "checkpoint"),
        "consumerGroup": group,
    })  # fmt: skip


def test_a_group_with_an_active_member_is_refused(kafka_bootstrap: str, tmp_path: Path) -> None:
    name = uuid.uuid4().hex[:8]
    source, group = f"in_{name}", f"g_{name}"
    create_topics(kafka_bootstrap, 2, source)
    checkpoint(tmp_path / "checkpoint", json.dumps({source: {"0": 0, "1": 0}}))
    member = Consumer({"bootstrap.servers": kafka_bootstrap, "group.id": group})
    member.subscribe([source])
    try:
        for _ in range(60):
            member.poll(0.5)
            if member.assignment():
                break
        with pytest.raises(ConfigError, match=f"consumer group {group} has 1 active member"):
            check_progress_start(
                options(kafka_bootstrap, tmp_path, group), cluster(kafka_bootstrap)
            )
    finally:
        member.close()
    # Once the member left, the same start passes.
    check_progress_start(options(kafka_bootstrap, tmp_path, group), cluster(kafka_bootstrap))


def test_an_input_topic_not_on_the_output_cluster_is_refused(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    checkpoint(tmp_path / "checkpoint", json.dumps({"elsewhere": {"0": 5}}))

    with pytest.raises(ConfigError, match=r"input topic elsewhere .*not on the output cluster"):
        check_progress_start(options(kafka_bootstrap, tmp_path, "g"), cluster(kafka_bootstrap))


def test_a_topic_of_the_same_name_with_fewer_records_is_refused(
    kafka_bootstrap: str, tmp_path: Path
) -> None:
    """The query read another cluster's topic: its offsets are beyond this one's end."""
    source = f"in_{uuid.uuid4().hex[:8]}"
    create_topics(kafka_bootstrap, 2, source)
    checkpoint(tmp_path / "checkpoint", json.dumps({source: {"0": 5, "1": 0}}))

    with pytest.raises(ConfigError, match=rf"input topic {source} is not on the output cluster .*"
                       r"the query read up to \{0: 5\}, the end here is \{0: 0\}"):  # fmt: skip
        check_progress_start(options(kafka_bootstrap, tmp_path, "g"), cluster(kafka_bootstrap))


def test_a_source_that_is_not_kafka_is_refused(kafka_bootstrap: str, tmp_path: Path) -> None:
    checkpoint(tmp_path / "checkpoint", '{"logOffset":3}')  # Spark's file source

    with pytest.raises(ConfigError, match=r"offsets/0 names no Kafka topic; option consumerGroup"):
        check_progress_start(options(kafka_bootstrap, tmp_path, "g"), cluster(kafka_bootstrap))


def cluster(bootstrap: str) -> Cluster:
    return Cluster(bootstrap, {}, 15_000)
