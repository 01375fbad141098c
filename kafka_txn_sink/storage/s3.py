"""One S3 bucket prefix behind one boto3 client: the commit log's and files mode's common part.

Every failed request becomes the owner's own error, naming the object and the endpoint and
never a credential; its HTTP status and S3 error code let callers read some answers as results
(412 on a conditional write, 404 on a read).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import boto3
from boto3.exceptions import S3UploadFailedError
from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError

from kafka_txn_sink.errors import ConfigError

T = TypeVar("T")


@dataclass(frozen=True)
class S3Settings:
    """How to reach an S3-compatible endpoint; None means boto3's default chain decides."""

    endpoint_url: str | None = None
    region: str | None = None
    access_key_id: str | None = None
    secret_access_key: str | None = field(default=None, repr=False)
    connect_timeout_s: float = 5
    read_timeout_s: float = 15
    # Attempts in total, the first included (as AWS_MAX_ATTEMPTS counts them).
    max_attempts: int = 3
    # None: path-style addressing when an endpoint is given (MinIO, moto), virtual hosts on AWS.
    path_style: bool | None = None

    def __post_init__(self) -> None:
        if self.max_attempts < 1:
            raise ConfigError(f"S3 max_attempts must be at least 1, not {self.max_attempts}")
        if self.connect_timeout_s <= 0 or self.read_timeout_s <= 0:
            raise ConfigError(
                f"S3 timeouts must be positive, not connect={self.connect_timeout_s}s "
                f"read={self.read_timeout_s}s"
            )

    @property
    def use_path_style(self) -> bool:
        return self.path_style if self.path_style is not None else self.endpoint_url is not None

    def botocore_config(self) -> Config:
        return Config(
            connect_timeout=self.connect_timeout_s,
            read_timeout=self.read_timeout_s,
            retries={"total_max_attempts": self.max_attempts, "mode": "standard"},
            s3={"addressing_style": "path"} if self.use_path_style else None,
        )


class S3Prefix(ABC):
    """`s3://bucket/prefix`; names below it are keys relative to the prefix."""

    def __init__(self, bucket: str, prefix: str = "", settings: S3Settings | None = None) -> None:
        self.bucket = bucket
        self.prefix = prefix.strip("/")
        self.settings = settings or S3Settings()
        self._client = make_client(self.settings)

    @abstractmethod
    def _error(self, message: str, status: int, code: str) -> Exception:
        """The owner's error for a failed request (status 0 when no answer came)."""

    @property
    def uri(self) -> str:
        return f"s3://{self.bucket}/{self.prefix}" if self.prefix else f"s3://{self.bucket}"

    @property
    def endpoint(self) -> str:
        return str(self._client.meta.endpoint_url)

    def _key(self, name: str) -> str:
        return f"{self.prefix}/{name}" if self.prefix else name

    def _call(self, action: str, name: str, call: Callable[..., T], **arguments: Any) -> T:
        """Run one S3 call; every failure becomes `_error`, naming the object."""
        where = f"{self.uri}/{name}" if name else self.uri
        try:
            return call(**arguments)
        except ClientError as exc:
            raise self._refused(action, where, exc) from exc
        except S3UploadFailedError as exc:
            # boto3's transfer manager wraps the ClientError of a failed upload in this.
            cause = exc.__context__
            if isinstance(cause, ClientError):
                raise self._refused(action, where, cause) from exc
            raise self._failed(action, where, exc) from exc
        except BotoCoreError as exc:
            raise self._failed(action, where, exc) from exc

    def _refused(self, action: str, where: str, exc: ClientError) -> Exception:
        status, code = status_of(exc), code_of(exc)
        if code == "NoSuchBucket":
            message = f"cannot {action} {where}: bucket {self.bucket!r} does not exist"
        else:
            detail = exc.response.get("Error", {}).get("Message", "")
            message = f"cannot {action} {where}: HTTP {status} {code} {detail}".rstrip()
        return self._error(self._scrub(f"{message} (endpoint {self.endpoint})"), status, code)

    def _failed(self, action: str, where: str, exc: Exception) -> Exception:
        message = f"cannot {action} {where}: S3 endpoint {self.endpoint} failed: {exc}"
        return self._error(self._scrub(message), 0, "")

    def _scrub(self, message: str) -> str:
        secret = self.settings.secret_access_key
        return message.replace(secret, "***") if secret else message


def status_of(exc: ClientError) -> int:
    return int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0))


def code_of(exc: ClientError) -> str:
    return str(exc.response.get("Error", {}).get("Code", ""))


def make_client(settings: S3Settings) -> Any:
    session = boto3.session.Session(
        aws_access_key_id=settings.access_key_id,
        aws_secret_access_key=settings.secret_access_key,
        region_name=settings.region,
    )
    return session.client(
        "s3", endpoint_url=settings.endpoint_url, config=settings.botocore_config()
    )
