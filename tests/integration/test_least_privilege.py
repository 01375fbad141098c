"""Least privilege on a secured broker (SASL_SSL, StandardAuthorizer, no ACL means no access):
docs/operations.md's ACLs are enough for the sink's every step, and each one missing fails that step
with an error naming the permission, the resource and the principal, publishing nothing and
leaving nothing open; a wrong password says "authentication failed" and names the mechanism.

The sink's own parts run here as a query runs them (options, the driver's cluster client and
EndTxn client, a task's transaction), without Spark; tests/e2e/test_secured_sink.py runs whole
queries.
"""

from __future__ import annotations

import re
import time
import uuid
from dataclasses import dataclass

import pytest

from kafka_txn_sink.errors import (
    AuthenticationFailedError,
    KafkaTxnSinkError,
    PermissionDeniedError,
)
from kafka_txn_sink.kafka.admin_api import Fate
from kafka_txn_sink.kafka.cluster import Cluster
from kafka_txn_sink.kafka.producer import TaskTransaction
from kafka_txn_sink.kafka.txn_admin import TxnAdmin
from kafka_txn_sink.options import SinkOptions, parse_options
from kafka_txn_sink.protocol.start import resolve_against_cluster
from kafka_txn_sink.protocol.txn_ids import transactional_id
from kafka_txn_sink.testing.secured_broker import KafkaUser, SecuredKafkaBroker
from kafka_txn_sink.testing.topics import read_topic

pytestmark = pytest.mark.kafka

PASSWORD = "lp-Secret-9"
TIMEOUT_MS = 15_000
# docs/operations.md's ACLs for one sink, by permission: (resource type, name or prefix, operation).
SINK_ACLS = {
    "ids": ("TRANSACTIONAL_ID", "{sink}-", "WRITE"),
    "topic write": ("TOPIC", "{topic}", "WRITE"),
    "topic read": ("TOPIC", "{topic}", "READ"),
    "cluster": ("BROKER", "kafka-cluster", "DESCRIBE_CONFIGS"),
}


@pytest.fixture
def broker(secured_broker: SecuredKafkaBroker) -> SecuredKafkaBroker:
    return secured_broker


@dataclass
class Sink:
    """One sink's user, topic and ids on the secured broker."""

    broker: SecuredKafkaBroker
    user: KafkaUser
    sink_id: str
    topic: str

    def kafka(self, password: str | None = None) -> dict[str, str]:
        settings = {k: str(v) for k, v in self.broker.client_settings(self.user).items()}
        settings.pop("bootstrap.servers")
        if password is not None:
            settings["sasl.password"] = password
        return settings

    def options(self, **extra: str) -> SinkOptions:
        raw = {f"kafka.{k}": v for k, v in self.kafka().items()}
        return parse_options({
            "kafka.bootstrap.servers": self.broker.bootstrap, "topic": self.topic,
            "sinkId": self.sink_id, "commitLog": "/tmp/unused", **raw, **extra,
        })  # fmt: skip

    def cluster(self, password: str | None = None) -> Cluster:
        return Cluster(self.broker.bootstrap, self.kafka(password), TIMEOUT_MS)

    def txn_admin(self) -> TxnAdmin:
        return TxnAdmin(self.broker.bootstrap, self.kafka(), TIMEOUT_MS)

    def transaction(self, partition: int = 0) -> TaskTransaction:
        options = self.options(transactionTimeoutMs="60000")
        return TaskTransaction(
            options.producer_config(transactional_id(self.sink_id, partition, slot=0)), 30.0
        )

    def admin(self) -> dict[str, str]:
        """The super user's settings, to look at what the sink's user cannot."""
        return {k: str(v) for k, v in self.broker.setup_settings().items()}

    def committed(self) -> list[str]:
        seen = read_topic(self.broker.bootstrap, self.topic, kafka=self.admin(), timeout_s=30)
        return [record.value.decode() for record in seen if record.value is not None]

    def open_ids(self) -> list[str]:
        with TxnAdmin(self.broker.bootstrap, self.admin(), TIMEOUT_MS) as txn_admin:
            states = txn_admin.describe([transactional_id(self.sink_id, 0, slot=0)])
        return [i for i, s in states.items() if s.state == "Ongoing"]


def new_sink(broker: SecuredKafkaBroker, *, without: str | None = None) -> Sink:
    """A SCRAM user with docs/operations.md's ACLs for a new sink and topic, less `without`."""
    name = uuid.uuid4().hex[:8]
    sink = Sink(broker, broker.add_scram_user(f"lp-{name}", PASSWORD), f"lp_{name}", f"lp_{name}")
    broker.create_topic(sink.topic, partitions=1)
    for key, (resource, pattern, operation) in SINK_ACLS.items():
        if key != without:
            resource_name = pattern.format(sink=sink.sink_id, topic=sink.topic)
            broker.allow(sink.user.principal, resource, resource_name, [operation],
                         prefixed=key == "ids")  # fmt: skip
    return sink


def assert_names(error: BaseException, operation: str, resource: str, sink: Sink) -> None:
    message = str(error)
    assert f"Kafka refused {operation} on {resource} to User:{sink.user.name}" in message, message
    assert "kafka-acls.sh" in message and "--add --allow-principal" in message, message
    assert PASSWORD not in message


def test_the_readme_acls_are_enough_for_every_step(broker: SecuredKafkaBroker) -> None:
    sink = new_sink(broker)
    options = resolve_against_cluster(sink.options(), sink.cluster())  # DescribeConfigs, topic
    assert options.transaction_timeout_ms is not None

    transaction = sink.transaction()
    transaction.init()
    transaction.send(sink.topic, b"row-1", b"k")
    prepared = transaction.prepare()
    assert prepared is not None
    transaction.detach()
    with sink.txn_admin() as txn_admin:
        assert (
            txn_admin.describe([prepared.triple.transactional_id])[
                prepared.triple.transactional_id
            ].state
            == "Ongoing"
        )
        [result] = txn_admin.end_transactions([prepared.triple], commit=True, deadline_s=30)
        assert result.ok, result.error
    assert sink.cluster().fate(prepared.offsets).fate is Fate.COMMITTED  # the fate probe

    assert sink.committed() == ["row-1"]
    assert sink.open_ids() == []


def test_without_describe_configs_the_start_says_so_unless_the_timeout_is_given(
    broker: SecuredKafkaBroker,
) -> None:
    sink = new_sink(broker, without="cluster")

    with pytest.raises(PermissionDeniedError) as caught:
        resolve_against_cluster(sink.options(), sink.cluster())

    assert_names(caught.value, "DescribeConfigs", "the cluster", sink)
    assert "Or set option transactionTimeoutMs" in str(caught.value)
    # Above the commit margin of the default options (about 5.6 min): the start refuses less.
    given = resolve_against_cluster(sink.options(transactionTimeoutMs="600000"), sink.cluster())
    assert given.transaction_timeout_ms == 600_000


def test_without_write_on_the_ids_the_task_fails_naming_the_prefix(
    broker: SecuredKafkaBroker,
) -> None:
    sink = new_sink(broker, without="ids")
    transaction = sink.transaction()

    with pytest.raises(PermissionDeniedError) as caught:
        transaction.init()

    assert_names(caught.value, "Write", f"transactional-id prefix '{sink.sink_id}-'", sink)
    assert "--resource-pattern-type prefixed" in str(caught.value)


def test_without_write_on_the_topic_the_start_says_so(broker: SecuredKafkaBroker) -> None:
    sink = new_sink(broker, without="topic write")

    with pytest.raises(PermissionDeniedError) as caught:
        resolve_against_cluster(sink.options(), sink.cluster())

    assert_names(caught.value, "Write", f"topic '{sink.topic}'", sink)


def test_without_read_on_the_topic_the_start_says_so(broker: SecuredKafkaBroker) -> None:
    sink = new_sink(broker, without="topic read")

    with pytest.raises(PermissionDeniedError) as caught:
        resolve_against_cluster(sink.options(), sink.cluster())

    assert_names(caught.value, "Read", f"topic '{sink.topic}'", sink)


def test_a_task_refused_the_topic_publishes_nothing_and_leaves_nothing_open(
    broker: SecuredKafkaBroker,
) -> None:
    """A topic the start did not check (e.g. named by a row's topic column)."""
    sink = new_sink(broker, without="topic write")
    transaction = sink.transaction()
    transaction.init()

    with pytest.raises(KafkaTxnSinkError, match="nothing of this batch is published") as caught:
        transaction.send(sink.topic, b"row-1", b"k")
        transaction.prepare()

    assert "TOPIC_AUTHORIZATION_FAILED" in str(caught.value)
    assert sink.committed() == []
    deadline = time.monotonic() + 30
    while sink.open_ids() and time.monotonic() < deadline:  # the abort completes
        time.sleep(0.5)
    assert sink.open_ids() == []


def test_without_any_topic_acl_the_start_names_the_topic_not_a_missing_one(
    broker: SecuredKafkaBroker,
) -> None:
    sink = new_sink(broker, without="topic write")
    broker.create_topic(other := f"{sink.topic}_x", partitions=1)
    sink.topic = other  # no ACL at all on this one

    with pytest.raises(PermissionDeniedError) as caught:
        resolve_against_cluster(sink.options(), sink.cluster())

    assert_names(caught.value, "Write", f"topic '{other}'", sink)
    assert "does not exist" not in str(caught.value)


def test_without_read_on_the_topic_the_fate_probe_says_so(broker: SecuredKafkaBroker) -> None:
    sink = new_sink(broker, without="topic read")
    transaction = sink.transaction()
    transaction.init()
    transaction.send(sink.topic, b"row-1", b"k")
    prepared = transaction.prepare()
    assert prepared is not None
    transaction.abort()

    with pytest.raises(PermissionDeniedError) as caught:
        sink.cluster().fate(prepared.offsets)

    assert_names(caught.value, "Read", f"topic '{sink.topic}'", sink)


def test_a_driver_without_write_on_the_ids_is_told_at_end_txn(broker: SecuredKafkaBroker) -> None:
    sink = new_sink(broker)
    transaction = sink.transaction()
    transaction.init()
    transaction.send(sink.topic, b"row-1", b"k")
    prepared = transaction.prepare()
    assert prepared is not None
    # The driver runs as another user, who may describe the ids but not write them.
    driver = new_sink(broker, without="ids")
    broker.allow(driver.user.principal, "TRANSACTIONAL_ID", f"{sink.sink_id}-", ["DESCRIBE"],
                 prefixed=True)  # fmt: skip

    try:
        with driver.txn_admin() as txn_admin, pytest.raises(PermissionDeniedError) as caught:
            txn_admin.end_transactions([prepared.triple], commit=True, deadline_s=20)
    finally:
        transaction.abort()

    assert_names(caught.value, "Write", f"transactional-id prefix '{sink.sink_id}-'", driver)
    assert sink.committed() == []


def test_a_wrong_password_says_authentication_failed_and_names_the_mechanism(
    broker: SecuredKafkaBroker,
) -> None:
    sink = new_sink(broker)

    with pytest.raises(AuthenticationFailedError) as caught:
        sink.cluster(password="not-the-password").topic_exists(sink.topic)

    message = str(caught.value)
    assert re.search(rf"authentication failed \(SASL SCRAM-SHA-512 as User:{sink.user.name}",
                     message), message  # fmt: skip
    assert "not-the-password" not in message and PASSWORD not in message


def test_create_topics_without_create_on_the_topic_says_so(broker: SecuredKafkaBroker) -> None:
    """Option createTopics: the driver creates a missing topic at the start, which needs Create
    on it; without it the start names that permission, and nothing is created."""
    sink = new_sink(broker)
    missing = f"{sink.topic}_new"
    # The README's ACLs on the topic to be (Write and Read imply Describe), not Create.
    broker.allow(sink.user.principal, "TOPIC", missing, ["WRITE", "READ"])
    options = sink.options(createTopics="true", topic=missing)

    with pytest.raises(PermissionDeniedError) as caught:
        resolve_against_cluster(options, sink.cluster())

    assert_names(caught.value, "Create", f"topic '{missing}'", sink)
    assert sink.cluster().topic_partitions(missing) is None
