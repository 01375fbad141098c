"""MSK IAM without a broker: the options users copy from Spark jobs, the region, the tokens
(what AWS's own signer makes, from botocore's credentials, an assumed role's too), both clients'
settings, the errors, and no secret in a log."""

from __future__ import annotations

import base64
import logging
import re
import time
import urllib.parse
from pathlib import Path

import pytest

import kafka_txn_sink
from kafka_txn_sink.errors import ConfigError
from kafka_txn_sink.kafka import msk_iam_tokens
from kafka_txn_sink.kafka.msk_iam import MskIam, msk_iam, region_of_hosts
from kafka_txn_sink.kafka.permissions import (
    CLUSTER_DESCRIBE_CONFIGS,
    denied,
    group_permission,
    ids_permission,
    topic_permission,
)
from kafka_txn_sink.kafka.security import (
    check_driver_support,
    client_settings,
    driver_settings,
    librdkafka_config,
    option_settings,
)

AKID = "AKIDEXAMPLE0000001"
SECRET = "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY"
SESSION = "FwoGZXIvYXdzEXAMPLE/session+token=="
IAM = {"security.protocol": "SASL_SSL", "sasl.mechanism": "AWS_MSK_IAM"}
MODULE = "software.amazon.msk.auth.iam.IAMLoginModule"

pytestmark = pytest.mark.msk_iam  # confluent-kafka 2.13+: not in the oldest clients' tier


@pytest.fixture
def aws(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> pytest.MonkeyPatch:
    """Credentials in the environment only: no file, no instance metadata, no region."""
    for name in ("AWS_PROFILE", "AWS_DEFAULT_REGION", "AWS_ROLE_ARN"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "credentials"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", AKID)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET)
    monkeypatch.setenv("AWS_SESSION_TOKEN", SESSION)
    monkeypatch.setattr(msk_iam_tokens, "_signers", {})
    return monkeypatch


def query(token: str) -> dict[str, str]:
    url = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)).decode()
    parts = urllib.parse.urlsplit(url)
    assert parts.netloc.startswith("kafka.") and parts.path == "/"
    return dict(urllib.parse.parse_qsl(parts.query))


# -- the options ---------------------------------------------------------------------------------


@pytest.mark.parametrize("prefix", ["", "shadedmskiam."])
def test_the_java_login_module_becomes_the_sinks_settings(prefix: str) -> None:
    jaas = f'{prefix}{MODULE} required awsRoleArn="arn:aws:iam::1:role/w" awsMaxRetries="5";'
    settings = client_settings(
        {
            **IAM,
            "sasl.jaas.config": jaas,
            "sasl.client.callback.handler.class": f"{prefix}software.amazon.msk.auth.iam."
            "IAMClientCallbackHandler",
        }
    )
    assert settings == {**IAM, "aws.role.arn": "arn:aws:iam::1:role/w"}


def test_the_java_oauthbearer_route_is_msk_iam() -> None:
    handler = "software.amazon.msk.auth.iam.IAMOAuthBearerLoginCallbackHandler"
    settings = client_settings(
        {
            "security.protocol": "SASL_SSL",
            "sasl.mechanism": "OAUTHBEARER",
            "sasl.jaas.config": "org.apache.kafka.common.security.oauthbearer."
            'OAuthBearerLoginModule required awsProfileName="writer";',  # read by AWS's handler
            "sasl.login.callback.handler.class": handler,
            "sasl.client.callback.handler.class": handler,
        }
    )
    assert settings == {**IAM, "aws.profile": "writer"}


@pytest.mark.parametrize(
    ("options", "expected"),
    [
        ('awsRoleSecretAccessKey="x"', "awsRoleSecretAccessKey is not supported: a key"),
        ('awsDebugCreds="true"', "awsDebugCreds is not supported"),
        ('awsRegion="x"', "IAMLoginModule option awsRegion is not supported"),
    ],
)
def test_a_login_module_option_the_sink_refuses_is_named(options: str, expected: str) -> None:
    with pytest.raises(ConfigError, match=expected):
        client_settings({**IAM, "sasl.jaas.config": f"{MODULE} required {options};"})


def test_msk_iam_needs_tls_and_its_settings_need_msk_iam() -> None:
    with pytest.raises(ConfigError, match=r"needs kafka\.security\.protocol=SASL_SSL"):
        check_driver_support({"sasl.mechanism": "AWS_MSK_IAM"})
    with pytest.raises(
        ConfigError, match=r"option kafka\.aws\.region is for kafka\.sasl\.mechanism"
    ):
        check_driver_support({"aws.region": "us-east-1"})


def test_the_region_comes_from_the_option_the_host_names_or_botocore(
    aws: pytest.MonkeyPatch,
) -> None:
    host = "b-1.orders.x1y2z3.c2.kafka.eu-west-1.amazonaws.com:9098"
    assert region_of_hosts(f"localhost:1,{host}") == "eu-west-1"
    assert (
        region_of_hosts("boot-ab.c1.kafka-serverless.us-east-2.amazonaws.com:9098") == "us-east-2"
    )
    assert msk_iam({**IAM, "aws.region": "ap-south-1"}, host).region == "ap-south-1"
    assert msk_iam_tokens.resolve(IAM, host).region == "eu-west-1"
    with pytest.raises(ConfigError, match=r"set option kafka\.aws\.region"):
        msk_iam_tokens.resolve(IAM, "127.0.0.1:9098")
    aws.setenv("AWS_DEFAULT_REGION", "ca-central-1")
    assert msk_iam_tokens.resolve(IAM, "127.0.0.1:9098").region == "ca-central-1"


# -- the tokens ----------------------------------------------------------------------------------


def test_a_token_is_aws_signers_own_for_the_credentials_and_region(aws: pytest.MonkeyPatch) -> None:
    token, expiry = msk_iam_tokens.signer(MskIam("us-west-2")).token()

    signed = query(token)
    assert signed["Action"] == "kafka-cluster:Connect"
    assert signed["X-Amz-Credential"].startswith(f"{AKID}/")
    assert signed["X-Amz-Credential"].endswith("/us-west-2/kafka-cluster/aws4_request")
    assert signed["X-Amz-Security-Token"] == SESSION
    assert signed["X-Amz-Expires"] == "900"
    assert abs(expiry - (time.time() + 900)) < 5
    aws.setenv(msk_iam_tokens.LIFETIME_ENV, "20")
    assert abs(msk_iam_tokens.signer(MskIam("us-west-2")).token()[1] - (time.time() + 20)) < 5


def test_a_role_is_assumed_and_its_keys_sign(aws: pytest.MonkeyPatch) -> None:
    from moto import mock_aws

    with mock_aws():
        iam = MskIam("us-east-1", role_arn="arn:aws:iam::123456789012:role/writer")
        token, _ = msk_iam_tokens.signer(iam).token()

    akid = query(token)["X-Amz-Credential"].split("/")[0]
    assert akid != AKID and akid.startswith("ASIA")  # the role's temporary key


def test_the_role_is_assumed_with_the_session_name_and_external_id() -> None:
    iam = MskIam("us-east-1", role_arn="arn:aws:iam::1:role/w", role_external_id="ext-7")

    assert msk_iam_tokens.assume_role_args(iam) == {
        "RoleSessionName": "kafka-txn-sink",
        "ExternalId": "ext-7",
    }


def test_no_credentials_is_one_clear_error(aws: pytest.MonkeyPatch) -> None:
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"):
        aws.delenv(name)

    with pytest.raises(ConfigError, match="no AWS credentials: botocore's default chain"):
        librdkafka_config({**IAM, "aws.region": "us-east-1", "bootstrap.servers": "h:1"})


def test_a_missing_profile_is_named_without_a_secret(aws: pytest.MonkeyPatch) -> None:
    with pytest.raises(ConfigError, match="ProfileNotFound") as caught:
        msk_iam_tokens.signer(MskIam("us-east-1", profile="nobody")).token()
    assert "nobody" in str(caught.value) and SECRET not in str(caught.value)


# -- both clients ----------------------------------------------------------------------------------


def test_librdkafka_gets_oauthbearer_with_a_callback_and_no_aws_setting(
    aws: pytest.MonkeyPatch,
) -> None:
    config = librdkafka_config({**IAM, "aws.region": "us-east-1", "bootstrap.servers": "h:1"})

    assert config["sasl.mechanism"] == "OAUTHBEARER"
    assert not any(k.startswith("aws.") for k in config)
    token, expiry = config["oauth_cb"]("")
    assert query(token)["Action"] == "kafka-cluster:Connect" and expiry > time.time()


def test_the_drivers_client_gets_a_token_provider(aws: pytest.MonkeyPatch) -> None:
    settings = driver_settings({**IAM, "aws.region": "us-east-1"}, "h:1")

    assert settings["sasl_mechanism"] == "OAUTHBEARER"
    provider = settings["sasl_oauth_token_provider"]
    assert query(provider.token())["X-Amz-Credential"].startswith(f"{AKID}/")


def test_neither_token_nor_key_reaches_a_log_with_botocore_at_debug(
    aws: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from moto import mock_aws

    iam = MskIam("us-east-1", role_arn="arn:aws:iam::123456789012:role/writer")
    with caplog.at_level(logging.DEBUG), mock_aws():  # the root logger: botocore's records too
        token, _ = msk_iam_tokens.signer(iam).token()
        # As kafka-python logs SaslAuthenticate's bytes.
        logging.getLogger("kafka.conn").debug("SaslAuthenticate %r", f"auth=Bearer {token}")

    signed = query(token)
    secrets = [token, SECRET, SESSION, urllib.parse.quote(SESSION, safe="-_.~")]
    secrets += [signed["X-Amz-Signature"], signed["X-Amz-Security-Token"]]  # the role's
    assert "botocore" in caplog.text  # botocore did log, at DEBUG
    leaked = [i for i, secret in enumerate(secrets) if secret in caplog.text]
    assert leaked == [], caplog.text[-3000:]


def test_every_permission_the_sink_asks_for_has_its_iam_action() -> None:
    source = "\n".join(p.read_text() for p in Path(kafka_txn_sink.__file__).parent.rglob("*.py"))
    asked = set(re.findall(r'(topic|group|ids)_permission\(\s*"(\w+)"', source))
    asked |= {("group", op) for op in re.findall(r'group_error\([^)]*"(\w+)"\)', source)}
    made = {"topic": topic_permission, "group": group_permission, "ids": ids_permission}
    assert ("topic", "Write") in asked and ("group", "Describe") in asked
    for kind, operation in sorted(asked):
        assert made[kind](operation, "x").iam_action().startswith("kafka-cluster:"), operation
    assert (
        CLUSTER_DESCRIBE_CONFIGS.iam_action() == "kafka-cluster:DescribeClusterDynamicConfiguration"
    )


def test_the_region_is_pinned_in_the_options_tasks_get(aws: pytest.MonkeyPatch) -> None:
    aws.setenv("AWS_DEFAULT_REGION", "sa-east-1")  # the driver's; an executor may have none

    settings = option_settings({**IAM, "bootstrap.servers": "10.0.0.1:9098"})

    assert settings["aws.region"] == "sa-east-1"


def test_oauthbearer_settings_do_not_go_with_msk_iam() -> None:
    with pytest.raises(ConfigError, match=r"kafka\.sasl\.oauthbearer\.method does not go with"):
        check_driver_support({**IAM, "sasl.oauthbearer.method": "oidc"})


def test_a_denial_names_the_iam_action_and_resource() -> None:
    error = denied(topic_permission("Write", "orders"), IAM, "producing")

    assert "Allow kafka-cluster:WriteData on arn:aws:kafka:<region>:<account>:topic/" in str(error)
    assert str(error).endswith("docs/operations.md lists every action the sink needs)")


def test_a_profile_gives_its_keys(aws: pytest.MonkeyPatch, tmp_path: Path) -> None:
    (tmp_path / "credentials").write_text(
        f"[writer]\naws_access_key_id = AKIDPROFILE0000001\naws_secret_access_key = {SECRET}\n"
    )

    token, _ = msk_iam_tokens.signer(MskIam("us-east-1", profile="writer")).token()

    assert query(token)["X-Amz-Credential"].startswith("AKIDPROFILE0000001/")
