"""The test bed of kafka_txn_sink, from real parts only, and the test kit of its users.

- Apache Kafka's own broker (KRaft, one node) from jars that Maven resolves from Maven Central
  (``kafka_broker``; versions, cache and Maven in ``jars``), also secured as in production: TLS,
  SASL (SCRAM, PLAIN), mutual TLS and ACLs, from a CA it makes itself (``secured_broker``,
  ``certificates``); that secured broker also authenticating AWS MSK IAM tokens, checked for
  real by a Java callback handler compiled here (``iam_broker``); three such nodes as one
  cluster whose nodes tests kill and restart (``kafka_cluster``).
- A Spark standalone cluster (a master and workers on loopback) and a virtual environment with
  the package installed from its wheel, for executors in JVMs of their own (``spark_cluster``).
- A Spark Connect server started from an installed PySpark, for queries a Connect client sends,
  that tests kill with its whole process tree and start again (``spark_connect``).
- An S3-compatible HTTP server: moto in server mode (``s3_server``).
- A Schema Registry serving the Confluent-compatible API: Apicurio Registry, rebuilt by Maven from
  Maven Central's jars (``schema_registry``).
- The Spark packages (Kafka source/sink, Avro) that pyspark does not ship (``jars``), and a local
  SparkSession with them (``spark_session``).
- For tests of pipelines that end in the sink: pytest fixtures (``plugin``, loaded by pytest
  through the package's entry point) and ``read_committed`` / ``read_committed_values`` (values
  of a Schema Registry's format, decoded) / ``read_referenced_files`` (``readers``), DataFrames
  of what read_committed consumers see, ready for chispa.

Everything binds 127.0.0.1 only; every wait is bounded; every process started here is ended at
exit unless it was started detached (``up``; see ``processes``). Tests, benchmarks, the demo and
the crash suite import it; from a shell::

    python -m kafka_txn_sink.testing fetch|up|down

Standard library only at import time; ``confluent_kafka`` is imported where a broker is probed,
pyspark where a session starts or a reader runs, and moto runs in its own process (the
``testing`` extra).
"""

from __future__ import annotations

from kafka_txn_sink.testing.errors import TestbedError
from kafka_txn_sink.testing.iam_broker import IamKafkaBroker
from kafka_txn_sink.testing.jars import (
    MARKER,
    MAVEN_SETTINGS,
    VERSIONS_FILE,
    cache_dir,
    default_kafka_version,
    kafka_jars,
    newest_spark_line,
    pinned,
    read_versions,
    spark_jars,
    spark_jars_of,
    spark_newest_package_env,
)
from kafka_txn_sink.testing.kafka_broker import (
    AnyKafkaBroker,
    ExternalKafkaBroker,
    KafkaBroker,
    create_topic,
    kafka_bootstrap,
    wait_broker_ready,
)
from kafka_txn_sink.testing.kafka_cluster import KafkaCluster
from kafka_txn_sink.testing.processes import java_executable, maven_executable, tail, wait_for
from kafka_txn_sink.testing.readers import (
    KAFKA_COLUMNS,
    read_committed,
    read_committed_values,
    read_referenced_files,
)
from kafka_txn_sink.testing.s3_server import (
    AnyS3Server,
    ExternalS3Server,
    S3Server,
    create_bucket,
    s3_endpoint,
    s3_settings,
    set_default_aws_env,
    sink_s3_options,
)
from kafka_txn_sink.testing.schema_registry import (
    SchemaRegistry,
    apicurio_version,
    registry_runner,
)
from kafka_txn_sink.testing.secured_broker import KafkaUser, SecuredKafkaBroker
from kafka_txn_sink.testing.spark_session import BOOTSTRAP_CONF, local_spark, stop_spark

__all__ = [
    "BOOTSTRAP_CONF",
    "KAFKA_COLUMNS",
    "MARKER",
    "MAVEN_SETTINGS",
    "VERSIONS_FILE",
    "AnyKafkaBroker",
    "AnyS3Server",
    "ExternalKafkaBroker",
    "ExternalS3Server",
    "IamKafkaBroker",
    "KafkaBroker",
    "KafkaCluster",
    "KafkaUser",
    "S3Server",
    "SchemaRegistry",
    "SecuredKafkaBroker",
    "TestbedError",
    "apicurio_version",
    "cache_dir",
    "create_bucket",
    "create_topic",
    "default_kafka_version",
    "java_executable",
    "kafka_bootstrap",
    "kafka_jars",
    "local_spark",
    "maven_executable",
    "newest_spark_line",
    "pinned",
    "read_committed",
    "read_committed_values",
    "read_referenced_files",
    "read_versions",
    "registry_runner",
    "s3_endpoint",
    "s3_settings",
    "set_default_aws_env",
    "sink_s3_options",
    "spark_jars",
    "spark_jars_of",
    "spark_newest_package_env",
    "stop_spark",
    "tail",
    "wait_broker_ready",
    "wait_for",
]
