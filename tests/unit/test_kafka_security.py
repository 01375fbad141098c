"""One identity for both Kafka clients: Spark's JAAS line translated, the driver's client given
what the tasks get, and every setting it could not honour refused by name, never by value."""

from __future__ import annotations

import argparse
import base64
import datetime
import json
import logging
import ssl
import stat
import threading
import traceback
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path
from typing import Any, ClassVar
from urllib.parse import parse_qs

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.serialization import BestAvailableEncryption, pkcs12
from cryptography.x509.oid import NameOID

from kafka_txn_sink.cli.common import CliError, kafka_settings
from kafka_txn_sink.errors import ConfigError, KafkaUnavailableError
from kafka_txn_sink.kafka.oauth import ClientCredentialsTokenProvider
from kafka_txn_sink.kafka.security import check_driver_support, driver_settings, translate_jaas
from kafka_txn_sink.kafka.txn_admin import admin_settings
from kafka_txn_sink.options import parse_options

SECRET = 'pa"ss w0rd;'
PLAIN = (
    "org.apache.kafka.common.security.plain.PlainLoginModule required "
    'username="alice" password="pa\\"ss w0rd;";'
)


# -- Spark's sasl.jaas.config ------------------------------------------------------------------


def test_a_plain_jaas_line_becomes_librdkafka_credentials() -> None:
    settings = translate_jaas({"sasl.jaas.config": PLAIN, "security.protocol": "SASL_SSL"})

    assert settings == {
        "security.protocol": "SASL_SSL",
        "sasl.mechanism": "PLAIN",
        "sasl.username": "alice",
        "sasl.password": SECRET,
    }


def test_the_shaded_scram_module_of_databricks_is_read_too() -> None:
    line = (
        "kafkashaded.org.apache.kafka.common.security.scram.ScramLoginModule required\n"
        "  username=bob password='x' ;"
    ).replace("'x'", '"s3cret"')

    settings = translate_jaas({"sasl.mechanism": "SCRAM-SHA-512", "sasl.jaas.config": line})

    assert settings["sasl.username"] == "bob" and settings["sasl.password"] == "s3cret"
    assert settings["sasl.mechanism"] == "SCRAM-SHA-512"


@pytest.mark.parametrize(
    ("settings", "expected"),
    [
        ({"sasl.jaas.config": PLAIN.replace("PlainLoginModule", "ScramLoginModule").replace(
            ".plain.", ".scram.")}, "set kafka.sasl.mechanism to SCRAM-SHA-256 or SCRAM-SHA-512"),
        ({"sasl.jaas.config": PLAIN, "sasl.mechanism": "SCRAM-SHA-256"},
         "uses the Plain login module but kafka.sasl.mechanism is SCRAM-SHA-256"),
        ({"sasl.jaas.config": PLAIN, "sasl.password": SECRET}, "both give credentials"),
        ({"sasl.jaas.config": PLAIN.replace("plain.PlainLoginModule", "oauthbearer.Other")},
         "login module org.apache.kafka.common.security.oauthbearer.Other is not supported"),
        ({"sasl.jaas.config": PLAIN.replace('username="alice" ', "")}, "no username"),
        ({"sasl.jaas.config": PLAIN.replace('password="', 'password=("')},
         "cannot read its options"),
    ],
)
def test_a_jaas_line_that_cannot_be_used_is_refused_without_its_secret(
    settings: dict[str, str], expected: str
) -> None:
    with pytest.raises(ConfigError, match=r"kafka\.sasl") as caught:
        translate_jaas(settings)

    assert expected in str(caught.value)
    assert "w0rd" not in str(caught.value)


def test_the_sink_options_carry_the_translated_credentials_to_the_tasks() -> None:
    options = parse_options({
        "kafka.bootstrap.servers": "b:9092", "topic": "t", "sinkId": "s", "commitLog": "/tmp/l",
        "kafka.security.protocol": "SASL_PLAINTEXT", "kafka.sasl.jaas.config": PLAIN,
        "transactionTimeoutMs": "60000",
    })  # fmt: skip

    config = options.producer_config("s-0")
    assert config["sasl.username"] == "alice" and config["sasl.password"] == SECRET
    assert "sasl.jaas.config" not in config
    assert SECRET not in repr(options)


# -- what the driver's client can honour -------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "value", "expected"),
    [
        ("ssl.truststore.location", "/t.jks", "Java client setting: give the CA certificate"),
        ("ssl.keystore.type", "JKS", "Java client setting"),
        ("sasl.kerberos.keytab", "/k", "ticket cache"),
        ("ssl.engine.location", "/e.so", "kafka-python, which completes the transactions"),
        ("sasl.mechanism", "AWS_MSK_IAM", "needs kafka.security.protocol=SASL_SSL"),
        ("sasl.mechanism", "OAUTHBEARER", "needs kafka.sasl.oauthbearer.method=oidc"),
        ("ssl.endpoint.identification.algorithm", "", "must be https or none"),
    ],
)
def test_a_setting_the_driver_cannot_honour_is_refused_by_name(
    name: str, value: str, expected: str
) -> None:
    with pytest.raises(ConfigError, match=f"option kafka.{name}") as caught:
        check_driver_support({name: value})

    assert expected in str(caught.value)


def test_the_driver_client_gets_the_tasks_identity() -> None:
    kafka = {
        "security.protocol": "sasl_ssl", "sasl.mechanisms": "SCRAM-SHA-512",
        "sasl.username": "alice", "sasl.password": SECRET, "ssl.ca.location": "/ca.pem",
        "ssl.certificate.location": "/c.pem", "ssl.key.location": "/k.pem",
        "ssl.key.password": "kp", "ssl.endpoint.identification.algorithm": "none",
        "sasl.kerberos.service.name": "kafka", "linger.ms": "5",
    }  # fmt: skip
    check_driver_support(kafka)

    settings = admin_settings("b:9093", kafka, 5000)

    assert {k: v for k, v in settings.items() if k.startswith(("ssl", "sasl", "security"))} == {
        "security_protocol": "SASL_SSL", "sasl_mechanism": "SCRAM-SHA-512",
        "sasl_plain_username": "alice", "sasl_plain_password": SECRET,
        "ssl_cafile": "/ca.pem", "ssl_certfile": "/c.pem", "ssl_keyfile": "/k.pem",
        "ssl_password": "kp", "ssl_check_hostname": False, "sasl_kerberos_service_name": "kafka",
    }  # fmt: skip


def self_signed() -> tuple[Any, x509.Certificate]:
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "client")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (
        x509.CertificateBuilder().subject_name(name).issuer_name(name)
        .public_key(key.public_key()).serial_number(1)
        .not_valid_before(now).not_valid_after(now + datetime.timedelta(days=1))
        .sign(key, hashes.SHA256())
    )  # fmt: skip
    return key, cert


def test_inline_pem_and_pkcs12_reach_the_driver_as_private_files(tmp_path: Path) -> None:
    key, cert = self_signed()
    keystore = tmp_path / "client.p12"
    keystore.write_bytes(pkcs12.serialize_key_and_certificates(
        b"client", key, cert, None, BestAvailableEncryption(b"store-pw")))  # fmt: skip
    kafka = {
        "ssl.ca.pem": "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n",
        "ssl.keystore.location": str(keystore), "ssl.keystore.password": "store-pw",
    }  # fmt: skip
    check_driver_support(kafka)

    settings = driver_settings(kafka)

    assert Path(settings["ssl_cafile"]).read_text() == kafka["ssl.ca.pem"]
    for name in ("ssl_cafile", "ssl_certfile", "ssl_keyfile"):
        assert stat.S_IMODE(Path(settings[name]).stat().st_mode) == 0o600, name
    assert b"ENCRYPTED PRIVATE KEY" in Path(settings["ssl_keyfile"]).read_bytes()
    # What kafka-python does with them: the chain and the key load with the password.
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.load_cert_chain(settings["ssl_certfile"], settings["ssl_keyfile"], "store-pw")


def test_a_keystore_with_a_wrong_password_is_refused_without_it(tmp_path: Path) -> None:
    key, cert = self_signed()
    keystore = tmp_path / "client.p12"
    keystore.write_bytes(pkcs12.serialize_key_and_certificates(
        b"client", key, cert, None, BestAvailableEncryption(b"store-pw")))  # fmt: skip

    with pytest.raises(ConfigError, match=r"kafka\.ssl\.keystore\.location") as caught:
        driver_settings({"ssl.keystore.location": str(keystore), "ssl.keystore.password": "no!"})

    assert "no!" not in str(caught.value)


# -- OAUTHBEARER: the client-credentials grant --------------------------------------------------


class TokenEndpoint(BaseHTTPRequestHandler):
    requests: ClassVar[list[tuple[str, dict[str, list[str]]]]] = []
    status = 200
    location = ""
    token = "tok-1"
    expires_in: object = 3600

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"])).decode()
        TokenEndpoint.requests.append((self.headers["Authorization"], parse_qs(body)))
        answer = {"access_token": TokenEndpoint.token, "expires_in": TokenEndpoint.expires_in}
        payload = json.dumps(answer).encode()
        self.send_response(self.status)
        if self.location:
            self.send_header("Location", self.location)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def token_endpoint() -> Iterator[str]:
    TokenEndpoint.requests, TokenEndpoint.status, TokenEndpoint.location = [], 200, ""
    TokenEndpoint.token, TokenEndpoint.expires_in = "tok-1", 3600
    server = HTTPServer(("127.0.0.1", 0), TokenEndpoint)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_port}/token"
    server.shutdown()
    thread.join(timeout=10)


def oidc(endpoint: str) -> dict[str, str]:
    return {
        "sasl.mechanism": "OAUTHBEARER", "sasl.oauthbearer.method": "oidc",
        "sasl.oauthbearer.client.id": "sink", "sasl.oauthbearer.client.secret": "oauth-secret",
        "sasl.oauthbearer.token.endpoint.url": endpoint, "sasl.oauthbearer.scope": "kafka",
        "sasl.oauthbearer.extensions": "logicalCluster=lkc-1,identityPoolId=pool-2",
    }  # fmt: skip


def test_the_driver_fetches_an_oauth_token_once_and_reuses_it(token_endpoint: str) -> None:
    kafka = oidc(token_endpoint)
    check_driver_support(kafka)
    provider = driver_settings(kafka)["sasl_oauth_token_provider"]

    assert [provider.token(), provider.token()] == ["tok-1", "tok-1"]
    assert provider.extensions() == {"logicalCluster": "lkc-1", "identityPoolId": "pool-2"}
    [(authorization, form)] = TokenEndpoint.requests
    assert authorization == "Basic " + base64.b64encode(b"sink:oauth-secret").decode()
    assert form == {"grant_type": ["client_credentials"], "scope": ["kafka"]}


def test_a_refused_token_request_says_so_without_the_secret(token_endpoint: str) -> None:
    TokenEndpoint.status = 401
    provider = ClientCredentialsTokenProvider.from_settings(oidc(token_endpoint))

    with pytest.raises(KafkaUnavailableError, match="no token from") as caught:
        provider.token()

    assert "401" in str(caught.value) and "oauth-secret" not in str(caught.value)


@pytest.mark.parametrize(
    "url", ["http://idp.example.com/token", "http://10.0.0.5/token", "ftp://idp/token", "idp"]
)
def test_a_token_endpoint_that_is_not_https_is_refused(url: str) -> None:
    kafka = oidc(url)
    with pytest.raises(ConfigError, match=r"kafka\.sasl\.oauthbearer\.token\.endpoint\.url"):
        check_driver_support(kafka)
    with pytest.raises(ConfigError, match="https://") as caught:
        ClientCredentialsTokenProvider.from_settings(kafka)
    assert "oauth-secret" not in str(caught.value)


class RedirectTarget(BaseHTTPRequestHandler):
    """Where a redirecting token endpoint points: records whatever reaches it."""

    seen: ClassVar[list[str | None]] = []

    def do_GET(self) -> None:
        RedirectTarget.seen.append(self.headers["Authorization"])
        self.send_response(404)
        self.end_headers()

    do_POST = do_GET

    def log_message(self, *args: object) -> None:
        pass


def test_credentials_never_follow_a_redirect(token_endpoint: str) -> None:
    target = HTTPServer(("127.0.0.1", 0), RedirectTarget)
    thread = threading.Thread(target=target.serve_forever, daemon=True)
    thread.start()
    RedirectTarget.seen = []
    TokenEndpoint.status, TokenEndpoint.location = 302, f"http://127.0.0.1:{target.server_port}/"
    provider = ClientCredentialsTokenProvider.from_settings(oidc(token_endpoint))
    try:
        with pytest.raises(ConfigError, match="redirect") as caught:
            provider.token()
    finally:
        target.shutdown()
        thread.join(timeout=10)
    assert RedirectTarget.seen == []  # neither the request nor the credentials went on
    assert "token.endpoint.url" in str(caught.value) and "oauth-secret" not in str(caught.value)


def test_oidc_without_its_client_settings_names_them() -> None:
    with pytest.raises(ConfigError, match=r"kafka\.sasl\.oauthbearer\.client\.secret"):
        ClientCredentialsTokenProvider.from_settings({"sasl.oauthbearer.client.id": "x"})


# -- the command line: a file, the environment, argv --------------------------------------------


def test_the_cli_reads_credentials_from_a_file_and_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = tmp_path / "client.properties"
    config.write_text(
        "# the sink's user\nsecurity.protocol=SASL_SSL\nsasl.mechanism=SCRAM-SHA-512\n"
        "sasl.username=from-file\nsasl.password=file-secret\n"
    )
    monkeypatch.setenv("KAFKA_TXN_SINK_KAFKA_SASL_PASSWORD", "env-secret")
    args = argparse.Namespace(kafka_config=str(config), kafka=["sasl.username=from-argv"])

    settings = kafka_settings(args)

    assert settings == {
        "security.protocol": "SASL_SSL", "sasl.mechanism": "SCRAM-SHA-512",
        "sasl.username": "from-argv", "sasl.password": "env-secret",
    }  # fmt: skip


def test_the_cli_refuses_a_java_setting_by_name(tmp_path: Path) -> None:
    args = argparse.Namespace(kafka_config=None, kafka=["ssl.truststore.password=changeit"])

    with pytest.raises(CliError, match=r"Kafka setting ssl\.truststore\.password") as caught:
        kafka_settings(args)

    assert "changeit" not in str(caught.value)


# -- secrets that reach the driver's client: the access token, an inline key --------------------


def test_each_oauth_token_fetched_is_masked_in_kafka_pythons_debug_log(
    token_endpoint: str, caplog: pytest.LogCaptureFixture
) -> None:
    """kafka-python logs each request at DEBUG, SaslAuthenticate's bytes (the token) included."""
    from kafka.net.sasl.oauth import SaslMechanismOAuth
    from kafka.protocol.sasl import SaslAuthenticateRequest

    TokenEndpoint.token = "eyJ-access-5c2e91"
    provider = ClientCredentialsTokenProvider.from_settings(oidc(token_endpoint))
    request = SaslAuthenticateRequest(
        SaslMechanismOAuth(sasl_oauth_token_provider=provider).auth_bytes()
    )
    with caplog.at_level(logging.DEBUG, logger="kafka"):
        logging.getLogger("kafka.net.connection").debug("%s Request %d: %s", "<conn>", 7, request)

    [record] = [r for r in caplog.records if r.name == "kafka.net.connection"]
    assert "SaslAuthenticate" in record.getMessage() and "***" in record.getMessage()
    assert "eyJ-access-5c2e91" not in caplog.text


def private_key_pem() -> str:
    from cryptography.hazmat.primitives.serialization import Encoding, NoEncryption, PrivateFormat

    key = ec.generate_private_key(ec.SECP256R1())
    return key.private_bytes(Encoding.PEM, PrivateFormat.PKCS8, NoEncryption()).decode()


SINK = {"kafka.bootstrap.servers": "b:9093", "topic": "t", "sinkId": "s", "commitLog": "/tmp/l"}


@pytest.mark.parametrize("prefix", ["kafka.", "consumerGroup.kafka."])
def test_an_inline_private_key_is_taken_with_a_warning_and_never_shown(
    prefix: str, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Spark's plans show `ssl.key.pem` in clear (spark.redaction.regex does not match it), as
    they show `basic.auth.user.info`: the sink warns, naming the option, and shows it nowhere."""
    from kafka_txn_sink.kafka import security

    pem = private_key_pem()
    group = {"checkpointLocation": "/c", "consumerGroup": "g",
             "consumerGroup.kafka.bootstrap.servers": "elsewhere:9093"}  # fmt: skip
    given = {**SINK, **group, f"{prefix}security.protocol": "SSL", f"{prefix}ssl.key.pem": pem}
    monkeypatch.setattr(security, "_inline_key_warned", set(), raising=False)
    with caplog.at_level(logging.DEBUG):
        options = parse_options(given)
        parse_options(given)
        logging.getLogger("kafka.conn").debug("configuration: %r", {"ssl.key.pem": pem})
        with pytest.raises(ConfigError, match=f"option {prefix}ssl.engine.location") as caught:
            parse_options({**given, f"{prefix}ssl.engine.location": "/e.so"})

    [warning] = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert f"option {prefix}ssl.key.pem is shown in clear in Spark's query plans" in warning
    assert f"{prefix}ssl.key.location" in warning
    body = pem.splitlines()[1]  # a line of the key itself
    assert body not in caplog.text and body not in repr(options)
    assert body not in "".join(traceback.format_exception(caught.value))


# -- the consumer group's cluster: kafka-python reads its offsets --------------------------------


@pytest.mark.parametrize(
    ("name", "value", "expected"),
    [
        ("sasl.kerberos.keytab", "/k", "ticket cache"),
        ("sasl.kerberos.principal", "sink@REALM", "ticket cache"),
        ("sasl.oauthbearer.config", "principal=sink", "use consumerGroup.kafka.sasl.oauthbearer"),
        ("enable.ssl.certificate.verification", "false", "always verifies"),
        ("ssl.truststore.location", "/t.jks", "consumerGroup.kafka.ssl.ca.location"),
        ("ssl.engine.location", "/e.so", "kafka-python, which completes the transactions"),
        ("sasl.mechanism", "OAUTHBEARER", "needs consumerGroup.kafka.sasl.oauthbearer.method"),
        ("sasl.oauthbearer.token.endpoint.url", "http://idp.example.com/t", "must be an https"),
    ],
)
def test_a_group_cluster_setting_the_driver_cannot_honour_is_refused_by_name(
    name: str, value: str, expected: str
) -> None:
    given = {**SINK, "checkpointLocation": "/c", "consumerGroup": "g",
             "consumerGroup.kafka.bootstrap.servers": "elsewhere:9093",
             f"consumerGroup.kafka.{name}": value}  # fmt: skip

    with pytest.raises(ConfigError, match=f"option consumerGroup.kafka.{name}") as caught:
        parse_options(given)

    assert expected in str(caught.value)


def test_the_group_clusters_settings_the_driver_honours_are_kept() -> None:
    options = parse_options({
        **SINK, "checkpointLocation": "/c", "consumerGroup": "g",
        "consumerGroup.kafka.bootstrap.servers": "elsewhere:9093",
        "consumerGroup.kafka.security.protocol": "SASL_SSL",
        "consumerGroup.kafka.sasl.jaas.config": PLAIN,
        "consumerGroup.kafka.enable.ssl.certificate.verification": "true",
    })  # fmt: skip

    assert options.progress is not None
    assert options.progress.kafka == {
        "security.protocol": "SASL_SSL", "sasl.mechanism": "PLAIN", "sasl.username": "alice",
        "sasl.password": SECRET, "enable.ssl.certificate.verification": "true",
    }  # fmt: skip


# -- OAuth client conformance (RFC 6749) ---------------------------------------------------------


def test_the_client_id_and_secret_are_form_urlencoded_before_basic_auth(
    token_endpoint: str,
) -> None:
    """RFC 6749 section 2.3.1: each is form-urlencoded, then joined by ':' for Basic auth."""
    settings = {**oidc(token_endpoint), "sasl.oauthbearer.client.id": "sink:1",
                "sasl.oauthbearer.client.secret": "pa ss:%é+"}  # fmt: skip

    ClientCredentialsTokenProvider.from_settings(settings).token()

    [(authorization, _)] = TokenEndpoint.requests
    credentials = base64.b64decode(authorization.removeprefix("Basic "))
    assert credentials == b"sink%3A1:pa+ss%3A%25%C3%A9%2B"


@pytest.mark.parametrize("expires_in", ["an hour", "nan", [3600], True, -5, 0])
def test_an_expires_in_that_is_not_a_number_of_seconds_is_a_token_error(
    token_endpoint: str, expires_in: object
) -> None:
    TokenEndpoint.expires_in = expires_in
    provider = ClientCredentialsTokenProvider.from_settings(oidc(token_endpoint))

    with pytest.raises(KafkaUnavailableError, match="expires_in") as caught:
        provider.token()

    assert "OAUTHBEARER" in str(caught.value) and "tok-1" not in str(caught.value)


@pytest.mark.parametrize(("expires_in", "lifetime"), [(None, 300), ("120", 120), (3600.5, 3600.5)])
def test_an_expires_in_absent_or_numeric_sets_the_tokens_lifetime(
    token_endpoint: str, expires_in: object, lifetime: float
) -> None:
    TokenEndpoint.expires_in = expires_in
    provider = ClientCredentialsTokenProvider.from_settings(oidc(token_endpoint))

    assert provider._fetch() == ("tok-1", lifetime)


def test_msk_iam_below_confluent_kafka_2_13_is_refused_by_name(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from kafka_txn_sink.kafka import client_versions

    real = client_versions.installed_version
    monkeypatch.setattr(
        client_versions,
        "installed_version",
        lambda name: "2.12.1" if name == "confluent-kafka" else real(name),
    )

    with pytest.raises(ConfigError, match=r"needs confluent-kafka>=2\.13 \(installed: 2\.12\.1\)"):
        check_driver_support({"security.protocol": "SASL_SSL", "sasl.mechanism": "AWS_MSK_IAM"})
