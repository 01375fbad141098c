"""How the sink's two Kafka clients authenticate: one set of settings, checked once, for both.

Users give librdkafka's settings (`kafka.sasl.username`, `kafka.ssl.ca.location`, ...), which the
tasks' producers take as they are, or Spark's `kafka.sasl.jaas.config` from a job that used
`format("kafka")`, which `translate_jaas` turns into librdkafka's (`client_settings` does
both checks and masks the secrets in the logs). The driver's client is
kafka-python (its EndTxn client): `driver_settings` gives it the same identity, and
`check_driver_support` refuses, by name, any security setting it could not honour, so that
the driver never connects as somebody else, or not at all, after the tasks succeeded.

Values are never put in an error message: they may be secrets. The same holds for the consumer
group's cluster (`consumerGroup.kafka.*`), whose offsets the driver reads with kafka-python:
its messages name the options by that prefix (`prefix`).
"""

from __future__ import annotations

import atexit
import logging
import os
import re
import shutil
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from kafka_txn_sink.errors import ConfigError
from kafka_txn_sink.extras import require
from kafka_txn_sink.kafka import msk_iam
from kafka_txn_sink.redaction import mask_in_logs

JAAS = "sasl.jaas.config"
KAFKA_PREFIX = "kafka."
log = logging.getLogger(__name__)

_LOGIN_MODULES = {
    # Spark's Kafka connector on Databricks shades the client under `kafkashaded.`.
    "org.apache.kafka.common.security.plain.PlainLoginModule": "PLAIN",
    "org.apache.kafka.common.security.scram.ScramLoginModule": "SCRAM",
}
_JAAS_HEAD = re.compile(
    r"^\s*(?:kafkashaded\.)?(?P<module>[\w.$]+)\s+(?P<flag>\w+)\s*(?P<rest>.*)$", re.DOTALL
)
_JAAS_PAIR = re.compile(
    r'\s*(?P<key>[\w.]+)\s*=\s*(?:"(?P<quoted>(?:[^"\\]|\\.)*)"|(?P<bare>[^\s;"]+))'
)

SASL_MECHANISMS = (
    "PLAIN",
    "SCRAM-SHA-256",
    "SCRAM-SHA-512",
    "GSSAPI",
    "OAUTHBEARER",
    msk_iam.MECHANISM,
)
"""The SASL mechanisms both clients speak."""

# librdkafka setting -> kafka-python setting, passed as they are.
_DIRECT = {
    "security.protocol": "security_protocol",
    "sasl.mechanism": "sasl_mechanism",
    "sasl.mechanisms": "sasl_mechanism",
    "sasl.username": "sasl_plain_username",
    "sasl.password": "sasl_plain_password",
    "sasl.kerberos.service.name": "sasl_kerberos_service_name",
    "ssl.ca.location": "ssl_cafile",
    "ssl.certificate.location": "ssl_certfile",
    "ssl.key.location": "ssl_keyfile",
    "ssl.key.password": "ssl_password",
    "ssl.crl.location": "ssl_crlfile",
}
# librdkafka settings of PEM text: the driver's client reads files, so they are written to one.
_INLINE_PEM = {
    "ssl.ca.pem": "ssl_cafile",
    "ssl.certificate.pem": "ssl_certfile",
    "ssl.key.pem": "ssl_keyfile",
}
_OIDC = {
    "sasl.oauthbearer.method",
    "sasl.oauthbearer.client.id",
    "sasl.oauthbearer.client.secret",
    "sasl.oauthbearer.token.endpoint.url",
    "sasl.oauthbearer.scope",
    "sasl.oauthbearer.extensions",
}
_PKCS12 = {"ssl.keystore.location", "ssl.keystore.password"}
MSK_IAM_CONFLUENT_KAFKA = (2, 13)
_HANDLER_CLASSES = ("sasl.login.callback.handler.class", "sasl.client.callback.handler.class")
_HOSTNAME_CHECK = "ssl.endpoint.identification.algorithm"
_SECURITY_PREFIXES = ("sasl.", "ssl.", "security.")

# Settings users bring from Spark's Java-client sink that have a librdkafka equivalent; "{p}"
# is the options' prefix.
_JAVA_ONLY = {
    "ssl.truststore.location": "give the CA certificate as PEM: {p}ssl.ca.location",
    "ssl.truststore.password": "give the CA certificate as PEM: {p}ssl.ca.location",
    "ssl.truststore.type": "give the CA certificate as PEM: {p}ssl.ca.location",
    "ssl.keystore.type": "{p}ssl.keystore.location takes a PKCS#12 file; or give PEM files "
    "as {p}ssl.certificate.location and {p}ssl.key.location",
    "sasl.login.callback.handler.class": "Java classes cannot run here; for OAuth give "
    "{p}sasl.oauthbearer.method=oidc with its client settings (AWS's MSK IAM handlers are "
    "taken: the sink signs MSK IAM tokens itself)",
    "sasl.client.callback.handler.class": "Java classes cannot run here",
}
_DRIVER_REFUSES = {
    "sasl.kerberos.keytab": "the driver's client takes Kerberos credentials from the ticket "
    "cache (kinit) or KRB5_CLIENT_KTNAME, not from a keytab setting",
    "sasl.kerberos.principal": "the driver's client takes Kerberos credentials from the ticket "
    "cache (kinit) or KRB5_CLIENT_KTNAME",
    "sasl.kerberos.kinit.cmd": "the driver's client does not run kinit",
    "sasl.oauthbearer.config": "unsecured JWTs are for development brokers; use "
    "{p}sasl.oauthbearer.method=oidc",
}
# Named as no security setting is, so not caught by _SECURITY_PREFIXES.
_CERTIFICATE_CHECK = "enable.ssl.certificate.verification"
_INLINE_KEY = "ssl.key.pem"
_inline_key_warned: set[str] = set()  # the options warned about, once per process


def client_settings(kafka: Mapping[str, str], prefix: str = KAFKA_PREFIX) -> dict[str, str]:
    """`kafka` as both clients take it: Spark's JAAS line translated, every secret masked in
    this process's logs (the JAAS line's password on its own too), and nothing the driver's
    client cannot honour. `prefix`: the options' prefix, for messages.

    Raises:
        ConfigError: see `translate_jaas` and `check_driver_support`.
    """
    mask_in_logs(kafka)
    settings = translate_jaas(kafka)
    mask_in_logs(settings)
    check_driver_support(settings, prefix)
    return settings


def option_settings(kafka: Mapping[str, str], prefix: str = KAFKA_PREFIX) -> dict[str, str]:
    """`client_settings` of a query's options `{prefix}*`: a private key given inline is
    taken with a warning, as the registry's `basic.auth.user.info` is (serde/options.py).

    Raises:
        ConfigError: see `client_settings`.
    """
    settings = client_settings(kafka, prefix)
    if any(k.lower() == _INLINE_KEY for k in settings):
        _warn_inline_key(prefix)
    if msk_iam.is_msk_iam(settings):
        # Resolved once, here: an executor's botocore may know another region, or none.
        from kafka_txn_sink.kafka.msk_iam_tokens import resolve

        bootstrap = _get(settings, "bootstrap.servers") or ""
        settings[msk_iam.REGION] = resolve(settings, bootstrap, prefix).region
    return settings


def _warn_inline_key(prefix: str) -> None:
    """Spark prints a query's options in its plans and errors, redacting only names or values
    that match `spark.redaction.regex` (by default secret|password|token|access.?key):
    `ssl.key.pem` is not among them. The sink masks the key in its own logs and reprs."""
    if prefix in _inline_key_warned:
        return
    _inline_key_warned.add(prefix)
    log.warning(
        "option %s%s is shown in clear in Spark's query plans and errors "
        "(spark.redaction.regex does not match it); give %sssl.key.location, a file the "
        "driver and every executor can read, instead",
        prefix,
        _INLINE_KEY,
        prefix,
    )


def translate_jaas(kafka: Mapping[str, str]) -> dict[str, str]:
    """`kafka` with Spark's `sasl.jaas.config` (Plain and Scram login modules, also under
    `kafkashaded.`) replaced by librdkafka's `sasl.username` / `sasl.password`.

    Raises:
        ConfigError: another login module, a malformed line, no username or password, a
            mechanism that does not fit the module, or credentials given both ways.
    """
    kafka = _aws_java_route(kafka)
    key = next((k for k in kafka if k.lower() == JAAS), None)
    if key is None:
        return dict(kafka)
    settings = {k: v for k, v in kafka.items() if k != key}
    module, values = _parse_jaas(kafka[key])
    if module.removeprefix(msk_iam.SHADED) == msk_iam.LOGIN_MODULE:
        return _with_msk_iam(settings, values)
    family = _LOGIN_MODULES.get(module)
    if family is None:
        raise ConfigError(
            f"option kafka.{JAAS}: login module {module} is not supported; the Plain and Scram "
            "modules are, and AWS's IAMLoginModule (MSK IAM), or give librdkafka's settings "
            "(kafka.sasl.username, kafka.sasl.password, kafka.sasl.oauthbearer.*)"
        )
    if {"sasl.username", "sasl.password"} & {k.lower() for k in settings}:
        raise ConfigError(
            f"option kafka.{JAAS} and kafka.sasl.username/kafka.sasl.password both give "
            "credentials: keep one"
        )
    _check_jaas_mechanism(family, settings)
    missing = [name for name in ("username", "password") if not values.get(name)]
    if missing:
        raise ConfigError(f"option kafka.{JAAS}: no {' and no '.join(missing)} in it")
    settings["sasl.username"] = values["username"]
    settings["sasl.password"] = values["password"]
    return settings


def _aws_java_route(kafka: Mapping[str, str]) -> dict[str, str]:
    """`kafka` with AWS's Java callback handlers dropped; their OAUTHBEARER route (AWS's login
    handler with Kafka's OAuthBearerLoginModule) becomes `sasl.mechanism=AWS_MSK_IAM`."""
    handlers = [
        k
        for k, v in kafka.items()
        if k.lower() in _HANDLER_CLASSES and msk_iam.is_java_handler(str(v))
    ]
    if not handlers:
        return dict(kafka)
    settings = {k: v for k, v in kafka.items() if k not in handlers}
    mechanism = (_get(settings, "sasl.mechanism") or "").upper()
    if mechanism != "OAUTHBEARER":
        return settings
    # AWS's login handler reads its options (awsRoleArn, ...) from Kafka's own module's line.
    line = _get(settings, JAAS)
    settings = {k: v for k, v in settings.items() if k.lower() not in ("sasl.mechanism", JAAS)}
    settings["sasl.mechanism"] = msk_iam.MECHANISM
    if line is None:
        return settings
    module, values = _parse_jaas(line)
    if module != msk_iam.OAUTHBEARER_MODULE:
        raise ConfigError(
            f"option kafka.{JAAS}: AWS's OAUTHBEARER login handler takes "
            f"{msk_iam.OAUTHBEARER_MODULE}, not {module}"
        )
    return {**settings, **msk_iam.jaas_settings(values)}


def _with_msk_iam(settings: dict[str, str], values: Mapping[str, str]) -> dict[str, str]:
    """`settings` with an IAMLoginModule line's options as the sink's `aws.*` settings."""
    mechanism = (_get(settings, "sasl.mechanism") or msk_iam.MECHANISM).upper()
    if mechanism != msk_iam.MECHANISM:
        raise ConfigError(
            f"option kafka.{JAAS} uses AWS's IAMLoginModule but kafka.sasl.mechanism is "
            f"{mechanism}: set it to {msk_iam.MECHANISM}"
        )
    settings = {k: v for k, v in settings.items() if k.lower() != "sasl.mechanism"}
    return {**settings, "sasl.mechanism": msk_iam.MECHANISM, **msk_iam.jaas_settings(values)}


def _parse_jaas(line: str) -> tuple[str, dict[str, str]]:
    """The login module and the options of one JAAS line (`Module flag key="value" ...;`)."""
    head = _JAAS_HEAD.match(line)
    if head is None:
        raise ConfigError(
            f"option kafka.{JAAS} is not a JAAS line: `<LoginModule> required "
            'username="..." password="...";`'
        )
    rest = head.group("rest").strip().rstrip(";").strip()
    values: dict[str, str] = {}
    position = 0
    while position < len(rest):
        pair = _JAAS_PAIR.match(rest, position)
        if pair is None:
            raise ConfigError(
                f"option kafka.{JAAS}: cannot read its options after "
                f'{head.group("module")} (expected key="value" pairs)'
            )
        quoted = pair.group("quoted")
        value = re.sub(r"\\(.)", r"\1", quoted) if quoted is not None else pair.group("bare")
        values[pair.group("key")] = value
        position = pair.end()
    return head.group("module"), values


def _check_jaas_mechanism(family: str, settings: dict[str, str]) -> None:
    """Fill in PLAIN for the Plain module; require a SCRAM mechanism for the Scram module."""
    mechanism = _get(settings, "sasl.mechanism") or _get(settings, "sasl.mechanisms")
    if family == "PLAIN":
        if mechanism is None:
            settings["sasl.mechanism"] = "PLAIN"
        elif mechanism.upper() != "PLAIN":
            raise ConfigError(
                f"option kafka.{JAAS} uses the Plain login module but "
                f"kafka.sasl.mechanism is {mechanism}"
            )
    elif mechanism is None or mechanism.upper() not in ("SCRAM-SHA-256", "SCRAM-SHA-512"):
        raise ConfigError(
            f"option kafka.{JAAS} uses the Scram login module: set "
            "kafka.sasl.mechanism to SCRAM-SHA-256 or SCRAM-SHA-512"
        )


def check_driver_support(kafka: Mapping[str, str], prefix: str = KAFKA_PREFIX) -> None:
    """Refuse any security setting the driver's client cannot honour, naming it as the option
    `{prefix}{setting}`.

    Raises:
        ConfigError: the setting, why, and what to give instead.
    """
    lowered = {k.lower(): v for k, v in kafka.items()}
    for name in sorted(lowered):
        _check_setting(name, lowered[name], prefix)
    mechanism = (lowered.get("sasl.mechanism") or lowered.get("sasl.mechanisms") or "").upper()
    if mechanism and mechanism not in SASL_MECHANISMS:
        raise ConfigError(
            f"option {prefix}sasl.mechanism {mechanism} is not supported; "
            f"supported: {', '.join(SASL_MECHANISMS)}"
        )
    if mechanism == "OAUTHBEARER" and lowered.get("sasl.oauthbearer.method", "").lower() != "oidc":
        raise ConfigError(
            f"option {prefix}sasl.mechanism OAUTHBEARER needs "
            f"{prefix}sasl.oauthbearer.method=oidc with {prefix}sasl.oauthbearer."
            "client.id, .client.secret and .token.endpoint.url"
        )
    _check_msk_iam(lowered, mechanism, prefix)
    algorithm = lowered.get(_HOSTNAME_CHECK)
    if algorithm is not None and algorithm.lower() not in ("https", "none"):
        raise ConfigError(f"option {prefix}{_HOSTNAME_CHECK} must be https or none")
    token_endpoint = lowered.get("sasl.oauthbearer.token.endpoint.url")
    if token_endpoint is not None:
        from kafka_txn_sink.kafka.oauth import check_token_endpoint

        check_token_endpoint(token_endpoint, prefix)


def _check_msk_iam(lowered: Mapping[str, str], mechanism: str, prefix: str) -> None:
    """MSK IAM runs over TLS only, and its `aws.*` settings mean nothing without it."""
    aws = sorted(name for name in lowered if name in msk_iam.SETTINGS)
    if mechanism != msk_iam.MECHANISM:
        if aws:
            raise ConfigError(
                f"option {prefix}{aws[0]} is for {prefix}sasl.mechanism={msk_iam.MECHANISM} only"
            )
        return
    if lowered.get("security.protocol", "").upper() != "SASL_SSL":
        raise ConfigError(
            f"option {prefix}sasl.mechanism={msk_iam.MECHANISM} needs "
            f"{prefix}security.protocol=SASL_SSL (MSK serves IAM over TLS only)"
        )
    oauth = sorted(name for name in lowered if name.startswith("sasl.oauthbearer."))
    if oauth:
        raise ConfigError(
            f"option {prefix}{oauth[0]} does not go with {prefix}sasl.mechanism="
            f"{msk_iam.MECHANISM}: the sink signs MSK IAM tokens itself"
        )
    require(f"option {prefix}sasl.mechanism={msk_iam.MECHANISM}", "msk-iam")
    from kafka_txn_sink.kafka.client_versions import installed_version, release

    installed = installed_version("confluent-kafka")
    if installed is not None and release(installed) < MSK_IAM_CONFLUENT_KAFKA:
        # Before 2.13 librdkafka asks for a token only while the client is polled: an admin
        # client or a producer waiting in init_transactions would never log in.
        raise ConfigError(
            f"option {prefix}sasl.mechanism={msk_iam.MECHANISM} needs confluent-kafka>=2.13 "
            f"(installed: {installed}): pip install 'confluent-kafka>=2.13,<3'"
        )


def _check_setting(name: str, value: str, prefix: str) -> None:
    """Refuse one setting (lower-cased) the driver's client cannot honour."""
    if name in _JAVA_ONLY:
        advice = _JAVA_ONLY[name].format(p=prefix)
        raise ConfigError(f"option {prefix}{name} is a Java client setting: {advice}")
    if name in _DRIVER_REFUSES:
        why = _DRIVER_REFUSES[name].format(p=prefix)
        raise ConfigError(f"option {prefix}{name} is not supported: {why}")
    if name == _CERTIFICATE_CHECK and value.strip().lower() in ("false", "f", "0"):
        raise ConfigError(
            f"option {prefix}{name}=false is not supported: the driver's client always verifies "
            f"the brokers' certificates; give their CA as {prefix}ssl.ca.location"
        )
    known = name in _DIRECT or name in _INLINE_PEM or name in _OIDC or name in _PKCS12
    if name.startswith(_SECURITY_PREFIXES) and not known and name != _HOSTNAME_CHECK:
        raise ConfigError(
            f"option {prefix}{name} is not supported: the driver's Kafka client (kafka-python, "
            "which completes the transactions) cannot honour it"
        )


def driver_settings(kafka: Mapping[str, str], bootstrap: str = "") -> dict[str, Any]:
    """kafka-python settings that give the driver's client the identity `kafka` gives the tasks
    (of the brokers `bootstrap`, whose host names may give MSK IAM its region).

    Call `check_driver_support` first. Inline PEM and PKCS#12 material is written to files
    only this user can read, removed when the process exits.
    """
    lowered = {k.lower(): v for k, v in kafka.items()}
    settings: dict[str, Any] = {}
    for name, value in lowered.items():
        if name in _DIRECT:
            settings[_DIRECT[name]] = value.upper() if name == "security.protocol" else value
    if lowered.get(_HOSTNAME_CHECK) is not None:
        # librdkafka checks the broker's name by default (https), as kafka-python does.
        settings["ssl_check_hostname"] = lowered[_HOSTNAME_CHECK].lower() == "https"
    for name, target in _INLINE_PEM.items():
        if lowered.get(name):
            settings[target] = str(_private_file(name, lowered[name].encode()))
    if lowered.get("ssl.keystore.location"):
        settings.update(_pkcs12_files(lowered))
    if msk_iam.is_msk_iam(lowered):
        from kafka_txn_sink.kafka.msk_iam_tokens import MskIamTokenProvider, resolve

        settings["sasl_mechanism"] = "OAUTHBEARER"
        settings["sasl_oauth_token_provider"] = MskIamTokenProvider(resolve(lowered, bootstrap))
    if "sasl.oauthbearer.method" in lowered:
        from kafka_txn_sink.kafka.oauth import ClientCredentialsTokenProvider

        settings["sasl_oauth_token_provider"] = ClientCredentialsTokenProvider.from_settings(
            lowered
        )
    return settings


def librdkafka_config(config: Mapping[str, Any]) -> dict[str, Any]:
    """`config` as librdkafka takes it: MSK IAM becomes OAUTHBEARER with a callback that signs
    this process's tokens (`msk_iam_tokens.librdkafka_settings`); any other config as it is.

    Raises:
        ConfigError: MSK IAM without credentials or region.
    """
    if not msk_iam.is_msk_iam(config):
        return dict(config)
    from kafka_txn_sink.kafka.msk_iam_tokens import librdkafka_settings

    return librdkafka_settings(config)


def _pkcs12_files(lowered: Mapping[str, str]) -> dict[str, str]:
    """The certificate chain and the key of a PKCS#12 keystore, as PEM files for kafka-python
    (the key stays encrypted with the keystore's password).

    Raises:
        MissingExtraError: cryptography (the keystore extra) is not installed.
    """
    require("option kafka.ssl.keystore.location", "keystore")
    from cryptography.hazmat.primitives.serialization import (
        BestAvailableEncryption,
        Encoding,
        NoEncryption,
        PrivateFormat,
        pkcs12,
    )

    password = lowered.get("ssl.keystore.password", "")
    try:
        key, cert, chain = pkcs12.load_key_and_certificates(
            Path(lowered["ssl.keystore.location"]).read_bytes(), password.encode() or None
        )
    except (OSError, ValueError) as exc:
        raise ConfigError(
            "option kafka.ssl.keystore.location: cannot read it as a PKCS#12 keystore with "
            f"kafka.ssl.keystore.password ({type(exc).__name__})"
        ) from None
    if key is None or cert is None:
        raise ConfigError("option kafka.ssl.keystore.location holds no key and certificate")
    encryption = BestAvailableEncryption(password.encode()) if password else NoEncryption()
    certs = b"".join(c.public_bytes(Encoding.PEM) for c in [cert, *(chain or [])])
    key_pem = key.private_bytes(Encoding.PEM, PrivateFormat.PKCS8, encryption)
    files = {
        "ssl_certfile": str(_private_file("keystore-chain.pem", certs)),
        "ssl_keyfile": str(_private_file("keystore-key.pem", key_pem)),
    }
    if password:
        files["ssl_password"] = password
    return files


_private_dir: Path | None = None


def _private_file(name: str, data: bytes) -> Path:
    """Write `data` to a new file readable by this user only, removed at exit."""
    global _private_dir
    if _private_dir is None:
        _private_dir = Path(tempfile.mkdtemp(prefix="kafka-txn-sink-tls-"))  # mode 0700
        atexit.register(shutil.rmtree, _private_dir, ignore_errors=True)
    descriptor, path = tempfile.mkstemp(prefix=name.replace(".", "-"), dir=_private_dir)
    with os.fdopen(descriptor, "wb") as handle:  # mkstemp makes it 0600
        handle.write(data)
    return Path(path)


def _get(settings: Mapping[str, str], name: str) -> str | None:
    return next((v for k, v in settings.items() if k.lower() == name), None)
