"""The secured broker that also authenticates AWS MSK IAM tokens, as MSK does, on loopback.

There is no MSK here: ``IamKafkaBroker`` is a ``SecuredKafkaBroker`` whose SASL_SSL listener
also offers OAUTHBEARER, checked by ``java/MskIamValidator.java`` (compiled once per source by
``validator_classes``). That handler takes the token of AWS's signers (a base64url SigV4-presigned
URL of ``kafka-cluster:Connect`` in region ``us-east-1``) when its access key id is listed in the
broker's credentials file, its signature is right and it is live; the principal ACLs see is the
one listed with the key. Keys are added and revoked while the broker runs (``add_iam_user``,
``remove_iam_user``); every accepted login is in the broker's log (``iam_logins``).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import ClassVar

from kafka_txn_sink.testing.errors import TestbedError
from kafka_txn_sink.testing.jars import cache_dir, kafka_jars
from kafka_txn_sink.testing.kafka_broker import SettingValue
from kafka_txn_sink.testing.processes import javac_executable
from kafka_txn_sink.testing.secured_broker import (
    SASL_LISTENER,
    KafkaUser,
    SecuredKafkaBroker,
    _user_name,
)

AWS_MSK_IAM = "AWS_MSK_IAM"
"""The ``mechanism`` of an IAM user, as the sink's option ``kafka.sasl.mechanism`` names it."""
OAUTHBEARER = "OAUTHBEARER"
_OAUTHBEARER_LOGIN = "org.apache.kafka.common.security.oauthbearer.OAuthBearerLoginModule"

VALIDATOR_SOURCE = Path(__file__).resolve().parent / "java" / "MskIamValidator.java"
VALIDATOR_CLASS = "kafka_txn_sink.testbed.MskIamValidator"
JAVAC_TIMEOUT_S = 180

_ACCESS_KEY_ID = re.compile(r"^[A-Z0-9]{4,128}$")
# AWS's secrets are base64; no comma (the credentials file's separator) and no line break.
_SECRET = re.compile(r"^[A-Za-z0-9/+=._~-]+$")
_ACCEPTED = re.compile(r"MskIamValidator: accepted (\S+) signed at (\d{8}T\d{6}Z)")
_REFUSED = re.compile(
    r"MskIamValidator: refused: (.*?)(?: \(kafka_txn_sink\.testbed\.MskIamValidator\))?$",
    re.MULTILINE,
)


def validator_classes(kafka_version: str) -> Path:
    """The directory of the compiled ``MskIamValidator``: ``<cache>/msk-iam-validator-<sha12>``
    (12 hex digits of the source's SHA-256), compiled by ``javac --release 17`` against Kafka's
    jars when it is not there yet.

    Raises:
        TestbedError: javac is missing, fails or outlives ``JAVAC_TIMEOUT_S``.
    """
    source = VALIDATOR_SOURCE.read_bytes()
    target = cache_dir() / f"msk-iam-validator-{hashlib.sha256(source).hexdigest()[:12]}"
    if _compiled(target):
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    # Compiled aside and renamed: a concurrent test process never sees half the classes.
    scratch = Path(tempfile.mkdtemp(prefix=f"{target.name}.", dir=target.parent))
    try:
        _javac(kafka_version, scratch)
        with contextlib.suppress(OSError):  # another process renamed its copy first
            os.rename(scratch, target)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    if not _compiled(target):
        raise TestbedError(f"javac left no {VALIDATOR_CLASS} in {target}")
    return target


def _compiled(directory: Path) -> bool:
    return (directory / (VALIDATOR_CLASS.replace(".", "/") + ".class")).is_file()


def _javac(kafka_version: str, out: Path) -> None:
    javac = javac_executable("it compiles the test bed's MSK IAM validator for Kafka's broker")
    cmd = [
        javac,
        # A short-lived compiler on a shared 2-core machine: start fast, compile little.
        "-J-XX:TieredStopAtLevel=1",
        "-J-XX:+UseSerialGC",
        "--release",
        "17",
        "-cp",
        f"{kafka_jars(kafka_version)}/*",
        "-d",
        str(out),
        str(VALIDATOR_SOURCE),
    ]
    try:
        done = subprocess.run(
            cmd, capture_output=True, text=True, timeout=JAVAC_TIMEOUT_S, check=False
        )
    except subprocess.TimeoutExpired as exc:
        raise TestbedError(f"javac did not compile {VALIDATOR_SOURCE} in {exc.timeout}s") from exc
    except OSError as exc:
        raise TestbedError(f"javac ({javac}) could not be run: {exc}") from exc
    if done.returncode != 0:
        raise TestbedError(
            f"javac failed ({done.returncode}) on {VALIDATOR_SOURCE}:\n"
            f"{done.stdout[-2000:]}{done.stderr[-2000:]}"
        )


class IamKafkaBroker(SecuredKafkaBroker):
    """A ``SecuredKafkaBroker`` whose SASL_SSL listener also takes AWS MSK IAM tokens over
    OAUTHBEARER, signed for ``REGION``.

    ``max_token_age_s`` shortens a token's life below its own ``X-Amz-Expires`` (900 s from
    AWS's signers); ``reauth_ms`` sets ``connections.max.reauth.ms`` of those OAUTHBEARER
    sessions, which the broker ends once their token's life is over unless the client
    re-authenticates with a new token.
    """

    REGION: ClassVar[str] = "us-east-1"

    def __init__(
        self,
        workdir: Path | str,
        version: str | None = None,
        extra_config: Mapping[str, object] | None = None,
        heap: str = "768m",
        detached: bool = False,
        *,
        max_token_age_s: int | None = None,
        reauth_ms: int | None = None,
    ) -> None:
        super().__init__(workdir, version, extra_config, heap, detached)
        self.max_token_age_s = max_token_age_s
        self.reauth_ms = reauth_ms
        self._iam_keys: dict[str, tuple[str, str]] = {}  # access key id -> (secret, principal)

    @property
    def credentials_path(self) -> Path:
        """The validator's credentials file: ``akid=secret,principal`` lines."""
        return self.workdir / "iam" / "credentials"

    # ---- configuration ------------------------------------------------------------------------

    def _classpath(self) -> list[str]:
        return [*super()._classpath(), str(validator_classes(self.version))]

    def _write_files(self) -> None:
        self._write_credentials()
        super()._write_files()

    def _listener_config(self) -> dict[str, object]:
        config = super()._listener_config()
        prefix = f"listener.name.{SASL_LISTENER.lower()}.{OAUTHBEARER.lower()}"
        config["sasl.enabled.mechanisms"] = f"{config['sasl.enabled.mechanisms']},{OAUTHBEARER}"
        config[f"{prefix}.sasl.jaas.config"] = self._iam_jaas()
        config[f"{prefix}.sasl.server.callback.handler.class"] = VALIDATOR_CLASS
        # Also the broker's own login on the listener: with no token, as a server needs none.
        config[f"{prefix}.sasl.login.callback.handler.class"] = VALIDATOR_CLASS
        if self.reauth_ms is not None:
            # Per listener and mechanism: the SCRAM sessions of the test bed's admin keep theirs.
            config[f"{prefix}.connections.max.reauth.ms"] = self.reauth_ms
        return config

    def _iam_jaas(self) -> str:
        path = str(self.credentials_path)
        if '"' in path or "\\" in path:
            raise TestbedError(f"a JAAS option cannot hold the path {path!r}")
        options = f'credentialsFile="{path}" region="{self.REGION}" maxSkewSeconds="300"'
        if self.max_token_age_s is not None:
            options += f' maxTokenAgeSeconds="{self.max_token_age_s}"'
        return f"{_OAUTHBEARER_LOGIN} required {options};"

    # ---- IAM users ----------------------------------------------------------------------------

    def add_iam_user(
        self, access_key_id: str, secret: str, principal: str | None = None
    ) -> KafkaUser:
        """List an access key with its secret; its tokens log in as ``User:<principal>``
        (default: the access key id). Takes effect at the next login, also on a running
        broker. The user's ``password`` is the secret.

        Raises:
            TestbedError: the key id, secret or principal is not one the test bed can list.
        """
        if not _ACCESS_KEY_ID.match(access_key_id):
            raise TestbedError(f"test bed access key ids are [A-Z0-9]{{4,128}}; {access_key_id!r}")
        if not _SECRET.match(secret):
            raise TestbedError("test bed secrets are [A-Za-z0-9/+=._~-]+")
        name = _user_name(principal or access_key_id)
        self._iam_keys[access_key_id] = (secret, name)
        self._write_credentials()
        return KafkaUser(name, AWS_MSK_IAM, password=secret)

    def remove_iam_user(self, access_key_id: str) -> None:
        """Revoke an access key: its tokens are refused from the next login on.

        Raises:
            TestbedError: no IAM user has that key.
        """
        if self._iam_keys.pop(access_key_id, None) is None:
            raise TestbedError(f"no IAM user has the access key id {access_key_id!r}")
        self._write_credentials()

    def _write_credentials(self) -> None:
        lines = [f"{akid}={secret},{name}\n" for akid, (secret, name) in self._iam_keys.items()]
        self.credentials_path.parent.mkdir(parents=True, exist_ok=True)
        # Replaced whole: the broker reads it on every login, never half-written.
        scratch = self.credentials_path.with_name(".credentials.tmp")
        scratch.touch(mode=0o600)
        scratch.write_text("".join(lines))
        os.replace(scratch, self.credentials_path)

    def iam_options(self, user: KafkaUser) -> dict[str, str]:
        """The sink's options of an IAM ``user`` (its credentials come from AWS's default chain,
        e.g. ``AWS_ACCESS_KEY_ID``/``AWS_SECRET_ACCESS_KEY``).

        Raises:
            TestbedError: ``user`` is not an IAM user.
        """
        _require_iam(user)
        return {
            "kafka.bootstrap.servers": self.address(SASL_LISTENER),
            "kafka.security.protocol": "SASL_SSL",
            "kafka.ssl.ca.location": str(self.ca_path),
            "kafka.sasl.mechanism": AWS_MSK_IAM,
            "kafka.aws.region": self.REGION,
        }

    def iam_logins(self) -> list[tuple[str, str]]:
        """``(principal, X-Amz-Date)`` of every token accepted so far, oldest first (from the
        broker's log, restarts included)."""
        return [(m[1], m[2]) for m in _ACCEPTED.finditer(self._log_text())]

    def iam_refusals(self) -> list[str]:
        """The reason of every token refused so far, oldest first (from the broker's log)."""
        return _REFUSED.findall(self._log_text())

    def _log_text(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    # ---- client settings ----------------------------------------------------------------------

    def _security_settings(self, user: KafkaUser) -> dict[str, SettingValue]:
        """For an IAM user: OAUTHBEARER over SASL_SSL, to which the client adds an ``oauth_cb``
        returning ``(token, expiry_s)``; else as for any user."""
        if user.mechanism != AWS_MSK_IAM:
            return super()._security_settings(user)
        return {
            "ssl.ca.location": str(self.ca_path),
            "ssl.endpoint.identification.algorithm": "https",
            "security.protocol": "SASL_SSL",
            "sasl.mechanism": OAUTHBEARER,
        }

    def kafka_python_settings(self, user: KafkaUser) -> dict[str, object]:
        """kafka-python keyword arguments of a SCRAM, PLAIN or TLS ``user``."""
        _refuse_iam(user, "kafka_python_settings")
        return super().kafka_python_settings(user)

    def java_settings(self, user: KafkaUser) -> dict[str, str]:
        """Properties of Kafka's Java clients for a SCRAM, PLAIN or TLS ``user``."""
        _refuse_iam(user, "java_settings")
        return super().java_settings(user)


def _require_iam(user: KafkaUser) -> None:
    if user.mechanism != AWS_MSK_IAM:
        raise TestbedError(f"{user.name} is a {user.mechanism} user, not an {AWS_MSK_IAM} one")


def _refuse_iam(user: KafkaUser, method: str) -> None:
    if user.mechanism == AWS_MSK_IAM:
        raise TestbedError(
            f"{method} has no {AWS_MSK_IAM} form: use client_settings plus an oauth_cb, or "
            "iam_options for the sink"
        )
