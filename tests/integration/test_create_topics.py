"""Option createTopics on the real broker: the driver creates the output topics at the start,
before any transaction opens, with the partitions, replication factor and configs asked for;
a topic that exists is left as it is."""

from __future__ import annotations

import logging
import uuid

import pytest
from confluent_kafka.admin import AdminClient, ConfigResource

from kafka_txn_sink.errors import ConfigError
from kafka_txn_sink.kafka.cluster import Cluster
from kafka_txn_sink.options import parse_options
from kafka_txn_sink.protocol.start import resolve_against_cluster
from tests.e2e.harness import create_topics

pytestmark = pytest.mark.kafka


def options(bootstrap: str, topic: str, **extra: str):  # type: ignore[no-untyped-def]
    return parse_options(
        {
            "kafka.bootstrap.servers": bootstrap,
            "topic": topic,
            "sinkId": f"ct_{uuid.uuid4().hex[:8]}",
            "commitLog": "/tmp/unused",
            "transactionTimeoutMs": "600000",
            **extra,
        }
    )


def test_a_missing_topic_is_created_as_asked(kafka_bootstrap: str) -> None:
    topic = f"ct_{uuid.uuid4().hex[:10]}"
    asked = options(
        kafka_bootstrap,
        topic,
        createTopics="true",
        **{"createTopics.partitions": "4", "topic.config.retention.ms": "3600000"},
    )

    resolve_against_cluster(asked, Cluster(kafka_bootstrap, {}))

    admin = AdminClient({"bootstrap.servers": kafka_bootstrap})
    metadata = admin.list_topics(topic, timeout=10).topics[topic]
    assert len(metadata.partitions) == 4
    resource = ConfigResource(ConfigResource.Type.TOPIC, topic)
    configs = admin.describe_configs([resource])[resource].result(timeout=10)
    assert configs["retention.ms"].value == "3600000"


def test_each_topic_created_is_found_by_the_check_right_after(kafka_bootstrap: str) -> None:
    # CreateTopics answers once the controller has the topic; the broker that answers the next
    # metadata request may not list it yet (UNKNOWN_TOPIC_OR_PART, about 1 in 10 here). The
    # start must wait for it, not call the topic it just created missing.
    cluster = Cluster(kafka_bootstrap, {})
    topics = [f"ct_{uuid.uuid4().hex[:10]}" for _ in range(30)]
    for topic in topics:
        asked = options(
            kafka_bootstrap, topic, createTopics="true", **{"createTopics.partitions": "2"}
        )
        resolve_against_cluster(asked, cluster)

    assert [cluster.topic_partitions(t) for t in topics] == [2] * len(topics)


def test_an_existing_topic_with_other_partitions_is_left_with_a_warning(
    kafka_bootstrap: str, caplog: pytest.LogCaptureFixture
) -> None:
    topic = f"ct_{uuid.uuid4().hex[:10]}"
    create_topics(kafka_bootstrap, 3, topic)
    asked = options(
        kafka_bootstrap, topic, createTopics="true", **{"createTopics.partitions": "4"}
    )

    with caplog.at_level(logging.WARNING):
        resolve_against_cluster(asked, Cluster(kafka_bootstrap, {}))

    assert Cluster(kafka_bootstrap, {}).topic_partitions(topic) == 3
    assert f"topic {topic} exists with 3 partitions, not the 4" in caplog.text


def test_without_create_topics_a_missing_topic_is_still_refused(kafka_bootstrap: str) -> None:
    topic = f"ct_{uuid.uuid4().hex[:10]}"
    with pytest.raises(Exception, match=f"topic '{topic}' .*does not exist"):
        resolve_against_cluster(options(kafka_bootstrap, topic), Cluster(kafka_bootstrap, {}))
    assert Cluster(kafka_bootstrap, {}).topic_partitions(topic) is None


def test_a_replication_factor_the_brokers_cannot_give_is_a_config_error(
    kafka_bootstrap: str,
) -> None:
    topic = f"ct_{uuid.uuid4().hex[:10]}"
    asked = options(
        kafka_bootstrap, topic, createTopics="true", **{"createTopics.replicationFactor": "3"}
    )

    with pytest.raises(ConfigError, match=r"createTopics\.replicationFactor"):
        resolve_against_cluster(asked, Cluster(kafka_bootstrap, {}))
