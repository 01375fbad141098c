"""Option consumerGroup with the group on the input's own cluster (`consumerGroup.kafka.*`): the
driver commits a batch's end offsets after its rows, in a transaction of the sink's own id
`{sinkId}-group` there. Here that cluster is the secured broker (SASL_SSL, StandardAuthorizer)
with docs/operations.md's ACLs for it, and the output the plain one; the steps run as the driver
runs them, without Spark (tests/e2e/test_consumer_group.py runs a whole query with a kill).

What a user relies on: the group never moves back (an older driver replaying an earlier batch
commits nothing behind it, the model's `plain` counterexample), a commit fenced by another
driver's changes nothing, a missing ACL is named, and no secret of the group's cluster shows.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest

from kafka_txn_sink.errors import ConfigError, KafkaTxnSinkError, PermissionDeniedError
from kafka_txn_sink.kafka.cluster import Cluster
from kafka_txn_sink.kafka.producer_settings import producer_config
from kafka_txn_sink.kafka.txn_admin import TxnAdmin
from kafka_txn_sink.options import SinkOptions, parse_options
from kafka_txn_sink.protocol.messages import GroupProgress
from kafka_txn_sink.protocol.progress import check_progress_start
from kafka_txn_sink.protocol.progress_across import GROUP_TXN_TIMEOUT_MS, commit_across
from kafka_txn_sink.protocol.progress_txn import ProgressTransaction, group_metadata
from kafka_txn_sink.protocol.txn_ids import group_id
from kafka_txn_sink.testing.secured_broker import SecuredKafkaBroker
from tests.integration.test_least_privilege import PASSWORD, TIMEOUT_MS

pytestmark = pytest.mark.kafka

META = '{"batchWatermarkMs":0,"batchTimestampMs":0,"conf":{}}'
# What the sink's user needs on the group's cluster (docs/operations.md).
ACROSS_ACLS = {
    "group id": ("TRANSACTIONAL_ID", "{sink}-group", "WRITE"),
    "group read": ("GROUP", "{group}", "READ"),
    "input read": ("TOPIC", "{input}", "READ"),
}


class Across:
    """A sink whose output is the plain broker and whose group lives on the secured one."""

    def __init__(self, secured: SecuredKafkaBroker, output: str, workdir: Path, without: str = ""):
        name = uuid.uuid4().hex[:8]
        self.secured, self.output, self.workdir = secured, output, workdir
        self.sink_id, self.group, self.input = f"x_{name}", f"x_group_{name}", f"x_in_{name}"
        self.user = secured.add_scram_user(f"x-{name}", PASSWORD)
        secured.create_topic(self.input, partitions=2)
        for key, (resource, pattern, operation) in ACROSS_ACLS.items():
            if key != without:
                resource_name = pattern.format(sink=self.sink_id, group=self.group,
                                               input=self.input)  # fmt: skip
                secured.allow(self.user.principal, resource, resource_name, [operation])

    def kafka(self) -> dict[str, str]:
        settings = {k: str(v) for k, v in self.secured.client_settings(self.user).items()}
        settings.pop("bootstrap.servers")
        return settings

    def batches(self, *ends: dict[int, int]) -> None:
        """Spark's offset log: batch i read the input up to `ends[i]`."""
        offsets = self.workdir / "checkpoint" / "offsets"
        offsets.mkdir(parents=True, exist_ok=True)
        for batch, end in enumerate(ends):
            line = json.dumps({self.input: {str(p): o for p, o in end.items()}})
            (offsets / str(batch)).write_text(f"v1\n{META}\n{line}")

    def options(self) -> SinkOptions:
        group_kafka = {f"consumerGroup.kafka.{k}": v for k, v in self.kafka().items()}
        return parse_options({
            "kafka.bootstrap.servers": self.output, "topic": "unused", "sinkId": self.sink_id,
            "commitLog": str(self.workdir / "log"),
            "checkpointLocation": str(self.workdir / "checkpoint"),
            "consumerGroup": self.group,
            "consumerGroup.kafka.bootstrap.servers": self.secured.bootstrap, **group_kafka,
        })  # fmt: skip

    def admin(self) -> dict[str, str]:
        return {k: str(v) for k, v in self.secured.setup_settings().items()}

    def held(self) -> dict[str, dict[int, int]]:
        """The group's offsets of the input's partitions once none is pending: named
        partitions, since asking for all skips a pending first commit (and answers {})."""
        cluster = Cluster(self.secured.bootstrap, self.admin(), TIMEOUT_MS)
        return cluster.settled_offsets(self.group, {self.input: {0: 0, 1: 0}})

    def open_ids(self) -> list[str]:
        with TxnAdmin(self.secured.bootstrap, self.admin(), TIMEOUT_MS) as txn_admin:
            states = txn_admin.describe([group_id(self.sink_id)])
        return [i for i, s in states.items() if s.state == "Ongoing"]


@pytest.fixture
def across(secured_broker: SecuredKafkaBroker, kafka_bootstrap: str, tmp_path: Path) -> Across:
    return Across(secured_broker, kafka_bootstrap, tmp_path)


def test_the_group_moves_forward_only_never_back(across: Across) -> None:
    across.batches({0: 5, 1: 3}, {0: 9, 1: 7}, {0: 12, 1: 7})
    options = across.options()

    assert commit_across(options, 1) == {across.input: {0: 9, 1: 7}}
    assert across.held() == {across.input: {0: 9, 1: 7}}
    # An older driver replaying batch 0 after batch 1's commit: nothing behind the group.
    assert commit_across(options, 0) == {}
    assert across.held() == {across.input: {0: 9, 1: 7}}
    # Batch 2 moved partition 0 only: only it is committed.
    assert commit_across(options, 2) == {across.input: {0: 12}}
    assert across.held() == {across.input: {0: 12, 1: 7}}
    assert across.open_ids() == []


def test_a_commit_fenced_by_another_driver_fails_and_changes_nothing(across: Across) -> None:
    """Driver A is between its TxnOffsetCommit and its EndTxn for batch 2 when driver B commits
    batch 1: B's InitProducerId aborts A's transaction, and A's EndTxn is refused."""
    across.batches({0: 5, 1: 3}, {0: 9, 1: 7}, {0: 12, 1: 9})
    options = across.options()
    config = producer_config(
        across.secured.bootstrap, across.kafka(), group_id(across.sink_id), GROUP_TXN_TIMEOUT_MS
    )
    driver_a = ProgressTransaction(config, 30.0)
    driver_a.init()
    metadata = group_metadata(across.secured.bootstrap, across.kafka(), TIMEOUT_MS, across.group)
    driver_a.send_offsets(GroupProgress(across.group, {across.input: {0: 12, 1: 9}}), metadata)

    assert commit_across(options, 1) == {across.input: {0: 9, 1: 7}}
    with pytest.raises(KafkaTxnSinkError) as fenced:
        driver_a.commit()
    assert f"EndTxn(commit) of {group_id(across.sink_id)} failed" in str(fenced.value)

    assert across.held() == {across.input: {0: 9, 1: 7}}
    assert commit_across(options, 2) == {across.input: {0: 12, 1: 9}}  # the next batch's commit
    assert across.open_ids() == []


@pytest.mark.parametrize(
    ("without", "operation", "resource"),
    [
        ("group id", "Write", "transactional-id prefix '{sink}-'"),  # covers {sink}-group
        ("group read", "Read", "group '{group}'"),
        ("input read", "Read", "topic '{input}'"),
    ],
)
def test_a_missing_acl_on_the_groups_cluster_is_named_and_nothing_is_committed(
    secured_broker: SecuredKafkaBroker, kafka_bootstrap: str, tmp_path: Path,
    without: str, operation: str, resource: str,
) -> None:  # fmt: skip
    across = Across(secured_broker, kafka_bootstrap, tmp_path, without=without)
    across.batches({0: 5, 1: 3})

    with pytest.raises(PermissionDeniedError) as caught:
        commit_across(across.options(), 0)

    named = resource.format(sink=across.sink_id, group=across.group, input=across.input)
    assert operation in str(caught.value) and named in str(caught.value), caught.value
    assert PASSWORD not in str(caught.value) and PASSWORD not in repr(caught.value)
    assert across.held() == {}
    assert across.open_ids() == []


def test_the_start_checks_the_input_on_the_groups_cluster(across: Across) -> None:
    """The start reads the input's ends on the group's cluster: an input there passes, a query
    that read further than its end (another cluster's topic of that name) is refused."""
    options = across.options()
    output = Cluster(across.output, {}, TIMEOUT_MS)
    across.batches({0: 0, 1: 0})
    check_progress_start(options, output)  # the input is not on the output cluster: no matter

    across.batches({0: 5, 1: 3})
    with pytest.raises(ConfigError, match=f"input topic {across.input} is not on the group's"):
        check_progress_start(options, output)


def test_the_groups_cluster_settings_need_its_bootstrap_and_show_no_secret(
    across: Across,
) -> None:
    raw = {
        "kafka.bootstrap.servers": across.output, "topic": "t", "sinkId": "s",
        "commitLog": "/tmp/unused", "checkpointLocation": "/tmp/unused", "consumerGroup": "g",
        "consumerGroup.kafka.sasl.password": PASSWORD,
    }  # fmt: skip
    with pytest.raises(ConfigError, match=r"consumergroup\.kafka\.bootstrap\.servers") as caught:
        parse_options(raw)
    assert PASSWORD not in str(caught.value)

    options = across.options()
    assert options.progress is not None and options.progress.elsewhere
    assert PASSWORD not in repr(options) and PASSWORD not in repr(options.progress)
