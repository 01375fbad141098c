"""Whole queries on a secured broker (SASL_SSL and mutual TLS, the StandardAuthorizer refusing
what no ACL allows), as a user with only docs/operations.md's ACLs: every input id is seen once by a
read_committed consumer, nothing stays open, and with every process logging at DEBUG no
secret appears in any output or file of the run.

The queries read JSON-lines files (the input's security is Spark's own Kafka source's) and
write with `format("kafka_txn")` over the secured listeners.
"""

from __future__ import annotations

import json
import subprocess
import uuid
from pathlib import Path

import pytest

from kafka_txn_sink import LOG_LEVEL_ENV
from kafka_txn_sink.kafka.admin_api import ONGOING
from kafka_txn_sink.kafka.txn_admin import TxnAdmin
from kafka_txn_sink.protocol.txn_ids import owns
from kafka_txn_sink.testing.secured_broker import KafkaUser, SecuredKafkaBroker
from kafka_txn_sink.testing.topics import compare_ids, read_topic
from tests.e2e.harness import Outcome, Pipeline, kill_group, make_events, write_input_files

pytestmark = [pytest.mark.kafka, pytest.mark.spark]

PASSWORD = "e2e-Scram-Secret-41"
ROWS = 600


@pytest.fixture
def broker(secured_broker: SecuredKafkaBroker) -> SecuredKafkaBroker:
    return secured_broker


def least_privileged(broker: SecuredKafkaBroker, user: KafkaUser, sink_id: str, topic: str) -> None:
    """docs/operations.md's ACLs for one sink, and nothing else."""
    broker.allow(user.principal, "TRANSACTIONAL_ID", f"{sink_id}-", ["WRITE"], prefixed=True)
    broker.allow(user.principal, "TOPIC", topic, ["WRITE", "READ"])
    broker.allow(user.principal, "BROKER", "kafka-cluster", ["DESCRIBE_CONFIGS"])


def secured_pipeline(
    broker: SecuredKafkaBroker, user: KafkaUser, tmp_path: Path, settings: dict[str, str]
) -> tuple[Pipeline, list[str]]:
    """A sink of `user` with docs/operations.md's ACLs, kafka.* options `settings`, its input."""
    name = uuid.uuid4().hex[:8]
    pipeline = Pipeline(
        bootstrap=settings.pop("bootstrap.servers"), jars="", workdir=tmp_path,
        sink_id=f"sec_{name}", input="", output=f"sec_out_{name}", partitions=2,
        input_dir=tmp_path / "input",
    )  # fmt: skip
    pipeline.options.update({f"kafka.{k}": v for k, v in settings.items()})
    broker.create_topic(pipeline.output, partitions=2)
    least_privileged(broker, user, pipeline.sink_id, pipeline.output)
    ids = write_input_files(tmp_path / "input", make_events(ROWS), files=3)
    return pipeline, ids


def librdkafka_settings(broker: SecuredKafkaBroker, user: KafkaUser) -> dict[str, str]:
    return {k: str(v) for k, v in broker.client_settings(user).items()}


def assert_exactly_once(broker: SecuredKafkaBroker, pipeline: Pipeline, ids: list[str]) -> None:
    admin = {k: str(v) for k, v in broker.setup_settings().items()}
    seen = read_topic(broker.bootstrap, pipeline.output, "read_committed", kafka=admin)
    report = compare_ids(ids, [(r.key or b"").decode() for r in seen])
    assert report.exact, report.summary()
    with TxnAdmin(broker.bootstrap, admin) as txn_admin:
        open_ids = [i for i in txn_admin.list_ids([ONGOING]) if owns(pipeline.sink_id, i)]
    assert open_ids == []


# CI: test_msk_iam kills a driver on a secured broker and looks for its secrets everywhere;
# tests/integration/test_secured_broker.py commits as a SCRAM user with ACLs.
@pytest.mark.full
@pytest.mark.parametrize("kind", ["scram", pytest.param("mtls", marks=pytest.mark.full)])
def test_a_least_privileged_user_survives_a_driver_kill_and_logs_no_secret(
    broker: SecuredKafkaBroker, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kind: str
) -> None:
    name = f"{kind}-{uuid.uuid4().hex[:6]}"
    user = broker.add_scram_user(name, PASSWORD) if kind == "scram" else broker.add_tls_user(name)
    pipeline, ids = secured_pipeline(broker, user, tmp_path, librdkafka_settings(broker, user))
    killed = pipeline.start("driver.after_decision=block@1")
    pipeline.wait_reached("driver.after_decision", killed)
    kill_group(killed)
    first_out, first_err = killed.communicate(timeout=60)
    # The restart rolls the decided batch forward (the driver's EndTxn client) and runs the
    # rest, every Python worker logging at DEBUG. (Not the first run: the harness reads its
    # output only at the end, and DEBUG would fill the pipe while it waits at the failpoint.)
    monkeypatch.setenv(LOG_LEVEL_ENV, "DEBUG")
    outcome = pipeline.run()

    assert outcome.returncode == 0, outcome.error
    assert_exactly_once(broker, pipeline, ids)
    output = first_out + first_err + outcome_text(outcome)
    assert "kafka.admin.client DEBUG Starting KafkaAdminClient" in output  # DEBUG was on
    assert_no_secret([PASSWORD], output, tmp_path)


@pytest.mark.full  # CI: tests/unit/test_kafka_security.py and the least-privileged kill
def test_only_spark_jaas_line_gives_the_credentials(
    broker: SecuredKafkaBroker, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    user = broker.add_scram_user(f"jaas-{uuid.uuid4().hex[:6]}", PASSWORD)
    java = broker.java_settings(user)
    settings = {
        "bootstrap.servers": java["bootstrap.servers"],
        "security.protocol": "SASL_SSL",
        "sasl.mechanism": java["sasl.mechanism"],
        "sasl.jaas.config": java["sasl.jaas.config"],  # as a format("kafka") job has it
        "ssl.ca.location": str(broker.ca_path),
    }
    pipeline, ids = secured_pipeline(broker, user, tmp_path, settings)
    monkeypatch.setenv(LOG_LEVEL_ENV, "DEBUG")

    outcome = pipeline.run()

    assert outcome.returncode == 0, outcome.error
    assert_exactly_once(broker, pipeline, ids)
    output = outcome_text(outcome)
    assert "kafka.admin.client DEBUG Starting KafkaAdminClient" in output  # DEBUG was on
    assert_no_secret([PASSWORD, java["sasl.jaas.config"]], output, tmp_path)


def outcome_text(outcome: Outcome) -> str:
    return json.dumps(outcome.result) + outcome.stderr


def assert_no_secret(secrets: list[str], output: str, workdir: Path) -> None:
    """No secret in the processes' output, nor in any file of the run (the checkpoint, the
    commit log, Spark's state and metadata)."""
    for secret in secrets:
        assert secret not in output, "a secret reached the output"
        found = subprocess.run(
            ["grep", "-rlaF", secret, str(workdir)], capture_output=True, text=True, check=False
        )
        assert found.stdout == "", f"a secret reached {found.stdout.split()}"
