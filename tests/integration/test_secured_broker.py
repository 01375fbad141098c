"""The secured test bed: SASL_SSL (SCRAM-SHA-512, PLAIN) and mutual TLS behind the
StandardAuthorizer, as producers, consumers and kafka-python's admin client meet them."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import (
    OFFSET_BEGINNING,
    Consumer,
    KafkaError,
    KafkaException,
    Producer,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient
from kafka.admin import KafkaAdminClient
from kafka.errors import KafkaError as KafkaPythonError

from kafka_txn_sink import testing
from kafka_txn_sink.testing.secured_broker import PLAIN, KafkaUser, SecuredKafkaBroker

pytestmark = pytest.mark.kafka

PARTITIONS = 2
TIMEOUT = 30.0
# PLAIN users live in the broker's settings: this one is added before the start.
PLAIN_USER = KafkaUser("plain-user", PLAIN, password="plain-pass")

Unique = Callable[[str], str]


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SecuredKafkaBroker]:
    """A secured broker of this module's own; it fails (never skips) without Java or Maven."""
    secured = SecuredKafkaBroker(tmp_path_factory.mktemp("secured_kafka"))
    secured.add_plain_user(PLAIN_USER.name, str(PLAIN_USER.password))
    started = time.monotonic()
    try:
        secured.start()
    except testing.TestbedError as exc:
        pytest.fail(f"the secured broker did not start: {exc}", pytrace=False)
    print(f"secured broker up in {time.monotonic() - started:.1f}s")
    yield secured
    secured.stop()


def _new_user(broker: SecuredKafkaBroker, kind: str, unique: Unique) -> KafkaUser:
    if kind == "scram":
        return broker.add_scram_user(unique("scram"), "scram-pass")
    if kind == "plain":
        return PLAIN_USER
    return broker.add_tls_user(unique("tls"))


def _grant_transactional_producer(broker: SecuredKafkaBroker, user: KafkaUser, topic: str,
                                  txn_prefix: str) -> None:
    # No IDEMPOTENT_WRITE on the cluster: since Kafka 3.0 WRITE on the transactional id is enough.
    broker.allow(user.principal, "TOPIC", topic, ["WRITE", "DESCRIBE"])
    broker.allow(user.principal, "TRANSACTIONAL_ID", txn_prefix, ["WRITE", "DESCRIBE"],
                 prefixed=True)


def _producer(broker: SecuredKafkaBroker, user: KafkaUser, txn_id: str,
              errors: list[KafkaError] | None = None) -> Producer:
    settings: dict[str, Any] = {
        **broker.client_settings(user),
        "transactional.id": txn_id,
        "transaction.timeout.ms": 30000,
        "log_level": 0,
    }
    if errors is not None:
        settings["error_cb"] = errors.append
    return Producer(settings)


def _produce_in_transaction(producer: Producer, topic: str, count: int,
                            failures: list[KafkaError]) -> None:
    """init/begin/produce/commit; delivery errors are added to ``failures``."""

    def on_delivery(err: KafkaError | None, _msg: object) -> None:
        if err is not None:
            failures.append(err)

    producer.init_transactions(TIMEOUT)
    producer.begin_transaction()
    for i in range(count):
        producer.produce(topic, value=f"v{i}".encode(), partition=i % PARTITIONS,
                         on_delivery=on_delivery)
    producer.commit_transaction(TIMEOUT)


def _read_committed(broker: SecuredKafkaBroker, user: KafkaUser, topic: str,
                    group: str) -> list[str]:
    consumer = Consumer({
        **broker.client_settings(user),
        "group.id": group,
        "isolation.level": "read_committed",
        "enable.auto.commit": False,
        "enable.partition.eof": True,
        "log_level": 0,
    })
    values: list[str] = []
    at_eof: set[int] = set()
    deadline = time.monotonic() + TIMEOUT
    try:
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(PARTITIONS)])
        while len(at_eof) < PARTITIONS and time.monotonic() < deadline:
            msg = consumer.poll(1.0)
            if msg is None:
                continue
            err = msg.error()
            if err is not None and err.code() == KafkaError._PARTITION_EOF:
                at_eof.add(msg.partition())
            elif err is not None:
                raise KafkaException(err)
            else:
                values.append(msg.value().decode())
    finally:
        consumer.close()
    assert len(at_eof) == PARTITIONS, f"no end of partitions within {TIMEOUT}s"
    return values


@pytest.mark.parametrize("kind", ["scram", "plain", "tls"])
def test_user_with_acls_commits_a_transaction_seen_by_read_committed(
    broker: SecuredKafkaBroker, unique: Unique, kind: str
) -> None:
    user = _new_user(broker, kind, unique)
    topic = broker.create_topic(unique("secured"), partitions=PARTITIONS)
    txn_prefix, group = unique("sink") + "_", unique("group")
    _grant_transactional_producer(broker, user, topic, txn_prefix)
    broker.allow(user.principal, "TOPIC", topic, ["READ"])
    broker.allow(user.principal, "GROUP", group, ["READ"])

    failures: list[KafkaError] = []
    _produce_in_transaction(_producer(broker, user, txn_prefix + "0"), topic, 10, failures)

    assert failures == []
    assert sorted(_read_committed(broker, user, topic, group)) == sorted(
        f"v{i}" for i in range(10))


def test_user_without_acls_is_refused_its_transactional_id(
    broker: SecuredKafkaBroker, unique: Unique
) -> None:
    user = broker.add_scram_user(unique("nobody"), "scram-pass")
    producer = _producer(broker, user, unique("sink"))

    with pytest.raises(KafkaException) as refused:
        producer.init_transactions(TIMEOUT)

    assert refused.value.args[0].code() == KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED


def test_user_without_topic_acl_is_refused_the_topic(
    broker: SecuredKafkaBroker, unique: Unique
) -> None:
    user = broker.add_tls_user(unique("no-topic"))
    topic = broker.create_topic(unique("secured"), partitions=PARTITIONS)
    txn_prefix = unique("sink") + "_"
    broker.allow(user.principal, "TRANSACTIONAL_ID", txn_prefix, ["WRITE", "DESCRIBE"],
                 prefixed=True)
    producer = _producer(broker, user, txn_prefix + "0")

    failures: list[KafkaError] = []
    with pytest.raises(KafkaException) as refused:
        _produce_in_transaction(producer, topic, 3, failures)

    codes = {refused.value.args[0].code(), *(f.code() for f in failures)}
    assert KafkaError.TOPIC_AUTHORIZATION_FAILED in codes, refused.value
    assert _read_committed(broker, broker.admin, topic, unique("group")) == []


def test_wrong_password_fails_authentication(
    broker: SecuredKafkaBroker, unique: Unique
) -> None:
    user = broker.add_scram_user(unique("scram"), "right-pass")
    errors: list[KafkaError] = []
    producer = _producer(broker, KafkaUser(user.name, user.mechanism, password="wrong-pass"),
                         unique("sink"), errors)

    with pytest.raises(KafkaException):
        producer.init_transactions(5)
    producer.poll(1.0)  # serves error_cb

    assert KafkaError._AUTHENTICATION in {e.code() for e in errors}


@pytest.mark.parametrize("kind", ["scram", "tls"])
def test_kafka_python_admin_client_connects_as_the_user(
    broker: SecuredKafkaBroker, unique: Unique, kind: str
) -> None:
    user = _new_user(broker, kind, unique)
    visible = broker.create_topic(unique("visible"), partitions=1)
    hidden = broker.create_topic(unique("hidden"), partitions=1)
    broker.allow(user.principal, "TOPIC", visible, ["DESCRIBE"])

    admin = KafkaAdminClient(**broker.kafka_python_settings(user), request_timeout_ms=15000)
    try:
        topics = set(admin.list_topics())
    finally:
        admin.close()

    # Only the principal's ACLs decide what it sees: it is authenticated as itself.
    assert visible in topics
    assert hidden not in topics


def test_kafka_python_wrong_password_fails_authentication(
    broker: SecuredKafkaBroker, unique: Unique
) -> None:
    user = broker.add_scram_user(unique("scram"), "right-pass")
    wrong = KafkaUser(user.name, user.mechanism, password="wrong-pass")
    bounded = {"bootstrap_timeout_ms": 5000, "request_timeout_ms": 5000}
    KafkaAdminClient(**broker.kafka_python_settings(user), **bounded).close()

    # kafka-python 3.0.12 only times out ("Unable to bootstrap"): it logs the broker's
    # SaslAuthenticationFailedError on some attempts, a bare disconnection on others.
    with pytest.raises(KafkaPythonError):
        KafkaAdminClient(**broker.kafka_python_settings(wrong), **bounded).close()


def test_mtls_listener_refuses_a_client_without_certificate(
    broker: SecuredKafkaBroker, unique: Unique
) -> None:
    user = broker.add_tls_user(unique("tls"))
    settings = {k: v for k, v in broker.client_settings(user).items()
                if k not in ("ssl.certificate.location", "ssl.key.location")}
    errors: list[KafkaError] = []
    admin = AdminClient({**settings, "error_cb": errors.append, "log_level": 0})

    with pytest.raises(KafkaException):
        admin.list_topics(timeout=5)
    admin.poll(1.0)  # serves error_cb

    assert any(e.code() == KafkaError._TRANSPORT and "bad certificate" in e.str() for e in errors)


# Kafka's Java AdminClient, as Spark's Kafka source would be configured: it prints the topics.
LIST_TOPICS_JAVA = """
import java.io.FileReader;
import java.util.Properties;
import java.util.concurrent.TimeUnit;
import org.apache.kafka.clients.admin.Admin;

public class ListTopics {
    public static void main(String[] args) throws Exception {
        Properties props = new Properties();
        try (FileReader reader = new FileReader(args[0])) { props.load(reader); }
        try (Admin admin = Admin.create(props)) {
            for (String name : admin.listTopics().names().get(30, TimeUnit.SECONDS)) {
                System.out.println(name);
            }
        }
    }
}
"""


@pytest.mark.parametrize("kind", ["scram", "plain", "tls"])
def test_java_client_connects_as_the_user(
    broker: SecuredKafkaBroker, unique: Unique, kind: str, tmp_path: Path
) -> None:
    user = _new_user(broker, kind, unique)
    visible = broker.create_topic(unique("visible"), partitions=1)
    hidden = broker.create_topic(unique("hidden"), partitions=1)
    broker.allow(user.principal, "TOPIC", visible, ["DESCRIBE"])
    source, props = tmp_path / "ListTopics.java", tmp_path / "client.properties"
    source.write_text(LIST_TOPICS_JAVA)
    props.write_text("".join(f"{k}={v}\n" for k, v in broker.java_settings(user).items()))

    java = testing.java_executable("the test runs Kafka's Java AdminClient")
    done = subprocess.run(
        [java, "-cp", f"{testing.kafka_jars(broker.version)}/*", str(source), str(props)],
        capture_output=True, text=True, timeout=90, check=False)

    assert done.returncode == 0, done.stderr[-3000:]
    topics = set(done.stdout.split())
    assert visible in topics
    assert hidden not in topics


# Last in the module: it restarts the shared broker.
def test_restart_keeps_users_and_acls_and_adds_a_plain_user(
    broker: SecuredKafkaBroker, unique: Unique
) -> None:
    scram = broker.add_scram_user(unique("scram"), "scram-pass")
    topic = broker.create_topic(unique("secured"), partitions=PARTITIONS)
    broker.allow(scram.principal, "TOPIC", topic, ["DESCRIBE"])

    plain = broker.add_plain_user(unique("plain"), "plain-pass")  # restarts the broker
    broker.allow(plain.principal, "TOPIC", topic, ["DESCRIBE"])

    for user in (scram, plain):
        admin = AdminClient({**broker.client_settings(user), "log_level": 0})
        assert topic in admin.list_topics(timeout=TIMEOUT).topics
