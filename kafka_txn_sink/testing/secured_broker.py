"""Apache Kafka's broker secured as in production: TLS, SASL, mutual TLS and ACLs, on loopback.

``SecuredKafkaBroker`` is a ``KafkaBroker`` (same jars, process handling, restart) whose
listeners are

- ``SASL_SSL``: SCRAM-SHA-512 and PLAIN over TLS (``bootstrap``);
- ``MTLS``: TLS with a client certificate required; the principal is the certificate's CN;
- ``INTERNAL`` and ``CONTROLLER``: the broker's own, mutual TLS as ``User:broker``;

with certificates from a CA it makes itself (``certificates``), the StandardAuthorizer refusing
whatever no ACL allows, and two super users: ``User:admin`` (SCRAM-SHA-512, created when the
storage is formatted; the test bed's own client) and ``User:broker``. Users are added with
``add_scram_user``, ``add_plain_user`` and ``add_tls_user``; ACLs with ``allow``; each user's
client settings come from ``client_settings`` (librdkafka), ``kafka_python_settings`` and
``java_settings`` (Kafka's Java clients, e.g. Spark's Kafka source).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from kafka_txn_sink.testing.certificates import CertificateAuthority
from kafka_txn_sink.testing.errors import TestbedError
from kafka_txn_sink.testing.kafka_broker import (
    CONTROLLER,
    KafkaBroker,
    SettingValue,
    admin_client,
)
from kafka_txn_sink.testing.processes import wait_for

SCRAM_SHA_512 = "SCRAM-SHA-512"
PLAIN = "PLAIN"
TLS = "TLS"
"""The ``mechanism`` of a user who authenticates with a client certificate."""

ADMIN = "admin"
BROKER = "broker"
ADMIN_PASSWORD = "kts-admin-secret"
SCRAM_ITERATIONS = 8192

SASL_LISTENER = "SASL_SSL"
MTLS_LISTENER = "MTLS"
INTERNAL_LISTENER = "INTERNAL"

_SIMPLE = re.compile(r"^[A-Za-z0-9._-]+$")
_JAAS = {
    SCRAM_SHA_512: "org.apache.kafka.common.security.scram.ScramLoginModule",
    PLAIN: "org.apache.kafka.common.security.plain.PlainLoginModule",
}


@dataclass(frozen=True)
class KafkaUser:
    """A user of the secured broker and what it authenticates with."""

    name: str
    mechanism: str
    """``SCRAM-SHA-512``, ``PLAIN`` or ``TLS`` (a client certificate)."""
    password: str | None = None
    certificate: Path | None = None
    key: Path | None = None

    @property
    def principal(self) -> str:
        """The principal ACLs name: ``User:<name>``."""
        return f"User:{self.name}"


class SecuredKafkaBroker(KafkaBroker):
    """A single-node KRaft broker with SASL_SSL, mutual-TLS and the StandardAuthorizer.

    ``start()`` returns the SASL_SSL address; ``address(MTLS_LISTENER)`` is the mutual-TLS one.
    """

    LISTENERS: ClassVar[Mapping[str, str]] = {
        SASL_LISTENER: "SASL_SSL",
        MTLS_LISTENER: "SSL",
        INTERNAL_LISTENER: "SSL",
        CONTROLLER: "SSL",
    }
    INTER_BROKER_LISTENER: ClassVar[str] = INTERNAL_LISTENER

    def __init__(
        self,
        workdir: Path | str,
        version: str | None = None,
        extra_config: Mapping[str, object] | None = None,
        heap: str = "768m",
        detached: bool = False,
    ) -> None:
        super().__init__(workdir, version, extra_config, heap, detached)
        self.ca = CertificateAuthority(self.workdir / "tls")
        self.admin = KafkaUser(ADMIN, SCRAM_SHA_512, password=ADMIN_PASSWORD)
        self._plain_passwords: dict[str, str] = {}

    @property
    def ca_path(self) -> Path:
        """The CA certificate (PEM) clients trust the broker by."""
        return self.ca.ca_path

    # ---- configuration ------------------------------------------------------------------------

    def _write_files(self) -> None:
        self.ca.issue(BROKER, server=True)
        super()._write_files()

    def _listener_config(self) -> dict[str, object]:
        return {
            **super()._listener_config(),
            "ssl.keystore.type": "PEM",
            "ssl.keystore.location": str(self.ca.files(BROKER).keystore),
            "ssl.truststore.type": "PEM",
            "ssl.truststore.location": str(self.ca_path),
            **{
                f"listener.name.{name.lower()}.ssl.client.auth": "required"
                for name in (MTLS_LISTENER, INTERNAL_LISTENER, CONTROLLER)
            },
            # User:<CN> rather than User:CN=<CN>: certificates here have a CN only.
            "ssl.principal.mapping.rules": "RULE:^CN=(.*)$/$1/,DEFAULT",
            "sasl.enabled.mechanisms": f"{SCRAM_SHA_512},{PLAIN}",
            **self._jaas_config(),
            "authorizer.class.name": "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
            "allow.everyone.if.no.acl.found": "false",
            "super.users": f"User:{ADMIN};User:{BROKER}",
        }

    def _jaas_config(self) -> dict[str, str]:
        prefix = f"listener.name.{SASL_LISTENER.lower()}"
        plain_users = "".join(
            f' user_{name}="{password}"' for name, password in self._plain_passwords.items()
        )
        scram, plain = SCRAM_SHA_512.lower(), PLAIN.lower()
        return {
            f"{prefix}.{scram}.sasl.jaas.config": f"{_JAAS[SCRAM_SHA_512]} required;",
            f"{prefix}.{plain}.sasl.jaas.config": f"{_JAAS[PLAIN]} required{plain_users};",
        }

    def _format_options(self) -> list[str]:
        # The set-up user must exist before the broker serves anyone.
        return [
            "--add-scram",
            f"{SCRAM_SHA_512}=[name={self.admin.name},password={self.admin.password}]",
        ]

    def setup_settings(self) -> dict[str, SettingValue]:
        """The super user ``admin``'s settings over SASL_SSL."""
        return self._security_settings(self.admin)

    # ---- users ----------------------------------------------------------------------------------

    def add_scram_user(self, name: str, password: str, timeout: float = 30.0) -> KafkaUser:
        """Create (or update) a SCRAM-SHA-512 user through the admin API of the running broker;
        returns once the user can authenticate."""
        from confluent_kafka.admin import (
            ScramCredentialInfo,
            ScramMechanism,
            UserScramCredentialUpsertion,
        )

        user = KafkaUser(_user_name(name), SCRAM_SHA_512, password=_password(password))
        upsert = UserScramCredentialUpsertion(
            name,
            ScramCredentialInfo(ScramMechanism.SCRAM_SHA_512, SCRAM_ITERATIONS),
            password.encode(),
        )
        admin = self._admin()  # kept referenced: its futures fail once it is collected
        admin.alter_user_scram_credentials([upsert], request_timeout=timeout)[name].result(
            timeout=timeout
        )
        wait_for(
            lambda: self._authenticates(user),
            timeout,
            f"SCRAM user {name} to authenticate",
            interval=0.5,
        )
        return user

    def add_plain_user(self, name: str, password: str, timeout: float = 90.0) -> KafkaUser:
        """Add a PLAIN user; PLAIN users live in the broker's settings, so a running broker is
        restarted (same ports and data)."""
        user = KafkaUser(_user_name(name), PLAIN, password=_password(password))
        self._plain_passwords[name] = password
        if self.is_running():
            self.restart(timeout)
        return user

    def add_tls_user(self, name: str) -> KafkaUser:
        """A user authenticated by a client certificate for ``CN=name``, signed by the CA."""
        issued = self.ca.issue(_user_name(name))
        return KafkaUser(name, TLS, certificate=issued.certificate, key=issued.key)

    def _authenticates(self, user: KafkaUser) -> bool | None:
        metadata = admin_client(
            self.address(self._listener_of(user)), self._security_settings(user)
        ).list_topics(timeout=5)
        return bool(metadata.brokers) or None

    # ---- client settings ----------------------------------------------------------------------

    def client_settings(self, user: KafkaUser) -> dict[str, SettingValue]:
        """librdkafka settings (confluent_kafka) of ``user``, ``bootstrap.servers`` included."""
        return {
            "bootstrap.servers": self.address(self._listener_of(user)),
            **self._security_settings(user),
        }

    def kafka_python_settings(self, user: KafkaUser) -> dict[str, object]:
        """kafka-python keyword arguments of ``user`` (e.g. for ``KafkaAdminClient``)."""
        settings: dict[str, object] = {
            "bootstrap_servers": self.address(self._listener_of(user)),
            "ssl_cafile": str(self.ca_path),
            "ssl_check_hostname": True,
        }
        if user.mechanism == TLS:
            settings.update(
                security_protocol="SSL",
                ssl_certfile=str(user.certificate),
                ssl_keyfile=str(user.key),
            )
        else:
            settings.update(
                security_protocol="SASL_SSL",
                sasl_mechanism=user.mechanism,
                sasl_plain_username=user.name,
                sasl_plain_password=user.password,
            )
        return settings

    def java_settings(self, user: KafkaUser) -> dict[str, str]:
        """Properties of Kafka's Java clients for ``user``, ``bootstrap.servers`` included;
        Spark's Kafka source and sink take them prefixed with ``kafka.``."""
        settings = {
            "bootstrap.servers": self.address(self._listener_of(user)),
            "ssl.truststore.type": "PEM",
            "ssl.truststore.location": str(self.ca_path),
            "ssl.endpoint.identification.algorithm": "https",
        }
        if user.mechanism == TLS:
            settings.update(
                {
                    "security.protocol": "SSL",
                    "ssl.keystore.type": "PEM",
                    "ssl.keystore.location": str(self.ca.files(user.name).keystore),
                }
            )
        else:
            settings.update(
                {
                    "security.protocol": "SASL_SSL",
                    "sasl.mechanism": user.mechanism,
                    "sasl.jaas.config": f'{_JAAS[user.mechanism]} required username="{user.name}" '
                    f'password="{user.password}";',
                }
            )
        return settings

    def _security_settings(self, user: KafkaUser) -> dict[str, SettingValue]:
        settings: dict[str, SettingValue] = {
            "ssl.ca.location": str(self.ca_path),
            "ssl.endpoint.identification.algorithm": "https",
        }
        if user.mechanism == TLS:
            settings.update(
                {
                    "security.protocol": "SSL",
                    "ssl.certificate.location": str(user.certificate),
                    "ssl.key.location": str(user.key),
                }
            )
        else:
            if user.password is None:
                raise TestbedError(f"{user.mechanism} user {user.name} has no password")
            settings.update(
                {
                    "security.protocol": "SASL_SSL",
                    "sasl.mechanism": user.mechanism,
                    "sasl.username": user.name,
                    "sasl.password": user.password,
                }
            )
        return settings

    @staticmethod
    def _listener_of(user: KafkaUser) -> str:
        return MTLS_LISTENER if user.mechanism == TLS else SASL_LISTENER

    # ---- ACLs -----------------------------------------------------------------------------------

    def allow(
        self,
        principal: str,
        resource_type: str,
        resource_name: str,
        operations: Iterable[str],
        prefixed: bool = False,
        timeout: float = 30.0,
    ) -> None:
        """Allow ``principal`` (``User:<name>``) ``operations`` (``"WRITE"``, ...) on a resource
        (``"TOPIC"``, ``"GROUP"``, ``"TRANSACTIONAL_ID"``, ``"BROKER"`` for the cluster), as the
        super user; returns once the broker enforces them."""
        from confluent_kafka.admin import (
            AclBinding,
            AclOperation,
            AclPermissionType,
            ResourcePatternType,
            ResourceType,
        )

        pattern = ResourcePatternType.PREFIXED if prefixed else ResourcePatternType.LITERAL
        bindings = [
            AclBinding(
                ResourceType[resource_type.upper()],
                resource_name,
                pattern,
                principal,
                "*",
                AclOperation[operation.upper()],
                AclPermissionType.ALLOW,
            )
            for operation in operations
        ]
        self.create_acls(bindings, timeout)

    def create_acls(self, bindings: list[Any], timeout: float = 30.0) -> None:
        """Create ``confluent_kafka.admin.AclBinding``s as the super user; returns once the
        broker's authorizer lists them."""
        from confluent_kafka.admin import AclBindingFilter

        admin = self._admin()
        for future in admin.create_acls(bindings, request_timeout=timeout).values():
            future.result(timeout=timeout)

        def enforced(binding: Any) -> bool:
            pattern = AclBindingFilter(
                binding.restype,
                binding.name,
                binding.resource_pattern_type,
                binding.principal,
                binding.host,
                binding.operation,
                binding.permission_type,
            )
            return binding in admin.describe_acls(pattern, request_timeout=5).result(timeout=10)

        wait_for(
            lambda: all(enforced(b) for b in bindings) or None,
            timeout,
            f"{len(bindings)} ACLs to be enforced",
        )

    def _admin(self) -> Any:
        return admin_client(self.bootstrap, self.setup_settings())


def _password(value: str) -> str:
    """A password the broker's settings and JAAS can hold without quoting."""
    if not _SIMPLE.match(value):
        raise TestbedError("test bed passwords are [A-Za-z0-9._-]+")
    return value


def _user_name(value: str) -> str:
    """A user name that is simple and is not one of the two super users."""
    if value in (ADMIN, BROKER):
        raise TestbedError(f"{value!r} is the test bed's own super user")
    if not _SIMPLE.match(value):
        raise TestbedError(f"test bed user names are [A-Za-z0-9._-]+; got {value!r}")
    return value
