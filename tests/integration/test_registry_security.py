"""The driver's resolution of schema ids against a secured Schema Registry: a static bearer
token, HTTPS with the test bed's CA, and mutual TLS, each through a gateway in front of the test
bed's real registry (tests/registry_gateway.py: it wants the token, serves TLS, and forwards
every request it accepts to the real Apicurio Registry). A refusal is the user's error naming the
subject and the registry, and never shows the token, in the message, its repr, its traceback or
any log record.

confluent_kafka.schema_registry is imported in the tests, not at collection (see
test_schema_registry_bed.py: the oldest clients' tier collects this directory).
"""

from __future__ import annotations

import logging
import traceback
from pathlib import Path

import pytest
from pyspark.sql.types import StringType, StructField, StructType

from kafka_txn_sink import testing
from kafka_txn_sink.errors import ConfigError, SchemaRegistryError
from kafka_txn_sink.options import SinkOptions, parse_options
from kafka_txn_sink.serde.resolve import Encodings, resolve
from tests.integration.test_registry_formats import INPUT, serde
from tests.registry_gateway import (
    GatewayCertificates,
    RegistryGateway,
    bearer_headers,
    bearer_settings,
    issue_certificates,
    sink_options,
)

pytestmark = pytest.mark.registry

TOKEN = "tok-5e1f-right-bearer"
WRONG_TOKEN = "tok-9a7c-wrong-bearer"
DIGITS_TOKEN = "2026112703595917"  # an opaque token may be digits only: still text
KEY_PASSWORD = "20261127"  # digits only too
FAST = {"schema.registry.timeout": "5", "schema.registry.max.retries": "0"}  # no retry waits


@pytest.fixture(scope="module")
def certificates(tmp_path_factory: pytest.TempPathFactory) -> GatewayCertificates:
    return issue_certificates(tmp_path_factory.mktemp("registry_tls"))


def registered_id(registry: testing.SchemaRegistry, subject: str) -> int:
    """The id of `subject`'s latest version, asked of the registry itself (no gateway)."""
    from confluent_kafka.schema_registry import SchemaRegistryClient

    return int(SchemaRegistryClient({"url": registry.url}).get_latest_version(subject).schema_id)


def value_id(resolved: Encodings | None) -> int:
    assert resolved is not None and resolved.value is not None
    return resolved.value.schema_id


def shown(error: BaseException) -> str:
    """Everything a user may see of `error`: its message, its repr, its formatted traceback."""
    return "\n".join([str(error), repr(error), "".join(traceback.format_exception(error))])


# -- bearer tokens --------------------------------------------------------------------------


@pytest.mark.parametrize("token", [TOKEN, DIGITS_TOKEN], ids=["text", "digits-only"])
def test_a_static_bearer_token_reaches_the_registry(
    schema_registry: testing.SchemaRegistry, topic: str, token: str
) -> None:
    with RegistryGateway(schema_registry, bearer_headers(token)) as gateway:
        options = sink_options(bearer_settings(token))
        resolved = resolve(serde(gateway.url, **options), INPUT, topic)

    assert value_id(resolved) == registered_id(schema_registry, f"{topic}-value")
    assert gateway.requests >= 1 and gateway.refused == 0


def test_a_wrong_bearer_token_is_refused_naming_the_subject_and_the_registry_and_no_token(
    schema_registry: testing.SchemaRegistry, topic: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)  # confluent-kafka's, httpx's and httpcore's records too
    with RegistryGateway(schema_registry, bearer_headers(TOKEN)) as gateway:
        options = sink_options(bearer_settings(WRONG_TOKEN))
        with pytest.raises(SchemaRegistryError) as caught:
            resolve(serde(gateway.url, **options), INPUT, topic)
    # What a library logging its request headers would log: masked like basic auth's password.
    logging.getLogger("kafka_txn_sink.tests").debug("Authorization: Bearer %s", WRONG_TOKEN)

    message = str(caught.value)
    assert message.startswith(
        f"subject '{topic}-value': the Schema Registry {gateway.url} refused: "
    )
    assert "(HTTP 401, error code 40101)" in message and "nothing was written" in message
    assert (gateway.refused, gateway.requests) == (1, 0)  # no retry; nothing reached the registry
    # The token is masked in any record that carries it (httpcore logs the request's headers
    # only on some connections: a record of our own shows the mask is in place).
    logging.getLogger("tests.registry").warning("header Authorization: Bearer %s", WRONG_TOKEN)
    assert "Authorization: Bearer ***" in caplog.text
    for text in (shown(caught.value), caplog.text):
        assert WRONG_TOKEN not in text


def test_a_bearer_token_without_its_logical_cluster_is_refused_naming_the_setting() -> None:
    settings = bearer_settings(TOKEN)
    del settings["bearer.auth.logical.cluster"]

    with pytest.raises(ConfigError) as caught:
        resolve(serde("http://127.0.0.1:9", **sink_options(settings)), INPUT, "t")

    assert "bearer.auth.logical.cluster" in str(caught.value)
    assert TOKEN not in shown(caught.value)


# -- TLS ----------------------------------------------------------------------------------------


def test_https_with_the_registry_s_ca_and_a_bearer_token_reaches_the_registry(
    schema_registry: testing.SchemaRegistry, certificates: GatewayCertificates, topic: str
) -> None:
    tls = certificates.server_tls()
    with RegistryGateway(schema_registry, bearer_headers(TOKEN), tls) as gateway:
        options = {
            **sink_options(bearer_settings(TOKEN)),
            "schema.registry.ssl.ca.location": str(certificates.ca),
        }
        resolved = resolve(serde(gateway.url, **options), INPUT, topic)

    assert gateway.url.startswith("https://127.0.0.1:")
    assert value_id(resolved) == registered_id(schema_registry, f"{topic}-value")
    assert gateway.requests >= 1 and gateway.failed_handshakes == 0


@pytest.mark.parametrize("trust", ["default", "another CA"])
def test_https_without_the_registry_s_ca_fails_at_the_driver_naming_subject_and_registry(
    schema_registry: testing.SchemaRegistry,
    certificates: GatewayCertificates,
    topic: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    trust: str,
) -> None:
    monkeypatch.delenv("SSL_CERT_FILE", raising=False)  # default: certifi's CAs
    monkeypatch.delenv("SSL_CERT_DIR", raising=False)
    options = {**FAST, **sink_options(bearer_settings(TOKEN))}
    if trust == "another CA":
        options["schema.registry.ssl.ca.location"] = str(issue_certificates(tmp_path).ca)
    gateway = RegistryGateway(schema_registry, bearer_headers(TOKEN), certificates.server_tls())
    with gateway, pytest.raises(SchemaRegistryError) as caught:
        resolve(serde(gateway.url, **options), INPUT, topic)

    message = str(caught.value)
    assert message.startswith(
        f"subject '{topic}-value': the Schema Registry {gateway.url} did not answer: "
    )
    assert "CERTIFICATE_VERIFY_FAILED" in message
    assert TOKEN not in shown(caught.value)
    assert gateway.requests == 0 and gateway.failed_handshakes >= 1  # no request was sent


def encrypted_key(certificates: GatewayCertificates, directory: Path, password: str) -> Path:
    """The client's key, encrypted with `password` (PEM, PKCS#8)."""
    from cryptography.hazmat.primitives import serialization

    key = serialization.load_pem_private_key(certificates.client.key.read_bytes(), None)
    path = directory / "sink.encrypted.key"
    path.write_bytes(key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
        serialization.BestAvailableEncryption(password.encode())))  # fmt: skip
    return path


@pytest.mark.parametrize("key", ["plain", "encrypted"])
def test_mutual_tls_reaches_the_registry_with_the_client_certificate_only(
    schema_registry: testing.SchemaRegistry,
    certificates: GatewayCertificates,
    topic: str,
    tmp_path: Path,
    key: str,
) -> None:
    trust = {**FAST, "schema.registry.ssl.ca.location": str(certificates.ca)}
    mutual = {
        **trust,
        "schema.registry.ssl.certificate.location": str(certificates.client.certificate),
        "schema.registry.ssl.key.location": str(certificates.client.key),
    }
    if key == "encrypted":
        mutual["schema.registry.ssl.key.location"] = str(
            encrypted_key(certificates, tmp_path, KEY_PASSWORD)
        )
        mutual["schema.registry.ssl.key.password"] = KEY_PASSWORD
    with RegistryGateway(schema_registry, {}, certificates.server_tls(mutual=True)) as gateway:
        resolved = resolve(serde(gateway.url, **mutual), INPUT, topic)
        with pytest.raises(SchemaRegistryError) as caught:
            resolve(serde(gateway.url, **trust), INPUT, f"{topic}_no_certificate")

    assert value_id(resolved) == registered_id(schema_registry, f"{topic}-value")
    assert str(caught.value).startswith(
        f"subject '{topic}_no_certificate-value': the Schema Registry {gateway.url} did not "
        f"answer: "
    )
    assert gateway.failed_handshakes >= 1
    assert KEY_PASSWORD not in shown(caught.value)


def test_a_ca_file_that_does_not_exist_is_refused_naming_the_option(tmp_path: Path) -> None:
    missing = tmp_path / "no-such-ca.pem"
    options = {"schema.registry.ssl.ca.location": str(missing)}

    with pytest.raises(ConfigError) as caught:
        resolve(serde("https://127.0.0.1:9", **options), INPUT, "t")

    assert f"schema.registry.ssl.ca.location={missing}" in str(caught.value)


def test_a_key_its_password_does_not_open_is_refused_naming_the_file_not_the_password(
    certificates: GatewayCertificates, tmp_path: Path
) -> None:
    key = encrypted_key(certificates, tmp_path, KEY_PASSWORD)
    options = {
        "schema.registry.ssl.certificate.location": str(certificates.client.certificate),
        "schema.registry.ssl.key.location": str(key),
        "schema.registry.ssl.key.password": "not-the-pw-4d2a",
    }

    with pytest.raises(ConfigError) as caught:
        resolve(serde("https://127.0.0.1:9", **options), INPUT, "t")

    assert f"schema.registry.ssl.key.location={key}" in str(caught.value)
    assert "not-the-pw-4d2a" not in shown(caught.value) and KEY_PASSWORD not in shown(caught.value)


# -- a Schema Registry password inside schema.registry.url (user info) -----------------------------


def registry_options(url: str) -> SinkOptions:
    """A sink writing avro values to the registry at `url`, which nothing answers quickly."""
    return parse_options({
        "kafka.bootstrap.servers": "127.0.0.1:9", "topic": "t", "sinkId": "s",
        "commitLog": "/tmp/l", "valueFormat": "avro", "schema.registry.url": url,
        "schema.registry.max.retries": "0", "schema.registry.timeout": "2",
    })  # fmt: skip


VALUE_ONLY = StructType([StructField("value", StringType())])


def failed_resolve(options: SinkOptions) -> SchemaRegistryError:
    with pytest.raises(SchemaRegistryError) as caught:
        resolve(options.serde, VALUE_ONLY, "t")
    return caught.value


def everything_shown(
    options: SinkOptions, error: Exception, caplog: pytest.LogCaptureFixture, *logged_urls: str
) -> str:
    """The error, its formatted traceback, the log records of it and of a library logging the
    URLs as it got them, and the reprs of the options."""
    with caplog.at_level(logging.DEBUG):
        logging.getLogger("kafka_txn_sink.tests.registry").error("batch failed", exc_info=error)
        for url in logged_urls:
            logging.getLogger("httpx").debug("HTTP Request: POST %s", f"{url}/subjects/t-value")
            logging.getLogger("httpx").debug("url parts %r", url.encode())
    records = [r.getMessage() for r in caplog.records]
    traceback_text = "".join(traceback.format_exception(error))
    shown = [str(error), traceback_text, caplog.text, *records, repr(options.serde),
             repr(options)]  # fmt: skip
    return "\n".join(shown)


def test_a_registry_password_in_its_url_reaches_no_error_log_traceback_or_repr(
    caplog: pytest.LogCaptureFixture,
) -> None:
    url = "http://alice:Hunter2pw@127.0.0.1:9/"
    options = registry_options(url)

    error = failed_resolve(options)

    assert str(error).startswith("subject 't-value': the Schema Registry http://***@127.0.0.1:9/")
    assert "did not answer" in str(error)
    assert "Hunter2pw" not in everything_shown(options, error, caplog, url)


def test_every_url_of_a_registry_list_keeps_its_user_info_out(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The client takes comma-separated URLs; a password may be percent-encoded in one."""
    first, second = "http://alice:Hunter3pw@127.0.0.1:9", "https://bob:p%40ss-Word7@127.0.0.1:10/"
    options = registry_options(f"{first},{second}")

    error = failed_resolve(options)

    shown = everything_shown(options, error, caplog, first, second, "https://bob:p@ss-Word7@h")
    assert "127.0.0.1:9" in str(error)
    for secret in ("Hunter3pw", "p%40ss-Word7", "p@ss-Word7"):
        assert secret not in shown, secret
    assert "http://***@127.0.0.1:9" in repr(options.serde)
    assert "https://***@127.0.0.1:10/" in repr(options.serde)
