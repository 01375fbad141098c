"""The IAM test bed: tokens of AWS's own MSK IAM signer, sent by librdkafka over OAUTHBEARER,
checked for real by the broker's MskIamValidator."""

from __future__ import annotations

import base64
import time
import uuid
from collections.abc import Callable
from datetime import datetime, timedelta, timezone
from urllib.parse import parse_qs, urlparse

import botocore.auth
import pytest
from aws_msk_iam_sasl_signer import MSKAuthTokenProvider
from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, Producer, TopicPartition

from kafka_txn_sink.testing import IamKafkaBroker, KafkaUser

pytestmark = [pytest.mark.kafka, pytest.mark.msk_iam]

WAIT_S = 15.0
MAX_TOKEN_AGE_S = 20  # the iam_broker fixture refuses a token signed longer ago
SECRET = "wJalrXUtnFEMI/K7MDENG+bPxRfiCYTESTBEDKEY"
SESSION_TOKEN = "IQoJb3JpZ2luX2VjEH/test+bed/session=="

Unique = Callable[[str], str]


@pytest.fixture
def broker(iam_broker: IamKafkaBroker) -> IamKafkaBroker:
    return iam_broker


class Signer:
    """An ``oauth_cb``: AWS's signer with the environment's credentials; keeps its tokens."""

    def __init__(self) -> None:
        self.tokens: list[str] = []

    def __call__(self, _config: str) -> tuple[str, float]:
        token, expiry_ms = MSKAuthTokenProvider.generate_auth_token(IamKafkaBroker.REGION)
        self.tokens.append(token)
        return token, expiry_ms / 1000


def _new_key(broker: IamKafkaBroker, principal: str | None = None) -> tuple[str, KafkaUser]:
    """A new access key id, listed with SECRET, and its user."""
    akid = f"AKIA{uuid.uuid4().hex[:16].upper()}"
    return akid, broker.add_iam_user(akid, SECRET, principal)


def _use_credentials(
    monkeypatch: pytest.MonkeyPatch, akid: str, secret: str, session_token: str | None = None
) -> None:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", akid)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", secret)
    if session_token is None:
        monkeypatch.delenv("AWS_SESSION_TOKEN", raising=False)
    else:
        monkeypatch.setenv("AWS_SESSION_TOKEN", session_token)


def _query(token: str) -> dict[str, list[str]]:
    url = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)).decode()
    return parse_qs(urlparse(url).query)


def _read_back(broker: IamKafkaBroker, topic: str) -> bytes:
    """The first record of ``topic``, read by the test bed's super user."""
    consumer = Consumer(
        {
            "bootstrap.servers": broker.bootstrap,
            **broker.setup_settings(),
            "group.id": "iam-read-back",
            "enable.auto.commit": False,
            "log_level": 0,
        }
    )
    consumer.assign([TopicPartition(topic, 0, OFFSET_BEGINNING)])
    deadline = time.monotonic() + WAIT_S
    try:
        while time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is not None and msg.error() is None:
                return bytes(msg.value())
    finally:
        consumer.close()
    pytest.fail(f"nothing read back from {topic} within {WAIT_S}s")


def _refusal(broker: IamKafkaBroker, user: KafkaUser, signer: Signer) -> str:
    """Why the broker refused the first token of a producer signing with ``signer``, once the
    producer saw an authentication error (within WAIT_S)."""
    errors: list[KafkaError] = []
    before = len(broker.iam_refusals())
    producer = Producer(
        {
            **broker.client_settings(user),
            "oauth_cb": signer,
            "error_cb": errors.append,
            "log_level": 0,
        }
    )
    producer.produce("iam-refused", value=b"never")  # the first produce connects
    deadline = time.monotonic() + WAIT_S
    while not any(e.code() == KafkaError._AUTHENTICATION for e in errors):
        assert time.monotonic() < deadline, f"no authentication error in {WAIT_S}s: {errors}"
        producer.poll(0.2)
    producer.purge()
    return broker.iam_refusals()[before]


@pytest.mark.parametrize(
    ("principal", "session_token"), [("iam-writer", None), (None, SESSION_TOKEN)]
)
def test_a_listed_key_produces_and_logs_in_as_its_principal(
    broker: IamKafkaBroker,
    unique: Unique,
    monkeypatch: pytest.MonkeyPatch,
    principal: str | None,
    session_token: str | None,
) -> None:
    akid, user = _new_key(broker, principal)
    topic = broker.create_topic(unique("iam"), partitions=1)
    broker.allow(user.principal, "TOPIC", topic, ["WRITE", "DESCRIBE"])
    _use_credentials(monkeypatch, akid, SECRET, session_token)
    signer = Signer()
    producer = Producer({**broker.client_settings(user), "oauth_cb": signer, "log_level": 0})
    delivered: list[KafkaError | None] = []
    producer.produce(topic, value=b"signed", on_delivery=lambda err, _msg: delivered.append(err))

    assert producer.flush(WAIT_S) == 0 and delivered == [None]
    assert _read_back(broker, topic) == b"signed"
    query = _query(signer.tokens[0])
    assert query.get("X-Amz-Security-Token") == ([session_token] if session_token else None)
    assert (user.name, query["X-Amz-Date"][0]) in broker.iam_logins()


def test_a_token_signed_with_a_wrong_secret_is_refused(
    broker: IamKafkaBroker, monkeypatch: pytest.MonkeyPatch
) -> None:
    akid, user = _new_key(broker)
    _use_credentials(monkeypatch, akid, "not" + SECRET)
    assert _refusal(broker, user, Signer()) == f"the signature of {akid} does not match"


def test_an_unlisted_key_is_refused_a_revoked_one_too(
    broker: IamKafkaBroker, monkeypatch: pytest.MonkeyPatch
) -> None:
    akid, user = _new_key(broker)
    broker.remove_iam_user(akid)
    _use_credentials(monkeypatch, akid, SECRET)
    assert _refusal(broker, user, Signer()) == f"unknown access key id {akid}"


def test_a_token_older_than_max_token_age_is_refused(
    broker: IamKafkaBroker, monkeypatch: pytest.MonkeyPatch
) -> None:
    akid, user = _new_key(broker)
    _use_credentials(monkeypatch, akid, SECRET)
    # Well within the token's own 900 s: only maxTokenAgeSeconds refuses it. botocore's SigV4
    # reads its clock through this name.
    then = datetime.now(timezone.utc).replace(tzinfo=None, microsecond=0) - timedelta(
        seconds=MAX_TOKEN_AGE_S + 30
    )
    monkeypatch.setattr(botocore.auth, "get_current_datetime", lambda *_args, **_kw: then)
    signer = Signer()

    reason = _refusal(broker, user, signer)

    signed_at = then.strftime("%Y%m%dT%H%M%SZ")
    assert _query(signer.tokens[0])["X-Amz-Date"] == [signed_at]  # the clock was frozen
    assert reason.startswith(f"expired: signed at {signed_at}")
