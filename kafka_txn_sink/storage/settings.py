"""How to reach an S3-compatible endpoint: plain settings, so parsing options never loads boto3."""

from __future__ import annotations

from dataclasses import dataclass, field

from kafka_txn_sink.errors import ConfigError


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
        """Whether requests name the bucket in the path rather than in the host name."""
        return self.path_style if self.path_style is not None else self.endpoint_url is not None
