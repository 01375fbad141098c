"""Session fixtures of the test bed: a real broker, S3 server and jars, as the fixtures of
``kafka_txn_sink.testing.plugin`` (the kit users get) start them, under this suite's names.

Bring your own: ``KTS_KAFKA_BOOTSTRAP`` uses an existing broker and ``KTS_S3_ENDPOINT`` an
existing S3 endpoint instead of starting ours. A part that cannot be started fails the tests
that need it; it is never skipped.
"""

from __future__ import annotations

import faulthandler
import itertools
import os
import re
import signal
import sys
import uuid
from collections.abc import Callable, Iterator, Mapping
from typing import Any, TypeVar

import boto3
import pytest

from kafka_txn_sink import testing
from kafka_txn_sink.storage import S3Settings
from kafka_txn_sink.testing.iam_broker import IamKafkaBroker
from kafka_txn_sink.testing.kafka_broker import KafkaBroker
from kafka_txn_sink.testing.secured_broker import SecuredKafkaBroker

Broker = testing.AnyKafkaBroker
S3 = testing.AnyS3Server

# Also loaded through the package's pytest11 entry point, which has this name: then this is a
# no-op; before the package is (re)installed with it, this loads it.
pytest_plugins = ["kafka_txn_sink.testing.plugin"]

testing.set_default_aws_env()
# Spark's Python workers must run this interpreter (it has the package), on loopback only.
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
# Every JVM the tests start (brokers, Spark drivers, Connect servers) lives seconds to minutes on
# two cores: C2's compiling costs more CPU than its code saves there (C1 alone: 26% less CPU and
# 10% less time for four e2e tests in one measurement). The `java` launcher reads this variable.
os.environ.setdefault("JDK_JAVA_OPTIONS", "-XX:TieredStopAtLevel=1")


def pytest_configure(config: pytest.Config) -> None:
    """A test process ended by a signal Python does not turn into an error dies without a word,
    as an xdist worker did once in CI ("worker crashed", nothing on stderr: pytest had captured
    it). For these signals every thread's stack goes to the run's real stderr, then the signal
    acts as before. SIGKILL cannot be caught, and the worker crash of 2026-11-27 (a segfault
    in a librdkafka thread, docs/development.md) printed no stack either: ci/worker_traces.sh
    and a core dump tell those apart."""
    capture = config.pluginmanager.getplugin("capturemanager")
    with capture.global_and_fixture_disabled():
        stream = os.fdopen(os.dup(2), "w")
    config.stash[_SIGNAL_STACKS] = stream  # kept open for the process
    for each in (signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2, signal.SIGALRM):
        faulthandler.register(each, file=stream, all_threads=True, chain=True)


_SIGNAL_STACKS = pytest.StashKey[Any]()


def pytest_report_header(config: pytest.Config) -> list[str]:
    kafka = os.environ.get("KTS_KAFKA_BOOTSTRAP") or f"ours, {testing.default_kafka_version()}"
    s3 = os.environ.get("KTS_S3_ENDPOINT") or "ours (moto server)"
    return [f"test bed: kafka={kafka}; s3={s3}; cache={testing.cache_dir()}"]


@pytest.fixture(scope="session")
def kafka_broker(kts_kafka: Broker) -> Broker:
    """The session's broker: ours (KafkaBroker) or the one of ``KTS_KAFKA_BOOTSTRAP``."""
    return kts_kafka


@pytest.fixture(scope="session")
def kafka_bootstrap(kafka_broker: Broker) -> str:
    return kafka_broker.bootstrap


@pytest.fixture
def make_kafka_broker(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Callable[..., testing.KafkaBroker]]:
    """A factory of private brokers (started, stopped at the end of the test) for tests that
    kill or reconfigure a broker: ``make_kafka_broker(extra_config={...}, version=...)``."""
    brokers: list[testing.KafkaBroker] = []

    def make(
        version: str | None = None, extra_config: Mapping[str, object] | None = None
    ) -> testing.KafkaBroker:
        workdir = tmp_path_factory.mktemp("kafka_private")
        broker = testing.KafkaBroker(workdir, version=version, extra_config=extra_config)
        brokers.append(broker)
        broker.start()
        return broker

    yield make
    for broker in brokers:
        broker.stop()


B = TypeVar("B", bound=KafkaBroker)


def _started(broker: B, what: str) -> Iterator[B]:
    """`broker` started for the tests that use it, which it fails (never skips) when it cannot
    start, and stopped after them."""
    try:
        broker.start()
    except testing.TestbedError as exc:
        pytest.fail(f"the {what} did not start: {exc}", pytrace=False)
    yield broker
    broker.stop()


@pytest.fixture(scope="session")
def secured_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SecuredKafkaBroker]:
    """A secured broker (SASL_SSL, mutual TLS, the StandardAuthorizer) for the session's tests
    of least privilege."""
    secured = SecuredKafkaBroker(tmp_path_factory.mktemp("secured_kafka"))
    yield from _started(secured, "secured broker")


@pytest.fixture(scope="session")
def iam_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[IamKafkaBroker]:
    """A broker that checks MSK IAM tokens as MSK does, makes every session log in again every
    8 s and refuses a token signed more than 20 s before: a client lives only if it signs new
    tokens."""
    workdir = tmp_path_factory.mktemp("iam_kafka")
    broker = IamKafkaBroker(workdir, max_token_age_s=20, reauth_ms=8000)
    yield from _started(broker, "IAM broker")


@pytest.fixture(scope="session")
def s3_server(kts_s3: S3) -> S3:
    """The session's S3 server: ours (S3Server, can pause/resume) or ``KTS_S3_ENDPOINT``."""
    return kts_s3


@pytest.fixture(scope="session")
def s3_endpoint(s3_server: S3) -> str:
    return s3_server.endpoint


# Moto accepts any credentials; a recognisable secret lets tests check that it never leaks.
S3_TEST_SECRET = "testing-secret-Zq8xW"


@pytest.fixture
def s3_settings(s3_endpoint: str) -> S3Settings:
    return S3Settings(
        endpoint_url=s3_endpoint,
        region="us-east-1",
        access_key_id="testing",
        secret_access_key=S3_TEST_SECRET,
    )


@pytest.fixture
def s3_client(s3_endpoint: str) -> Any:
    return boto3.client(
        "s3",
        endpoint_url=s3_endpoint,
        region_name="us-east-1",
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
    )


@pytest.fixture
def s3_bucket(kts_s3_bucket: str) -> str:
    """A new, empty bucket on the test bed's S3 server."""
    return kts_s3_bucket


@pytest.fixture(scope="session")
def schema_registry(kts_schema_registry: testing.SchemaRegistry) -> testing.SchemaRegistry:
    """The session's Schema Registry (Apicurio Registry); ``.url`` is its ccompat v7 API."""
    return kts_schema_registry


@pytest.fixture(scope="session")
def spark_jars(kts_spark_jars: list[str]) -> list[str]:
    """Jar paths for ``spark.jars`` (``",".join(spark_jars)``): Kafka source/sink and Avro."""
    return kts_spark_jars


_counter = itertools.count()


@pytest.fixture
def unique(request: pytest.FixtureRequest) -> Callable[[str], str]:
    """``unique("topic")`` -> ``topic_<test name>_<n>_<random>``: letters, digits, underscores."""
    test_name = re.sub(r"[^A-Za-z0-9_]", "_", request.node.name)[:40]

    def make(prefix: str = "x") -> str:
        clean = re.sub(r"[^A-Za-z0-9_]", "_", prefix)
        return f"{clean}_{test_name}_{next(_counter)}_{uuid.uuid4().hex[:8]}"

    return make
