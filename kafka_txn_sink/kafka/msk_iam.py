"""AWS MSK IAM access control: the options users write, and the region of the cluster.

MSK takes, from clients that are not Java, SASL/OAUTHBEARER with a token that AWS's signer makes
(`msk_iam_tokens.py`). Users write the options of AWS's Java library, as Spark's own Kafka
connector takes them: `kafka.sasl.mechanism=AWS_MSK_IAM` and optionally its `IAMLoginModule`
JAAS line (`awsRoleArn`, `awsRoleSessionName`, `awsRoleExternalId`, `awsProfileName`,
`awsStsRegion`), which `security.translate_jaas` turns into the `aws.*` settings here. They are
strings, so the options pickle to tasks as they are; every process makes its own tokens when it
makes a client (`msk_iam_tokens.librdkafka_settings`, `MskIamTokenProvider`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kafka_txn_sink.errors import ConfigError

MECHANISM = "AWS_MSK_IAM"
LOGIN_MODULE = "software.amazon.msk.auth.iam.IAMLoginModule"
OAUTHBEARER_MODULE = "org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginModule"
"""Kafka's own module, which AWS's OAUTHBEARER route for Java takes the same options in."""
# AWS's Java classes, as users copy them from Spark jobs (Databricks shades them under
# `shadedmskiam.`): accepted and dropped, since the sink does what they do.
JAVA_HANDLERS = (
    "software.amazon.msk.auth.iam.IAMClientCallbackHandler",
    "software.amazon.msk.auth.iam.IAMOAuthBearerLoginCallbackHandler",
)
SHADED = "shadedmskiam."
REGION = "aws.region"
PROFILE = "aws.profile"
ROLE_ARN = "aws.role.arn"
ROLE_SESSION_NAME = "aws.role.session.name"
ROLE_EXTERNAL_ID = "aws.role.external.id"
STS_REGION = "aws.sts.region"
SETTINGS = (REGION, PROFILE, ROLE_ARN, ROLE_SESSION_NAME, ROLE_EXTERNAL_ID, STS_REGION)
"""The sink's own `kafka.aws.*` settings: read by the sink, never given to a client."""

JAAS_OPTIONS = {
    "awsProfileName": PROFILE,
    "awsRoleArn": ROLE_ARN,
    "awsRoleSessionName": ROLE_SESSION_NAME,
    "awsRoleExternalId": ROLE_EXTERNAL_ID,
    "awsStsRegion": STS_REGION,
}
JAAS_IGNORED = ("awsMaxRetries", "awsMaxBackOffTimeMs")
"""Options of the Java library that botocore's own retry settings stand for."""
_KEYS_IN_OPTIONS = (
    "a key in an option shows in Spark's plans and errors: give botocore the credentials "
    "(AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN, or a profile)"
)
JAAS_REFUSED = {
    "awsRoleAccessKeyId": _KEYS_IN_OPTIONS,
    "awsRoleSecretAccessKey": _KEYS_IN_OPTIONS,
    "awsRoleSessionToken": _KEYS_IN_OPTIONS,
    "awsDebugCreds": "it logs the caller's identity; the sink never logs credentials",
}
DEFAULT_SESSION_NAME = "kafka-txn-sink"

# b-1.mycluster.abc123.c2.kafka.us-east-1.amazonaws.com, boot-x.c1.kafka-serverless.<region>...
_MSK_HOST = re.compile(
    r"\.kafka(?:-serverless)?\.(?P<region>[a-z]{2}(?:-gov)?-[a-z]+-\d+)\.amazonaws\.com(?:\.cn)?$"
)


@dataclass(frozen=True)
class MskIam:
    """Where a process's tokens come from: the cluster's region and botocore's credentials."""

    region: str
    profile: str | None = None
    role_arn: str | None = None
    role_session_name: str = DEFAULT_SESSION_NAME
    role_external_id: str | None = None
    sts_region: str | None = None


def is_msk_iam(settings: Mapping[str, Any]) -> bool:
    """Whether `settings` (librdkafka-style) ask for MSK IAM."""
    lowered = {k.lower(): v for k, v in settings.items()}
    mechanism = lowered.get("sasl.mechanism") or lowered.get("sasl.mechanisms") or ""
    return str(mechanism).upper() == MECHANISM


def is_java_handler(value: str) -> bool:
    """Whether `value` names one of AWS's Java callback handlers (shaded or not)."""
    return value.strip().removeprefix(SHADED) in JAVA_HANDLERS


def jaas_settings(values: Mapping[str, str], prefix: str = "kafka.") -> dict[str, str]:
    """The `aws.*` settings of the options of an `IAMLoginModule` JAAS line.

    Raises:
        ConfigError: an option the sink refuses (keys, debug) or does not know.
    """
    settings: dict[str, str] = {}
    for name, value in values.items():
        if name in JAAS_REFUSED:
            raise ConfigError(
                f"option {prefix}sasl.jaas.config: {name} is not supported: {JAAS_REFUSED[name]}"
            )
        if name in JAAS_OPTIONS:
            settings[JAAS_OPTIONS[name]] = value
        elif name not in JAAS_IGNORED:
            known = ", ".join([*JAAS_OPTIONS, *JAAS_IGNORED])
            raise ConfigError(
                f"option {prefix}sasl.jaas.config: IAMLoginModule option {name} is not "
                f"supported; supported: {known}"
            )
    return settings


def msk_iam(
    settings: Mapping[str, Any],
    bootstrap: str,
    default_region: str | None = None,
    prefix: str = "kafka.",
) -> MskIam:
    """The MSK IAM settings of `settings`, the region resolved: option `{prefix}aws.region`,
    else the MSK host name of a bootstrap server, else `default_region` (botocore's).

    Raises:
        ConfigError: no region from any of the three.
    """
    lowered = {k.lower(): str(v) for k, v in settings.items()}
    region = lowered.get(REGION) or region_of_hosts(bootstrap) or default_region
    if not region:
        raise ConfigError(
            f"MSK IAM needs the cluster's region: set option {prefix}{REGION}, give the "
            "brokers' MSK host names (...kafka.<region>.amazonaws.com) as bootstrap servers, "
            "or set AWS_DEFAULT_REGION"
        )
    return MskIam(
        region=region,
        profile=lowered.get(PROFILE) or None,
        role_arn=lowered.get(ROLE_ARN) or None,
        role_session_name=lowered.get(ROLE_SESSION_NAME) or DEFAULT_SESSION_NAME,
        role_external_id=lowered.get(ROLE_EXTERNAL_ID) or None,
        sts_region=lowered.get(STS_REGION) or None,
    )


def region_of_hosts(bootstrap: str) -> str | None:
    """The region in the first MSK broker host name of a bootstrap list, if any."""
    for server in bootstrap.split(","):
        host = server.strip().rsplit(":", 1)[0].lower()
        found = _MSK_HOST.search(host)
        if found:
            return found["region"]
    return None
