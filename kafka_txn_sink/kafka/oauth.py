"""OAUTHBEARER for the driver's client: tokens by the OAuth 2.0 client-credentials grant.

The tasks' librdkafka fetches its own tokens from the same settings
(`sasl.oauthbearer.method=oidc`); kafka-python needs a token provider object, which this is.
A token is reused until shortly before it expires; each request is bounded by a timeout.
The endpoint must be https (`check_token_endpoint`), and a redirect is never followed:
urllib would send the `Authorization` header, the client's credentials, on to its target.
Each token fetched is masked in this process's logs: kafka-python logs the bytes of
SaslAuthenticate, the token in them, at DEBUG.
"""

from __future__ import annotations

import base64
import ipaddress
import json
import math
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping

from kafka.net.sasl.oauth import AbstractTokenProvider

from kafka_txn_sink.errors import ConfigError, KafkaUnavailableError
from kafka_txn_sink.redaction import mask_in_logs

TOKEN_REQUEST_TIMEOUT_S = 10.0
REFRESH_BEFORE_EXPIRY_S = 30.0
DEFAULT_LIFETIME_S = 300.0  # when the endpoint does not say (expires_in is optional)
TOKEN_ENDPOINT = "sasl.oauthbearer.token.endpoint.url"


class _NoRedirects(urllib.request.HTTPRedirectHandler):
    """Answers every redirect with an error instead of a request to its target."""

    def redirect_request(self, *args: object, **kwargs: object) -> None:
        return None


_OPENER = urllib.request.build_opener(_NoRedirects)


class ClientCredentialsTokenProvider(AbstractTokenProvider):
    """Fetches and caches access tokens from an OAuth 2.0 token endpoint."""

    def __init__(
        self,
        endpoint: str,
        client_id: str,
        client_secret: str,
        scope: str | None = None,
        extensions: Mapping[str, str] | None = None,
    ):
        super().__init__()
        self._endpoint = endpoint
        self._client_id = client_id
        self._client_secret = client_secret
        self._scope = scope
        self._extensions = dict(extensions or {})
        self._token: str | None = None
        self._expires_at = 0.0
        self._lock = threading.Lock()

    @classmethod
    def from_settings(cls, lowered: Mapping[str, str]) -> ClientCredentialsTokenProvider:
        """The provider that librdkafka's `sasl.oauthbearer.*` settings (lower-cased) describe.

        Raises:
            ConfigError: a required setting is missing.
        """
        required = ("client.id", "client.secret", "token.endpoint.url")
        missing = [
            f"kafka.sasl.oauthbearer.{n}"
            for n in required
            if not lowered.get(f"sasl.oauthbearer.{n}")
        ]
        if missing:
            raise ConfigError(f"OAUTHBEARER with method oidc needs option(s) {', '.join(missing)}")
        check_token_endpoint(lowered[TOKEN_ENDPOINT])
        extensions = lowered.get("sasl.oauthbearer.extensions", "")
        return cls(
            endpoint=lowered["sasl.oauthbearer.token.endpoint.url"],
            client_id=lowered["sasl.oauthbearer.client.id"],
            client_secret=lowered["sasl.oauthbearer.client.secret"],
            scope=lowered.get("sasl.oauthbearer.scope") or None,
            extensions=dict(pair.split("=", 1) for pair in extensions.split(",") if "=" in pair),
        )

    def token(self) -> str:
        """An access token valid for at least `REFRESH_BEFORE_EXPIRY_S` more seconds."""
        with self._lock:
            if self._token is None or time.monotonic() >= self._expires_at:
                self._token, lifetime = self._fetch()
                self._expires_at = time.monotonic() + max(lifetime - REFRESH_BEFORE_EXPIRY_S, 1)
            return self._token

    def extensions(self) -> dict[str, str]:
        """SASL extensions sent with the token (`sasl.oauthbearer.extensions`)."""
        return dict(self._extensions)

    def _fetch(self) -> tuple[str, float]:
        form = {"grant_type": "client_credentials"}
        if self._scope:
            form["scope"] = self._scope
        request = urllib.request.Request(
            self._endpoint,
            data=urllib.parse.urlencode(form).encode(),
            headers={
                "Authorization": f"Basic {self._basic_credentials()}",
                "Content-Type": "application/x-www-form-urlencoded",
                "Accept": "application/json",
            },
        )
        try:
            with _OPENER.open(request, timeout=TOKEN_REQUEST_TIMEOUT_S) as response:
                body = json.loads(response.read())
        except urllib.error.HTTPError as exc:
            if 300 <= exc.code < 400:
                raise ConfigError(
                    f"OAUTHBEARER: the token endpoint (kafka.{TOKEN_ENDPOINT}) answered a "
                    f"redirect (HTTP {exc.code}), which is not followed: the client credentials "
                    f"are sent to that URL only. Set the option to the URL that issues tokens"
                ) from None
            raise _no_token(exc) from None
        except (urllib.error.URLError, TimeoutError, ValueError) as exc:
            raise _no_token(exc) from None
        token = body.get("access_token") if isinstance(body, dict) else None
        if not isinstance(token, str) or not token:
            raise KafkaUnavailableError(
                "OAUTHBEARER: the token endpoint's answer has no access_token"
            )
        mask_in_logs({"access_token": token})
        return token, _lifetime(body.get("expires_in"))

    def _basic_credentials(self) -> str:
        """RFC 6749 section 2.3.1: the id and the secret each form-urlencoded, then Basic."""
        encoded = (urllib.parse.quote_plus(part) for part in (self._client_id, self._client_secret))
        return base64.b64encode(":".join(encoded).encode()).decode()


def _lifetime(expires_in: object) -> float:
    """The token's lifetime in seconds from the answer's `expires_in` (optional).

    Raises:
        KafkaUnavailableError: it is there but not a positive number of seconds.
    """
    if expires_in is None:
        return DEFAULT_LIFETIME_S
    seconds = _number(expires_in)
    if seconds is None or not math.isfinite(seconds) or seconds <= 0:
        raise KafkaUnavailableError(
            "OAUTHBEARER: the token endpoint's answer has an expires_in that is not a positive "
            f"number of seconds: {str(expires_in)[:40]!r}"
        )
    return seconds


def _number(value: object) -> float | None:
    """`value` as a number: a JSON number, or a string of one (some servers send those)."""
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        return None
    try:
        return float(value)
    except ValueError:
        return None


def _no_token(exc: Exception) -> KafkaUnavailableError:
    # The exception text may quote the request; only its kind is safe to show.
    return KafkaUnavailableError(
        f"OAUTHBEARER: no token from kafka.{TOKEN_ENDPOINT} "
        f"({type(exc).__name__}: {getattr(exc, 'code', '') or getattr(exc, 'reason', '')})"
    )


def check_token_endpoint(url: str, prefix: str = "kafka.") -> None:
    """Refuse an OAuth token endpoint that the client secret would reach in clear text:
    https anywhere, http only on this host's loopback address (a local token agent).
    `prefix`: the settings' option prefix, for the message.

    Raises:
        ConfigError: names the option; never the URL, which may carry credentials.
    """
    parts = urllib.parse.urlsplit(url.strip())
    scheme, host = parts.scheme.lower(), parts.hostname or ""
    if (scheme == "https" and host) or (scheme == "http" and _is_loopback(host)):
        return
    raise ConfigError(
        f"option {prefix}{TOKEN_ENDPOINT} must be an https:// URL: the client id and secret are "
        "sent to it (http:// is accepted only for this host's loopback address)"
    )


def _is_loopback(host: str) -> bool:
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
