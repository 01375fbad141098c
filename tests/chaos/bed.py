"""The suite's test bed and the sink under test.

The broker and the S3 server are kafka_txn_sink.testing's (or `KTS_KAFKA_BOOTSTRAP` /
`KTS_S3_ENDPOINT`, which the suite cannot restart or pause: those faults are then left out of the
schedule). The sink writes records to a topic and Avro files plus references, with its files and
its commit log on the S3 server, so S3 faults reach both the uploads and the commit point.

moto keeps objects in memory only; between runs of the suite (slices, resume) the bucket is
mirrored into the state directory and loaded back into a fresh server.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import boto3

from kafka_txn_sink.commit_log import LogFormat
from kafka_txn_sink.testing import (
    ExternalKafkaBroker,
    ExternalS3Server,
    KafkaBroker,
    S3Server,
    create_topic,
    set_default_aws_env,
)
from kafka_txn_sink.testing.kafka_cluster import KafkaCluster
from tests.chaos.query import QuerySpec

Broker = KafkaBroker | ExternalKafkaBroker | KafkaCluster
S3 = S3Server | ExternalS3Server

S3_CREDENTIALS = {
    "s3.region": "us-east-1",
    "s3.accessKeyId": "testing",
    "s3.secretAccessKey": "testing",
}
# Columns for both modes: key/value for the records, the rest for the partitioned files.
SELECT = (
    "key",
    "value",
    "get_json_object(CAST(value AS STRING), '$.user') AS user",
    "to_timestamp(get_json_object(CAST(value AS STRING), '$.ts')) AS ts",
    "CAST(value AS STRING) AS payload",
)
INPUT_PARTITIONS = 2  # two Spark tasks, two participants per batch
MAX_OFFSETS = 200


@dataclass
class Bed:
    broker: Broker
    s3: S3
    mirror_s3: bool  # the S3 server is ours and in memory: mirror its bucket between runs

    @property
    def bootstrap(self) -> str:
        return self.broker.bootstrap

    @property
    def endpoint(self) -> str:
        return self.s3.endpoint

    @property
    def can_restart_broker(self) -> bool:
        return isinstance(self.broker, KafkaBroker)

    @property
    def cluster(self) -> KafkaCluster | None:
        """The Kafka nodes, when the bed runs several (coordinator kills need them)."""
        return self.broker if isinstance(self.broker, KafkaCluster) else None

    @property
    def replication(self) -> int:
        """Replicas of the sink's topics: one on every node."""
        return len(self.cluster.nodes) if self.cluster else 1

    @property
    def can_pause_s3(self) -> bool:
        return isinstance(self.s3, S3Server)

    def s3_client(self) -> Any:
        return boto3.client(
            "s3",
            endpoint_url=self.endpoint,
            region_name="us-east-1",
            aws_access_key_id="testing",
            aws_secret_access_key="testing",
        )


@contextmanager
def own_bed(directory: Path, nodes: int = 1) -> Iterator[Bed]:
    """A broker, or a cluster of `nodes` (data kept in `directory`), and an S3 server; or the
    external ones (`nodes` > 1 needs a bed of its own)."""
    set_default_aws_env()
    external_kafka = os.environ.get("KTS_KAFKA_BOOTSTRAP")
    external_s3 = os.environ.get("KTS_S3_ENDPOINT")
    broker: Broker
    if nodes > 1:
        broker = KafkaCluster(directory / "kafka", nodes)
    elif external_kafka:
        broker = ExternalKafkaBroker(external_kafka)
    else:
        broker = KafkaBroker(directory / "kafka")
    s3: S3 = ExternalS3Server(external_s3) if external_s3 else S3Server(directory / "s3server")
    try:
        if isinstance(s3, S3Server):
            s3.start()
        broker.start(timeout=180)
        yield Bed(broker, s3, mirror_s3=not external_s3)
    finally:
        if isinstance(s3, S3Server):
            s3.stop()
        if isinstance(broker, KafkaBroker | KafkaCluster):
            broker.stop()


@dataclass(frozen=True)
class Sink:
    """The names of the sink under test; `name` and `log_format` are kept in the state file."""

    name: str
    workdir: Path
    log_format: LogFormat = "json"

    @property
    def sink_id(self) -> str:
        return f"chaos_{self.name}"

    @property
    def input(self) -> str:
        return f"chaos_in_{self.name}"

    @property
    def output(self) -> str:
        return f"chaos_out_{self.name}"

    @property
    def references(self) -> str:
        return f"chaos_refs_{self.name}"

    @property
    def group(self) -> str:
        """The consumer group the sink commits its input offsets to (option consumerGroup)."""
        return f"chaos_group_{self.name}"

    @property
    def bucket(self) -> str:
        return f"chaos-{self.name}".replace("_", "-").lower()

    @property
    def commit_log(self) -> str:
        return f"s3://{self.bucket}/sink/_log"

    @property
    def files(self) -> str:
        return f"s3://{self.bucket}/sink/data"

    @property
    def checkpoint(self) -> Path:
        return self.workdir / "checkpoint"

    def create(self, bed: Bed) -> None:
        for topic, partitions in ((self.input, INPUT_PARTITIONS), (self.output, 3),
                                  (self.references, 2)):  # fmt: skip
            create_topic(bed.bootstrap, topic, partitions, replication_factor=bed.replication)
        bed.s3_client().create_bucket(Bucket=self.bucket)

    def query(self, bed: Bed, jars: str) -> QuerySpec:
        options = {
            **S3_CREDENTIALS,
            "s3.endpoint": bed.endpoint,
            "path": self.files,
            "referencesTopic": self.references,
            "partitionBy": "user",
            "timePartitionColumn": "ts",
            "timePartitionPattern": "date=yyyy-MM-dd/hour=HH",
            "payloadColumn": "payload",
            "avroCodec": "snappy",
            # Short S3 deadlines (2 s a call, 3 attempts), so a frozen S3 server fails
            # requests within seconds; the transaction timeout is the brokers' maximum.
            "commitLogTimeoutMs": "12000",
            "commitTimeoutMs": "10000",
            "commitLogFormat": self.log_format,
            "consumerGroup": self.group,
        }
        return QuerySpec(
            bootstrap=bed.bootstrap,
            input=self.input,
            output=self.output,
            sink_id=self.sink_id,
            commit_log=self.commit_log,
            checkpoint=self.checkpoint,
            jars=jars,
            max_offsets=MAX_OFFSETS,
            options=options,
            select=SELECT,
        )


# -- the bucket between runs -----------------------------------------------------------------


def save_bucket(client: Any, bucket: str, directory: Path) -> int:
    """Mirror `bucket` into `directory` (objects that changed only); returns the object count."""
    manifest_path = directory / "manifest.json"
    manifest: dict[str, str] = (
        json.loads(manifest_path.read_text()) if manifest_path.exists() else {}
    )
    listed = {
        item["Key"]: item["ETag"]
        for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket)
        for item in page.get("Contents", [])
    }
    changed = [key for key, etag in listed.items() if manifest.get(key) != etag]

    def fetch(key: str) -> None:
        target = directory / "objects" / key
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(client.get_object(Bucket=bucket, Key=key)["Body"].read())

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(fetch, changed))
    write_json(manifest_path, listed)
    return len(listed)


def load_bucket(client: Any, bucket: str, directory: Path) -> int:
    """Create `bucket` with the objects `save_bucket` mirrored; returns the object count."""
    manifest_path = directory / "manifest.json"
    keys = list(json.loads(manifest_path.read_text())) if manifest_path.exists() else []
    client.create_bucket(Bucket=bucket)

    def put(key: str) -> None:
        body = (directory / "objects" / key).read_bytes()
        client.put_object(Bucket=bucket, Key=key, Body=body)

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(put, keys))
    return len(keys)


def write_json(path: Path, body: Any) -> None:
    """Replace `path` atomically: a crash leaves the old file or the new one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    temp = path.with_name(path.name + ".tmp")
    temp.write_text(json.dumps(body, indent=1, sort_keys=True))
    os.replace(temp, path)
