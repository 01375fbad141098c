"""The test bed of kafka_txn_sink, from real parts only.

- Apache Kafka's own broker (KRaft, one node) from jars that Maven resolves from Maven Central
  (``kafka_broker``; versions, cache and Maven in ``jars``).
- An S3-compatible HTTP server: moto in server mode (``s3_server``).
- The Spark packages (Kafka source/sink, Avro) that pyspark does not ship (``jars``).

Everything binds 127.0.0.1 only; every wait is bounded; every process started here is ended at
exit unless it was started detached (``up``; see ``processes``). Tests, benchmarks, the demo and
the crash suite import it; from a shell::

    python -m kafka_txn_sink.testing fetch|up|down

Standard library only at import time; ``confluent_kafka`` is imported where a broker is probed,
and moto runs in its own process (both come with the ``testing`` extra).
"""

from __future__ import annotations

from kafka_txn_sink.testing.errors import TestbedError
from kafka_txn_sink.testing.jars import (
    MARKER,
    MAVEN_SETTINGS,
    VERSIONS_FILE,
    cache_dir,
    default_kafka_version,
    kafka_jars,
    pinned,
    read_versions,
    spark_jars,
)
from kafka_txn_sink.testing.kafka_broker import (
    ExternalKafkaBroker,
    KafkaBroker,
    create_topic,
    kafka_bootstrap,
    wait_broker_ready,
)
from kafka_txn_sink.testing.processes import tail, wait_for
from kafka_txn_sink.testing.s3_server import (
    ExternalS3Server,
    S3Server,
    s3_endpoint,
    set_default_aws_env,
)

__all__ = [
    "MARKER",
    "MAVEN_SETTINGS",
    "VERSIONS_FILE",
    "ExternalKafkaBroker",
    "ExternalS3Server",
    "KafkaBroker",
    "S3Server",
    "TestbedError",
    "cache_dir",
    "create_topic",
    "default_kafka_version",
    "kafka_bootstrap",
    "kafka_jars",
    "pinned",
    "read_versions",
    "s3_endpoint",
    "set_default_aws_env",
    "spark_jars",
    "tail",
    "wait_broker_ready",
    "wait_for",
]
