"""Whole queries on MSK IAM, against the test bed's broker that checks every token as MSK does
(the SigV4 signature against the test's keys, the region, the action, the token's age), with
credentials from botocore's chain (the environment): records with AWS's JAAS line and handler as
a `format("kafka")` job on MSK has them, the driver killed after a decision; files mode; both
with sessions re-authenticated every 8 s and tokens refused 20 s after signing, so a query lives
only if every client signs new ones; and the two ways it fails before writing: no credentials,
a permission the policy lacks.

The queries read JSON-lines files (the input's security is Spark's own Kafka source's).
"""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from kafka_txn_sink import LOG_LEVEL_ENV
from kafka_txn_sink.files.references import parse_reference
from kafka_txn_sink.kafka import msk_iam_tokens
from kafka_txn_sink.testing import IamKafkaBroker, KafkaUser
from kafka_txn_sink.testing.topics import compare_ids, read_topic
from tests.e2e.harness import Pipeline, kill_group, make_events, write_input_files
from tests.e2e.test_files_mode import SELECT, read_avro
from tests.e2e.test_secured_sink import (
    assert_exactly_once,
    assert_no_secret,
    least_privileged,
    outcome_text,
)

pytestmark = [pytest.mark.kafka, pytest.mark.spark, pytest.mark.msk_iam]

SECRET = "wJalrXUtnFEMI/K7MDENG+bPxRfiCYSPARKKEY01"
SESSION = "IQoJb3JpZ2luX2VjEH/e2e+session/token=="
ROWS = 600
FILES = 6  # batches: the query outlives several re-authentications
TOKEN_SHAPE = "aHR0cHM6Ly9rYWZrYS"  # base64url of "https://kafka.": every MSK IAM token


@pytest.fixture
def broker(iam_broker: IamKafkaBroker) -> IamKafkaBroker:
    return iam_broker


@pytest.fixture
def user(broker: IamKafkaBroker, monkeypatch: pytest.MonkeyPatch) -> KafkaUser:
    """A new key with a session token, listed by the broker, in the environment Spark's
    processes inherit; the clients are told a token lives 10 s."""
    akid = f"ASIA{uuid.uuid4().hex[:16].upper()}"
    for name, value in {
        "AWS_ACCESS_KEY_ID": akid,
        "AWS_SECRET_ACCESS_KEY": SECRET,
        "AWS_SESSION_TOKEN": SESSION,
        "AWS_EC2_METADATA_DISABLED": "true",
        "AWS_CONFIG_FILE": "/nonexistent",
        "AWS_SHARED_CREDENTIALS_FILE": "/nonexistent",
        msk_iam_tokens.LIFETIME_ENV: "10",
    }.items():
        monkeypatch.setenv(name, value)
    return broker.add_iam_user(akid, SECRET, f"sink-{akid[-6:].lower()}")


def iam_pipeline(
    broker: IamKafkaBroker, user: KafkaUser, tmp_path: Path
) -> tuple[Pipeline, list[str]]:
    """A sink of `user` with the policy docs/operations.md gives, MSK IAM's options, its input."""
    name = uuid.uuid4().hex[:8]
    options = broker.iam_options(user)
    pipeline = Pipeline(
        bootstrap=options.pop("kafka.bootstrap.servers"), jars="", workdir=tmp_path,
        sink_id=f"iam_{name}", input="", output=f"iam_out_{name}", partitions=2,
        input_dir=tmp_path / "input",
    )  # fmt: skip
    pipeline.options.update(options)
    broker.create_topic(pipeline.output, partitions=2)
    least_privileged(broker, user, pipeline.sink_id, pipeline.output)
    ids = write_input_files(tmp_path / "input", make_events(ROWS), files=FILES)
    return pipeline, ids


def test_records_through_a_driver_kill_with_tokens_refreshed_and_no_secret_anywhere(
    broker: IamKafkaBroker, user: KafkaUser, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pipeline, ids = iam_pipeline(broker, user, tmp_path)
    pipeline.options.update(  # as a format("kafka") job on MSK has them
        {
            "kafka.sasl.jaas.config": "software.amazon.msk.auth.iam.IAMLoginModule required;",
            "kafka.sasl.client.callback.handler.class": "software.amazon.msk.auth.iam."
            "IAMClientCallbackHandler",
        }
    )
    expired_before = sum("expired" in r for r in broker.iam_refusals())
    killed = pipeline.start("driver.after_decision=block@1")
    pipeline.wait_reached("driver.after_decision", killed)
    kill_group(killed)
    first_out, first_err = killed.communicate(timeout=60)
    monkeypatch.setenv(LOG_LEVEL_ENV, "DEBUG")  # kafka-python logs SaslAuthenticate's bytes

    outcome = pipeline.run()

    assert outcome.returncode == 0, outcome.error
    assert_exactly_once(broker, pipeline, ids)
    output = first_out + first_err + outcome_text(outcome)
    assert "kafka.admin.client DEBUG Starting KafkaAdminClient" in output  # DEBUG was on
    assert_no_secret([SECRET, SESSION, TOKEN_SHAPE], output, tmp_path)
    # Every login with a token the broker still took: the clients signed new ones in time.
    assert sum("expired" in r for r in broker.iam_refusals()) == expired_before


@pytest.mark.full  # CI: the records above through the same clients
def test_files_mode_through_msk_iam(
    broker: IamKafkaBroker, user: KafkaUser, tmp_path: Path
) -> None:
    pipeline, ids = iam_pipeline(broker, user, tmp_path)
    references = f"iam_refs_{uuid.uuid4().hex[:8]}"
    broker.create_topic(references, partitions=2)
    broker.allow(user.principal, "TOPIC", references, ["WRITE", "READ"])
    pipeline.output = ""
    pipeline.select = SELECT
    pipeline.options.update(
        {"path": str(tmp_path / "files"), "referencesTopic": references, "partitionBy": "user"}
    )

    outcome = pipeline.run()

    assert outcome.returncode == 0, outcome.error
    admin = {k: str(v) for k, v in broker.setup_settings().items()}
    refs = [parse_reference(r.value or b"") for r in read_topic(
        broker.bootstrap, references, "read_committed", kafka=admin
    )]  # fmt: skip
    assert len({ref.location for ref in refs}) == len(refs), "a file is referenced twice"
    seen = [row["id"] for ref in refs for row in read_avro(ref.location)[1]]
    report = compare_ids(ids, seen)
    assert report.exact, report.summary()


@pytest.mark.full  # CI: tests/unit/test_msk_iam.py, the same error without Spark
def test_no_credentials_fail_the_query_at_its_start_saying_so(
    broker: IamKafkaBroker, user: KafkaUser, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pipeline, _ = iam_pipeline(broker, user, tmp_path)
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"):
        monkeypatch.delenv(name)

    outcome = pipeline.run()

    assert outcome.returncode != 0
    assert "MSK IAM: no AWS credentials: botocore's default chain found none" in outcome.error


@pytest.mark.full  # CI: tests/integration/test_msk_iam_clients.py, the same check without Spark
def test_a_policy_without_write_fails_the_query_naming_the_iam_action(
    broker: IamKafkaBroker, user: KafkaUser, tmp_path: Path
) -> None:
    pipeline, _ = iam_pipeline(broker, user, tmp_path)
    pipeline.output = f"iam_other_{uuid.uuid4().hex[:8]}"  # a topic the policy does not name
    broker.create_topic(pipeline.output, partitions=1)

    outcome = pipeline.run()

    assert outcome.returncode != 0
    assert "Allow kafka-cluster:WriteData on arn:aws:kafka:<region>:<account>:topic/" in (
        outcome.error
    )
    assert pipeline.output in outcome.error
