"""pytest fixtures for testing pipelines that end in ``format("kafka_txn")``, from real parts.

Installed with the package, pytest loads this plugin by itself (entry point ``pytest11``;
``-p no:kafka_txn_sink.testing.plugin`` turns it off). Nothing starts until a test asks for a
fixture; then each part is started once per test session:

- ``kts_kafka``: Apache Kafka's broker (KRaft, one node, loopback), from jars Maven resolves from
  Maven Central (Java and Maven needed); or the broker at ``$KTS_KAFKA_BOOTSTRAP``. It has
  ``.bootstrap`` and ``.create_topic(name, partitions=3)``.
- ``kts_s3``: an S3-compatible server (moto in server mode, the ``testing`` extra); or the
  endpoint at ``$KTS_S3_ENDPOINT``. It has ``.endpoint``; ``kts_s3_bucket`` is a new bucket per
  test, and ``sink_s3_options(endpoint)`` / ``s3_settings(endpoint)`` reach it.
- ``kts_schema_registry``: a Schema Registry (Apicurio Registry, built by Maven from Maven
  Central's jars; Java and Maven needed) serving the Confluent-compatible API at ``.url``, for
  ``confluent_kafka.schema_registry.SchemaRegistryClient`` and its serializers; schemas in
  memory, for the session.
- ``kts_spark``: a local SparkSession with Spark's Kafka connector and spark-avro on
  ``spark.jars`` (``kts_spark_jars``), at the version of ``SPARK_VERSION`` in ``versions.env``
  unless ``KTS_SPARK_KAFKA_VERSION`` (and friends) say otherwise; settings from
  ``kts_spark_conf``, a fixture to override. ``read_committed(kts_spark, topic)`` reads from
  ``kts_kafka``.

A part that cannot be fetched or started fails the tests that need it, with the reason and no
traceback; it is never replaced by a mock nor skipped.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

import pytest

from kafka_txn_sink.testing.errors import TestbedError
from kafka_txn_sink.testing.jars import spark_jars
from kafka_txn_sink.testing.kafka_broker import AnyKafkaBroker, ExternalKafkaBroker, KafkaBroker
from kafka_txn_sink.testing.s3_server import AnyS3Server, ExternalS3Server, S3Server, create_bucket
from kafka_txn_sink.testing.schema_registry import SchemaRegistry
from kafka_txn_sink.testing.spark_session import BOOTSTRAP_CONF, local_spark, stop_spark

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


@contextmanager
def _reported() -> Iterator[None]:
    """A test bed error fails the test with its message alone (it says what is missing)."""
    try:
        yield
    except TestbedError as exc:
        pytest.fail(f"kafka_txn_sink.testing: {exc}", pytrace=False)


@pytest.fixture(scope="session")
def kts_kafka(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AnyKafkaBroker]:
    """The session's Kafka broker: ours, or the one at ``$KTS_KAFKA_BOOTSTRAP``."""
    external = os.environ.get("KTS_KAFKA_BOOTSTRAP")
    broker: AnyKafkaBroker = (
        ExternalKafkaBroker(external)
        if external
        else KafkaBroker(tmp_path_factory.mktemp("kts_kafka"))
    )
    try:
        with _reported():
            broker.start()
        yield broker
    finally:
        if not external:
            broker.stop()


@pytest.fixture(scope="session")
def kts_s3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AnyS3Server]:
    """The session's S3-compatible server: ours (moto), or the one at ``$KTS_S3_ENDPOINT``."""
    external = os.environ.get("KTS_S3_ENDPOINT")
    if external:
        yield ExternalS3Server(external)
        return
    server = S3Server(tmp_path_factory.mktemp("kts_s3"))
    try:
        with _reported():
            server.start()
        yield server
    finally:
        server.stop()


@pytest.fixture
def kts_s3_bucket(kts_s3: AnyS3Server) -> str:
    """A new, empty bucket on ``kts_s3``."""
    return create_bucket(kts_s3.endpoint)


@pytest.fixture(scope="session")
def kts_schema_registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SchemaRegistry]:
    """The session's Schema Registry; ``.url`` is its Confluent-compatible API (ccompat v7)."""
    registry = SchemaRegistry(tmp_path_factory.mktemp("kts_schema_registry"))
    try:
        with _reported():
            registry.start()
        yield registry
    finally:
        registry.stop()


@pytest.fixture(scope="session")
def kts_spark_jars() -> list[str]:
    """Jar paths for ``spark.jars``: Spark's Kafka source and sink, spark-avro, their deps."""
    with _reported():
        jars = [str(path) for path in spark_jars()]
        if not jars:
            raise TestbedError("no Spark package jars were resolved")
    return jars


@pytest.fixture(scope="session")
def kts_spark_conf() -> dict[str, str]:
    """Spark settings of ``kts_spark`` over its defaults; override this fixture to add some."""
    return {}


@pytest.fixture(scope="session")
def kts_spark(
    kts_spark_jars: list[str], kts_spark_conf: dict[str, str], kts_kafka: AnyKafkaBroker
) -> Iterator[SparkSession]:
    """A local SparkSession (``local[2]``, UTC) with the connector jars, bound to ``kts_kafka``."""
    with _reported():
        spark = local_spark(kts_spark_jars, {BOOTSTRAP_CONF: kts_kafka.bootstrap, **kts_spark_conf})
    yield spark
    stop_spark(spark)
