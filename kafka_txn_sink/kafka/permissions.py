"""What the sink needs from Kafka's authorizer, and errors that name what is missing.

Each step of the protocol needs one permission (`NEEDED`); when the brokers refuse it, the
error names the operation, the resource and the principal, and gives the `kafka-acls` command
that grants it. A refused login says "authentication failed" and names the mechanism.
The principal is what the client settings say (the SASL user, the certificate's subject); a
broker with principal mapping rules may know it by another name, which the message allows for.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from kafka_txn_sink.errors import (
    AuthenticationFailedError,
    KafkaTxnSinkError,
    PermissionDeniedError,
)
from kafka_txn_sink.extras import missing_modules
from kafka_txn_sink.kafka.msk_iam import MECHANISM as MSK_IAM


@dataclass(frozen=True)
class Permission:
    """One ACL the sink needs: an operation on a resource (a name, or a name prefix)."""

    operation: str  # as kafka-acls names it: Write, Read, Describe, DescribeConfigs
    resource: str  # topic, group, transactional-id or cluster
    name: str = ""
    prefixed: bool = False

    def describe(self) -> str:
        """`Write on transactional-id prefix 'orders-'`, `DescribeConfigs on the cluster`."""
        if self.resource == "cluster":
            return f"{self.operation} on the cluster"
        kind = f"{self.resource} prefix" if self.prefixed else self.resource
        return f"{self.operation} on {kind} '{self.name}'"

    def iam_action(self) -> str:
        """The MSK IAM action that stands for it (`kafka-cluster:WriteData`)."""
        action = _IAM_ACTIONS.get((self.operation, self.resource))
        return f"kafka-cluster:{action}" if action else f"the action for {self.describe()}"

    def iam_resource(self) -> str:
        """The ARN pattern of its resource, the account, cluster and region left to fill."""
        if self.resource == "cluster":
            return "arn:aws:kafka:<region>:<account>:cluster/<cluster>/<uuid>"
        kind = "transactional-id" if self.resource == "transactional-id" else self.resource
        name = f"{self.name}*" if self.prefixed else self.name
        return f"arn:aws:kafka:<region>:<account>:{kind}/<cluster>/*/{name}"

    def grant_command(self, principal: str) -> str:
        """The `kafka-acls.sh` command that grants it to `principal`."""
        target = "--cluster" if self.resource == "cluster" else f"--{self.resource} '{self.name}'"
        pattern = " --resource-pattern-type prefixed" if self.prefixed else ""
        return (
            f"kafka-acls.sh --bootstrap-server <brokers> --command-config <admin.properties> "
            f"--add --allow-principal '{principal}' --operation {self.operation} {target}{pattern}"
        )


# (ACL operation, resource) -> MSK's IAM action for the same Kafka requests.
_IAM_ACTIONS = {
    ("Write", "topic"): "WriteData",
    ("Read", "topic"): "ReadData",
    ("Describe", "topic"): "DescribeTopic",
    ("Create", "topic"): "CreateTopic",
    ("Write", "transactional-id"): "AlterTransactionalId",
    ("Describe", "transactional-id"): "DescribeTransactionalId",
    ("Read", "group"): "AlterGroup",
    ("Describe", "group"): "DescribeGroup",
    ("DescribeConfigs", "topic"): "DescribeTopicDynamicConfiguration",
    ("DescribeConfigs", "cluster"): "DescribeClusterDynamicConfiguration",
}


def ids_permission(operation: str, sink_id: str) -> Permission:
    """`operation` on every transactional id of sink `sink_id` (the prefix `{sinkId}-`)."""
    return Permission(operation, "transactional-id", f"{sink_id}-", prefixed=True)


def group_permission(operation: str, group: str) -> Permission:
    """`operation` on consumer group `group`."""
    return Permission(operation, "group", group)


def topic_permission(operation: str, topic: str) -> Permission:
    """`operation` on topic `topic`."""
    return Permission(operation, "topic", topic)


CLUSTER_DESCRIBE_CONFIGS = Permission("DescribeConfigs", "cluster")
"""Reading the brokers' transaction.max.timeout.ms when the query starts."""
UNKNOWN_SUBJECT = "User:<the subject of the client certificate>"


def _login(kafka: Mapping[str, str]) -> tuple[dict[str, str], str, str]:
    """The settings by lower-case name, the security protocol and the SASL mechanism."""
    lowered = {k.lower(): v for k, v in kafka.items()}
    protocol = lowered.get("security.protocol", "PLAINTEXT").upper()
    mechanism = (lowered.get("sasl.mechanism") or lowered.get("sasl.mechanisms") or "").upper()
    return lowered, protocol, mechanism


def principal(kafka: Mapping[str, str]) -> str:
    """The principal the client settings authenticate as, as far as they tell."""
    lowered, protocol, mechanism = _login(kafka)
    if protocol.startswith("SASL") and mechanism in ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"):
        return f"User:{lowered.get('sasl.username', '')}"
    if protocol.startswith("SASL") and mechanism == "OAUTHBEARER":
        return f"User:<the subject of client {lowered.get('sasl.oauthbearer.client.id', '?')}>"
    if protocol.startswith("SASL"):
        return f"User:<the {mechanism or 'SASL'} principal>"
    if protocol == "SSL":
        return _certificate_principal(lowered)
    return "User:ANONYMOUS"


def _certificate_principal(lowered: Mapping[str, str]) -> str:
    """`User:<subject>` of the client certificate, as Kafka's default principal builder names
    it (the subject's RFC 2253 form)."""
    if missing_modules("keystore"):  # no cryptography installed: a name, not an ImportError
        return UNKNOWN_SUBJECT
    from cryptography import x509

    pem = lowered.get("ssl.certificate.pem", "").encode()
    location = lowered.get("ssl.certificate.location")
    try:
        if not pem and location:
            pem = Path(location).read_bytes()
        if pem:
            return f"User:{x509.load_pem_x509_certificate(pem).subject.rfc4514_string()}"
    except (OSError, ValueError):
        pass
    return UNKNOWN_SUBJECT


def denied(permission: Permission, kafka: Mapping[str, str], step: str) -> PermissionDeniedError:
    """The error for `step` refused for lack of `permission` (with MSK IAM, its IAM action)."""
    if _login(kafka)[2] == MSK_IAM:
        return PermissionDeniedError(
            f"{step}: MSK refused {permission.describe()} to the IAM identity of this "
            f"process's AWS credentials. Allow {permission.iam_action()} on "
            f"{permission.iam_resource()} in its policy (docs/operations.md lists every action "
            "the sink needs)"
        )
    who = principal(kafka)
    return PermissionDeniedError(
        f"{step}: Kafka refused {permission.describe()} to {who} (or the principal the brokers "
        f"map these credentials to). Grant it: {permission.grant_command(who)}"
    )


def authentication_failed(kafka: Mapping[str, str], detail: str) -> AuthenticationFailedError:
    """The error for credentials the brokers refused; `detail` must not hold a secret."""
    _, protocol, mechanism = _login(kafka)
    if mechanism == MSK_IAM:
        return AuthenticationFailedError(
            f"authentication failed (SASL {MSK_IAM}): {detail}. Check that this process's AWS "
            "credentials are valid and not expired, that their policy allows "
            "kafka-cluster:Connect on the cluster, that kafka.aws.region is the cluster's, "
            "and that the clock is right"
        )
    how = f"SASL {mechanism or 'GSSAPI'}" if protocol.startswith("SASL") else "TLS"
    return AuthenticationFailedError(
        f"authentication failed ({how} as {principal(kafka)}, security.protocol={protocol}): "
        f"{detail}. Check the user and password (or certificate) in the kafka.* options"
    )


# -- what the clients report ---------------------------------------------------------------------

_TXN_ID_DENIED = 53  # TRANSACTIONAL_ID_AUTHORIZATION_FAILED, as both clients number it
_TOPIC_DENIED = 29  # TOPIC_AUTHORIZATION_FAILED
_CLUSTER_DENIED = 31  # CLUSTER_AUTHORIZATION_FAILED
_GROUP_DENIED = 30  # GROUP_AUTHORIZATION_FAILED
_SASL_FAILED = 58  # SASL_AUTHENTICATION_FAILED
_LOCAL_AUTHENTICATION = -169  # librdkafka's _AUTHENTICATION


def refused(
    code: int,
    detail: str,
    kafka: Mapping[str, str],
    step: str,
    needed: Permission | None = None,
    txn_id: str | None = None,
) -> KafkaTxnSinkError | None:
    """The error for a refusal by the brokers, from a client's error `code` and its text
    `detail` (librdkafka's or kafka-python's; it must hold no secret): a denied transactional
    id (`txn_id`) names Write on the sink's id prefix, any other denial `needed`, the
    permission `step` needs; a refused login names the mechanism. None for any other code.
    """
    if code == _TXN_ID_DENIED and txn_id is not None:
        # A sink id has no '-': it is what comes before the first one.
        return denied(ids_permission("Write", txn_id.split("-", 1)[0]), kafka, step)
    if code in (_TXN_ID_DENIED, _TOPIC_DENIED, _CLUSTER_DENIED, _GROUP_DENIED) and needed:
        return denied(needed, kafka, step)
    if code in (_SASL_FAILED, _LOCAL_AUTHENTICATION):
        return authentication_failed(kafka, detail)
    return None
