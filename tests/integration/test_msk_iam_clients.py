"""The sink's own Kafka clients on MSK IAM, against the test bed's broker that checks each token
as MSK does (kafka_txn_sink/testing/iam_broker.py): the driver's librdkafka admin client and
kafka-python EndTxn client, and a producer from the settings tasks get, all from the options a
user writes. Tokens are refreshed before the broker would refuse them, a wrong key fails by
name, and a missing permission names its IAM action."""

from __future__ import annotations

import os
import time
import uuid

import pytest
from confluent_kafka import Producer

from kafka_txn_sink.errors import AuthenticationFailedError, PermissionDeniedError
from kafka_txn_sink.kafka import msk_iam_tokens
from kafka_txn_sink.kafka.admin_api import ONGOING
from kafka_txn_sink.kafka.cluster import Cluster
from kafka_txn_sink.kafka.security import client_settings, librdkafka_config
from kafka_txn_sink.kafka.txn_admin import TxnAdmin
from kafka_txn_sink.testing import IamKafkaBroker, KafkaUser

pytestmark = [pytest.mark.kafka, pytest.mark.msk_iam]

SECRET = "wJalrXUtnFEMI/K7MDENG+bPxRfiCYCLIENTSKEY"
MAX_TOKEN_AGE_S = 20  # the iam_broker fixture refuses a token signed longer ago
LIFETIME_S = 10  # what the clients are told, so they sign anew before the broker refuses


@pytest.fixture
def broker(iam_broker: IamKafkaBroker) -> IamKafkaBroker:
    return iam_broker


@pytest.fixture
def user(broker: IamKafkaBroker, monkeypatch: pytest.MonkeyPatch) -> KafkaUser:
    """A new key, listed by the broker, in this process's environment (botocore's chain)."""
    akid = f"AKIA{uuid.uuid4().hex[:16].upper()}"
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", akid)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET)
    monkeypatch.delenv("AWS_SESSION_TOKEN", raising=False)
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    monkeypatch.setenv(msk_iam_tokens.LIFETIME_ENV, str(LIFETIME_S))
    monkeypatch.setattr(msk_iam_tokens, "_signers", {})  # credentials resolved afresh
    return broker.add_iam_user(akid, SECRET, f"writer-{akid[-6:].lower()}")


def settings_of(broker: IamKafkaBroker, user: KafkaUser) -> tuple[str, dict[str, str]]:
    """The bootstrap servers and the kafka.* settings, as the sink reads the user's options."""
    options = {k.removeprefix("kafka."): v for k, v in broker.iam_options(user).items()}
    bootstrap = options.pop("bootstrap.servers")
    return bootstrap, client_settings(options)


def test_both_clients_sign_new_tokens_before_the_broker_refuses_the_old(
    broker: IamKafkaBroker, user: KafkaUser
) -> None:
    topic = f"iam_{uuid.uuid4().hex[:8]}"
    broker.create_topic(topic, partitions=1)
    broker.allow(user.principal, "TOPIC", topic, ["WRITE", "DESCRIBE"])
    broker.allow(user.principal, "TRANSACTIONAL_ID", "iam-", ["DESCRIBE"], prefixed=True)
    bootstrap, kafka = settings_of(broker, user)
    expired_before = sum("expired" in r for r in broker.iam_refusals())
    cluster = Cluster(bootstrap, kafka)
    producer = Producer(librdkafka_config({**kafka, "bootstrap.servers": bootstrap}))
    with TxnAdmin(bootstrap, kafka, timeout_ms=15_000) as txn_admin:
        # Past two re-authentications and the broker's limit on a token's age: each client
        # logs in again on its open connections, with a token it has just signed.
        for round_ in range(3):
            if round_:
                time.sleep(MAX_TOKEN_AGE_S + 2)
            assert cluster.topic_partitions(topic) == 1
            assert txn_admin.list_ids([ONGOING]) == []
            producer.produce(topic, value=f"round {round_}".encode())
            assert producer.flush(15) == 0

    # Every re-authentication with a token the broker still took: each client signed new ones.
    assert sum("expired" in r for r in broker.iam_refusals()) == expired_before
    signed_at = {at for who, at in broker.iam_logins() if who == user.name}
    assert len(signed_at) >= 3, signed_at


def test_a_key_the_broker_does_not_know_fails_as_authentication_naming_msk_iam(
    broker: IamKafkaBroker, user: KafkaUser
) -> None:
    bootstrap, kafka = settings_of(broker, user)
    broker.remove_iam_user(os.environ["AWS_ACCESS_KEY_ID"])  # revoked: the broker knows it not

    with pytest.raises(AuthenticationFailedError, match="SASL AWS_MSK_IAM") as caught:
        Cluster(bootstrap, kafka, timeout_ms=5_000).topic_partitions("anything")

    assert "kafka-cluster:Connect" in str(caught.value) and SECRET not in str(caught.value)


def test_a_missing_permission_names_its_iam_action(broker: IamKafkaBroker, user: KafkaUser) -> None:
    topic = f"iam_{uuid.uuid4().hex[:8]}"
    broker.create_topic(topic, partitions=1)
    bootstrap, kafka = settings_of(broker, user)

    with pytest.raises(PermissionDeniedError) as caught:
        Cluster(bootstrap, kafka).topic_partitions(topic)

    assert "Allow kafka-cluster:WriteData on arn:aws:kafka:<region>:<account>:topic/" in str(
        caught.value
    )
