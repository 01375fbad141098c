"""Option consumerGroup on a secured broker (SASL_SSL, StandardAuthorizer): docs/operations.md's
ACLs for the group (Read on the group and on each input topic) are enough to commit a batch's
offsets in the progress transaction and to read them back; each one missing fails that step with
an error naming the permission, publishing nothing and leaving the progress transaction aborted.
The steps run as the driver runs them, without Spark (tests/e2e/test_consumer_group.py runs
whole queries on a plain listener)."""

from __future__ import annotations

import time
import uuid

import pytest

from kafka_txn_sink.errors import PermissionDeniedError
from kafka_txn_sink.kafka.admin_api import Fate
from kafka_txn_sink.kafka.cluster import Cluster
from kafka_txn_sink.kafka.txn_admin import TxnAdmin
from kafka_txn_sink.protocol.messages import GroupProgress
from kafka_txn_sink.protocol.progress_txn import open_progress
from kafka_txn_sink.protocol.runs import RunRef
from kafka_txn_sink.protocol.txn_ids import progress_id
from kafka_txn_sink.testing.secured_broker import SecuredKafkaBroker
from tests.integration.test_least_privilege import (
    PASSWORD,
    SINK_ACLS,
    TIMEOUT_MS,
    Sink,
    assert_names,
)

pytestmark = pytest.mark.kafka

GROUP_ACLS = {
    "group read": ("GROUP", "{group}", "READ"),
    "input read": ("TOPIC", "{input}", "READ"),
}


@pytest.fixture
def broker(secured_broker: SecuredKafkaBroker) -> SecuredKafkaBroker:
    return secured_broker


def group_sink(broker: SecuredKafkaBroker, without: str | None = None) -> tuple[Sink, str, str]:
    """A SCRAM user with the sink's and the group's ACLs, less `without`; its group and input."""
    name = uuid.uuid4().hex[:8]
    sink = Sink(broker, broker.add_scram_user(f"g-{name}", PASSWORD), f"g_{name}", f"g_out_{name}")
    group, source = f"g_group_{name}", f"g_in_{name}"
    broker.create_topic(sink.topic, partitions=1)
    broker.create_topic(source, partitions=2)
    for key, (resource, pattern, operation) in {**SINK_ACLS, **GROUP_ACLS}.items():
        if key != without:
            resource_name = pattern.format(
                sink=sink.sink_id, topic=sink.topic, group=group, input=source
            )
            broker.allow(sink.user.principal, resource, resource_name, [operation],
                         prefixed=key == "ids")  # fmt: skip
    return sink, group, source


def open_ids(sink: Sink) -> list[str]:
    with TxnAdmin(sink.broker.bootstrap, sink.admin(), TIMEOUT_MS) as txn_admin:
        states = txn_admin.describe([progress_id(sink.sink_id, slot=0)])
    return [i for i, s in states.items() if s.state == "Ongoing"]


def test_the_group_acls_are_enough_to_commit_and_read_the_offsets(
    broker: SecuredKafkaBroker,
) -> None:
    sink, group, source = group_sink(broker)
    options = sink.options(transactionTimeoutMs="60000")
    progress = GroupProgress(group, {source: {0: 7, 1: 3}})

    participant = open_progress(options, RunRef(0, 0), progress)
    assert sink.cluster().group_members(group) == 0
    assert sink.cluster().progress_fate(progress).fate is Fate.OPEN  # pending in the transaction
    with sink.txn_admin() as txn_admin:
        [result] = txn_admin.end_transactions([participant.triple], commit=True, deadline_s=30)
    assert result.ok, result.error

    # EndTxn answers once the commit is prepared; the offsets are stable once its markers are out.
    deadline = time.monotonic() + 30
    while (fate := sink.cluster().progress_fate(progress).fate) is Fate.OPEN:
        assert time.monotonic() < deadline, "the group's offsets stayed pending for 30 s"
        time.sleep(0.1)
    assert fate is Fate.COMMITTED
    admin = Cluster(broker.bootstrap, sink.admin(), TIMEOUT_MS)
    assert admin.committed_offsets(group) == {source: {0: 7, 1: 3}}
    assert open_ids(sink) == []


@pytest.mark.parametrize(
    ("without", "operation", "resource"),
    [("group read", "Read", "group '{group}'"), ("input read", "Read", "topic '{input}'")],
)
def test_a_missing_group_acl_is_named_and_nothing_is_committed(
    broker: SecuredKafkaBroker, without: str, operation: str, resource: str
) -> None:
    sink, group, source = group_sink(broker, without=without)
    options = sink.options(transactionTimeoutMs="60000")

    with pytest.raises(PermissionDeniedError) as caught:
        open_progress(options, RunRef(0, 0), GroupProgress(group, {source: {0: 7}}))

    assert_names(caught.value, operation, resource.format(group=group, input=source), sink)
    assert open_ids(sink) == []
    admin = Cluster(broker.bootstrap, sink.admin(), TIMEOUT_MS)
    assert admin.committed_offsets(group) == {}


def test_without_the_group_acl_the_start_names_describe_on_the_group(
    broker: SecuredKafkaBroker,
) -> None:
    sink, group, _ = group_sink(broker, without="group read")

    with pytest.raises(PermissionDeniedError) as caught:
        sink.cluster().group_members(group)

    assert_names(caught.value, "Describe", f"group '{group}'", sink)
