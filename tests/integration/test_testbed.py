"""The test bed itself: a real broker that does transactions, an S3 server with conditional PUT."""

from __future__ import annotations

import time
from collections.abc import Callable

import boto3
import pytest
from botocore.exceptions import ClientError
from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, Producer, TopicPartition


@pytest.mark.kafka
def test_broker_commits_a_transaction_seen_by_read_committed(
    kafka_broker, kafka_bootstrap: str, unique: Callable[[str], str]
) -> None:
    topic = kafka_broker.create_topic(unique("topic"), partitions=3)
    producer = Producer(
        {
            "bootstrap.servers": kafka_bootstrap,
            "transactional.id": unique("txn"),
            "transaction.timeout.ms": 30000,
        }
    )
    producer.init_transactions(30)
    producer.begin_transaction()
    for i in range(10):
        producer.produce(topic, key=str(i).encode(), value=f"v{i}".encode(), partition=i % 3)
    producer.commit_transaction(30)

    consumer = Consumer(
        {
            "bootstrap.servers": kafka_bootstrap,
            "group.id": unique("group"),
            "isolation.level": "read_committed",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
            "enable.partition.eof": True,
        }
    )
    try:
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(3)])
        values = _consume_until_eof(consumer, partitions=3, timeout=60)
    finally:
        consumer.close()
    assert sorted(values) == sorted(f"v{i}" for i in range(10))


def _consume_until_eof(consumer: Consumer, partitions: int, timeout: float) -> list[str]:
    values: list[str] = []
    at_eof: set[int] = set()
    deadline = time.monotonic() + timeout
    while len(at_eof) < partitions and time.monotonic() < deadline:
        msg = consumer.poll(1.0)
        if msg is None:
            continue
        err = msg.error()
        if err is not None and err.code() == KafkaError._PARTITION_EOF:
            at_eof.add(msg.partition())
        elif err is not None:
            raise AssertionError(f"consumer error: {err}")
        else:
            values.append(msg.value().decode())
    assert len(at_eof) == partitions, f"reached the end of {sorted(at_eof)} only"
    return values


@pytest.mark.s3
def test_s3_server_rejects_a_second_if_none_match_put(
    s3_endpoint: str, unique: Callable[[str], str]
) -> None:
    s3 = boto3.client("s3", endpoint_url=s3_endpoint)
    bucket = unique("bucket").lower().replace("_", "-")[:63].rstrip("-")
    s3.create_bucket(Bucket=bucket)
    s3.put_object(Bucket=bucket, Key="commit/0", Body=b"first", IfNoneMatch="*")
    with pytest.raises(ClientError) as raised:
        s3.put_object(Bucket=bucket, Key="commit/0", Body=b"second", IfNoneMatch="*")
    assert raised.value.response["ResponseMetadata"]["HTTPStatusCode"] == 412
    assert s3.get_object(Bucket=bucket, Key="commit/0")["Body"].read() == b"first"


@pytest.mark.spark
@pytest.mark.kafka
def test_spark_kafka_source_streams_with_the_resolved_jars(
    kafka_broker,
    kafka_bootstrap: str,
    spark_jars: list[str],
    unique: Callable[[str], str],
    tmp_path,
) -> None:
    """The spark_jars fixture fits the installed pyspark: a streaming Kafka source (whose
    internals follow Spark's minor version) copies a topic with Spark's built-in Kafka sink."""
    from pyspark.sql import SparkSession

    source = kafka_broker.create_topic(unique("src"), partitions=2)
    target = kafka_broker.create_topic(unique("dst"), partitions=2)
    producer = Producer({"bootstrap.servers": kafka_bootstrap})
    for i in range(20):
        producer.produce(source, value=f"v{i}".encode(), partition=i % 2)
    assert producer.flush(30) == 0

    spark = (
        SparkSession.builder.master("local[2]")
        .appName("test_testbed")
        .config("spark.jars", ",".join(spark_jars))
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .getOrCreate()
    )
    try:
        query = (
            spark.readStream.format("kafka")
            .option("kafka.bootstrap.servers", kafka_bootstrap)
            .option("subscribe", source)
            .option("startingOffsets", "earliest")
            .load()
            .selectExpr("value")
            .writeStream.format("kafka")
            .option("kafka.bootstrap.servers", kafka_bootstrap)
            .option("topic", target)
            .option("checkpointLocation", str(tmp_path / "checkpoint"))
            .trigger(availableNow=True)
            .start()
        )
        assert query.awaitTermination(180), "the availableNow query did not finish in time"
        assert query.exception() is None
        copied = (
            spark.read.format("kafka")
            .option("kafka.bootstrap.servers", kafka_bootstrap)
            .option("subscribe", target)
            .load()
            .selectExpr("CAST(value AS STRING) AS v")
        )
        assert sorted(r.v for r in copied.collect()) == sorted(f"v{i}" for i in range(20))
    finally:
        spark.stop()
