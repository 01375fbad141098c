"""A gateway in front of the test bed's real Schema Registry that wants what a secured one does.

The test bed's Apicurio Registry serves plain HTTP with no auth. `RegistryGateway` is a loopback
forwarding server (tests/s3_proxy.py) in front of it that refuses, with 401, each request
without the headers it requires (a bearer token and its logical cluster, or basic auth), and
serves HTTPS with a certificate of the test bed's CA when given a TLS context (asking for the
client's certificate too, for mutual TLS). Every request it accepts reaches the real registry.

    certificates = issue_certificates(tmp_path)
    with RegistryGateway(registry, bearer_headers("tok"), certificates.server_tls()) as gateway:
        settings = {"url": gateway.url, "ssl.ca.location": str(certificates.ca),
                    **bearer_settings("tok")}
"""

from __future__ import annotations

import ssl
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from kafka_txn_sink.testing.certificates import CertificateAuthority, IssuedCertificate
from kafka_txn_sink.testing.schema_registry import CCOMPAT_PATH, SchemaRegistry
from tests.s3_proxy import HeaderDroppingProxy

# What Confluent Cloud calls the registry's logical cluster: confluent-kafka's client sends it
# (header target-sr-cluster) with every bearer token, and wants it set.
LOGICAL_CLUSTER = "lsrc-test1"
_REFUSAL = b'{"error_code": 40101, "message": "Unauthorized"}'


def bearer_headers(token: str) -> dict[str, str]:
    """The headers a request with a static bearer token `token` must carry."""
    return {"Authorization": f"Bearer {token}", "target-sr-cluster": LOGICAL_CLUSTER}


def bearer_settings(token: str) -> dict[str, str]:
    """confluent-kafka's registry client settings of a static bearer token (no prefix)."""
    return {
        "bearer.auth.credentials.source": "STATIC_TOKEN",
        "bearer.auth.token": token,
        "bearer.auth.logical.cluster": LOGICAL_CLUSTER,
    }


def sink_options(settings: Mapping[str, str]) -> dict[str, str]:
    """Registry client settings as the sink's options: prefixed `schema.registry.`."""
    return {f"schema.registry.{k}": v for k, v in settings.items()}


@dataclass(frozen=True)
class GatewayCertificates:
    """The test CA's certificate, the gateway's server certificate and a client's."""

    ca: Path  # the trust store of the registry's clients: ssl.ca.location
    server: IssuedCertificate  # for 127.0.0.1 and localhost
    client: IssuedCertificate  # CN=sink, for mutual TLS

    def server_tls(self, mutual: bool = False) -> ssl.SSLContext:
        """The gateway's TLS: its certificate; with `mutual`, a client certificate of the CA is
        required too."""
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(self.server.certificate, self.server.key)
        if mutual:
            context.verify_mode = ssl.CERT_REQUIRED
            context.load_verify_locations(cafile=self.ca)
        return context


def issue_certificates(directory: Path) -> GatewayCertificates:
    """A new CA in `directory`, and the gateway's and a client's certificates it signed."""
    authority = CertificateAuthority(directory)
    server = authority.issue("registry", server=True)
    return GatewayCertificates(authority.ca_path, server, authority.issue("sink"))


class RegistryGateway(HeaderDroppingProxy):
    """The registry behind a gateway that answers 401 to a request without each of the
    `required` headers (values compared exactly), and serves HTTPS when given `tls`. Accepted
    requests go to the registry without their `Authorization` (it has no auth)."""

    def __init__(
        self,
        registry: SchemaRegistry,
        required: Mapping[str, str],
        tls: ssl.SSLContext | None = None,
    ) -> None:
        super().__init__(registry.base_url, drop=("Authorization",), tls=tls)
        self.required = {k.lower(): v for k, v in required.items()}
        self.refused = 0

    def __enter__(self) -> RegistryGateway:
        self.start()
        return self

    @property
    def url(self) -> str:
        """The gateway's address of the Confluent-compatible API: schema.registry.url."""
        return self.endpoint + CCOMPAT_PATH

    def forward(
        self, method: str, path: str, headers: list[tuple[str, str]], body: bytes
    ) -> tuple[int, str, list[tuple[str, str]], bytes]:
        given = {k.lower(): v for k, v in headers}
        if any(given.get(name) != value for name, value in self.required.items()):
            with self._lock:
                self.refused += 1
            return 401, "Unauthorized", [("Content-Type", "application/json")], _REFUSAL
        return super().forward(method, path, headers, body)
