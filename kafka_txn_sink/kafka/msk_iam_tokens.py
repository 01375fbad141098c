"""MSK IAM tokens for both Kafka clients, signed by AWS's signer with botocore's credentials.

A token is a `kafka-cluster:Connect` request presigned with SigV4 for the cluster's region,
valid 15 minutes (`aws-msk-iam-sasl-signer-python`). The tasks' librdkafka asks for one through
`oauth_cb` (again at 80% of its lifetime, and re-authenticates); the driver's kafka-python
through `MskIamTokenProvider` (at every login and re-authentication). Each token is signed
afresh, which needs no network; botocore's credentials refresh themselves (an assumed role,
web identity, an instance role). One signer per process and settings resolves them once.

Neither a token nor a key reaches a log or an error: tokens are masked by their shape
(`redaction.py`), the secret key and session token they were signed with as soon as they are
seen, and botocore's messages name providers, variables and ARNs only.

Import this module only once the `msk-iam` extra is known to be there (`extras.require`).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

import botocore.session
from aws_msk_iam_sasl_signer import MSKAuthTokenProvider
from botocore.credentials import (
    AssumeRoleCredentialFetcher,
    CredentialProvider,
    Credentials,
    DeferredRefreshableCredentials,
)
from botocore.exceptions import BotoCoreError, ClientError
from kafka.net.sasl.oauth import AbstractTokenProvider

from kafka_txn_sink.errors import ConfigError
from kafka_txn_sink.kafka.msk_iam import (
    PROFILE,
    REGION,
    SETTINGS,
    MskIam,
    msk_iam,
    region_of_hosts,
)
from kafka_txn_sink.redaction import mask_in_logs, scrubbed

log = logging.getLogger(__name__)
TOKEN_LIFETIME_S = 900  # X-Amz-Expires of AWS's signer
LIFETIME_ENV = "KTS_MSK_IAM_TOKEN_SECONDS"
"""For tests of the refresh: a shorter lifetime to tell the clients, so that they ask sooner."""

NO_CREDENTIALS = (
    "MSK IAM: no AWS credentials: botocore's default chain found none in this process "
    "(AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, AWS_PROFILE, AWS_WEB_IDENTITY_TOKEN_FILE "
    "with AWS_ROLE_ARN, a container or an instance role)"
)


class TokenSigner:
    """Signs MSK IAM tokens with this process's credentials for one `MskIam`."""

    def __init__(self, iam: MskIam):
        self._iam = iam
        self._credentials: Any = None
        self._lock = threading.Lock()

    def token(self) -> tuple[str, float]:
        """A new token, and when the clients should take it as expired (epoch seconds).

        Raises:
            ConfigError: no credentials, or botocore cannot make them (the message names the
                provider, variable or role, never a key).
        """
        try:
            credentials = self._frozen_credentials()
            token, expiry_ms = MSKAuthTokenProvider.generate_auth_token_from_credentials_provider(
                self._iam.region, _Given(credentials)
            )
        except (BotoCoreError, ClientError, ValueError) as exc:
            role = f" as role {self._iam.role_arn}" if self._iam.role_arn else ""
            raise ConfigError(
                f"MSK IAM: cannot sign a token{role}: {type(exc).__name__}: "
                f"{scrubbed(str(exc))[:300]}"
            ) from None
        expiry = min(expiry_ms / 1000, time.time() + _lifetime_s())
        # Temporary credentials may end sooner than the token (a refresh that keeps failing).
        ends = getattr(self._credentials, "_expiry_time", None)
        return token, min(expiry, ends.timestamp()) if ends is not None else expiry

    def _frozen_credentials(self) -> Credentials:
        with self._lock:
            if self._credentials is None:
                self._credentials = _credentials(self._iam)
        frozen = self._credentials.get_frozen_credentials()
        _mask(frozen)
        return Credentials(frozen.access_key, frozen.secret_key, frozen.token)


def _credentials(iam: MskIam) -> Any:
    """botocore's credentials: its default chain or a profile, then the role if there is one.

    Raises:
        ConfigError: the chain found none.
    """
    session = botocore.session.Session(profile=iam.profile)
    base = session.get_credentials()
    if base is None:
        raise ConfigError(NO_CREDENTIALS)
    if iam.role_arn is None:
        return base
    _mask(base.get_frozen_credentials())  # they sign the AssumeRole calls
    sts_region = iam.sts_region or iam.region

    def sts_client(service: str, **kwargs: Any) -> Any:
        return session.create_client(service, **{**kwargs, "region_name": sts_region})

    fetcher = AssumeRoleCredentialFetcher(
        sts_client, base, iam.role_arn, extra_args=assume_role_args(iam)
    )
    return DeferredRefreshableCredentials(fetcher.fetch_credentials, "assume-role")


def assume_role_args(iam: MskIam) -> dict[str, str]:
    """STS AssumeRole's arguments besides the role: the session name, the external id."""
    args = {"RoleSessionName": iam.role_session_name}
    if iam.role_external_id:
        args["ExternalId"] = iam.role_external_id
    return args


def _mask(frozen: Any) -> None:
    """Mask credentials' secret key and session token in this process's logs (botocore logs
    requests with the session token in them at DEBUG)."""
    mask_in_logs({"aws.secret.key": frozen.secret_key or "", "aws.token": frozen.token or ""})


class _Given(CredentialProvider):
    """Credentials already resolved, as AWS's signer takes them (a provider)."""

    METHOD = "kafka-txn-sink"

    def __init__(self, credentials: Credentials):
        super().__init__()
        self._given = credentials

    def load(self) -> Credentials:
        return self._given


def _lifetime_s() -> float:
    try:
        return min(float(os.environ.get(LIFETIME_ENV, TOKEN_LIFETIME_S)), TOKEN_LIFETIME_S)
    except ValueError:
        return TOKEN_LIFETIME_S


_signers: dict[MskIam, TokenSigner] = {}
_signers_lock = threading.Lock()


def signer(iam: MskIam) -> TokenSigner:
    """This process's signer for `iam`."""
    with _signers_lock:
        if iam not in _signers:
            _signers[iam] = TokenSigner(iam)
        return _signers[iam]


def default_region(profile: str | None, prefix: str = "kafka.") -> str | None:
    """botocore's region (AWS_DEFAULT_REGION, the profile's), if any.

    Raises:
        ConfigError: botocore cannot read the profile (named, never a key).
    """
    try:
        region = botocore.session.Session(profile=profile).get_config_variable("region")
    except BotoCoreError as exc:
        raise ConfigError(f"option {prefix}aws.profile: {scrubbed(str(exc))[:300]}") from None
    return str(region) if region else None


def resolve(settings: Mapping[str, Any], bootstrap: str, prefix: str = "kafka.") -> MskIam:
    """`msk_iam.msk_iam`, with botocore's region when neither the options nor the host names
    give one.

    Raises:
        ConfigError: see `msk_iam.msk_iam` and `default_region`.
    """
    lowered = {k.lower(): str(v) for k, v in settings.items()}
    if lowered.get(REGION) or region_of_hosts(bootstrap):
        return msk_iam(settings, bootstrap, prefix=prefix)
    region = default_region(lowered.get(PROFILE) or None, prefix)
    return msk_iam(settings, bootstrap, region, prefix)


def oauth_callback(iam: MskIam) -> Callable[[str], tuple[str, float]]:
    """librdkafka's `oauth_cb`: a token and its expiry in epoch seconds. confluent-kafka drops
    what the callback raises ("OAuth callback raised exception"), so the reason is logged."""
    source = signer(iam)

    def callback(_config: str) -> tuple[str, float]:
        try:
            return source.token()
        except ConfigError as exc:
            log.error("%s", exc)
            raise

    return callback


class MskIamTokenProvider(AbstractTokenProvider):
    """kafka-python's token provider: a freshly signed token at every login."""

    def __init__(self, iam: MskIam):
        super().__init__()
        self._signer = signer(iam)

    def token(self) -> str:
        """A new token.

        Raises:
            ConfigError: see `TokenSigner.token`.
        """
        return self._signer.token()[0]


def librdkafka_settings(config: Mapping[str, Any]) -> dict[str, Any]:
    """`config` as librdkafka takes it: OAUTHBEARER with a token callback, the `aws.*`
    settings dropped. A first token is signed here, so that missing credentials fail by name at
    once, not as librdkafka's "OAuth token not set" ten seconds later.

    Raises:
        ConfigError: see `resolve` and `TokenSigner.token`.
    """
    iam = resolve(config, str(config.get("bootstrap.servers", "")))
    signer(iam).token()
    dropped = (*SETTINGS, "sasl.mechanism", "sasl.mechanisms")
    settings = {k: v for k, v in config.items() if k.lower() not in dropped}
    settings["sasl.mechanism"] = "OAUTHBEARER"
    settings["oauth_cb"] = oauth_callback(iam)
    return settings
