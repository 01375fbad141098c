"""The sink's options: parsed and validated once, on the driver, then carried to the tasks."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from kafka_txn_sink.commit_log import LOG_FORMATS, LogFormat
from kafka_txn_sink.errors import ConfigError
from kafka_txn_sink.files.references import OPTION_KEYS as FILES_OPTION_KEYS
from kafka_txn_sink.files.references import FilesOptions, parse_files_options
from kafka_txn_sink.protocol.txn_ids import validate_sink_id
from kafka_txn_sink.storage import S3Settings

KAFKA_PREFIX = "kafka."

# librdkafka settings the sink sets itself: a user value would break the protocol.
OWNED_KAFKA_SETTINGS = {
    "transactional.id": "the sink derives transactional ids from sinkId",
    "enable.idempotence": "transactions need idempotence, which the sink turns on",
    "acks": "the sink writes with acks=all",
    "request.required.acks": "the sink writes with acks=all",
    "statistics.interval.ms": "the sink reads the producer id and epoch from statistics",
    "isolation.level": "the sink's probes read with read_committed",
    "enable.gapless.guarantee": "the sink relies on transactions, not on gapless mode",
}

# Spark's own Kafka sink options that have no meaning here, rejected so nobody relies on them.
_REJECTED = {
    "asyncprogresstrackingenabled": "async progress tracking can change a batch's offsets after "
    "a failure, which breaks exactly-once; remove asyncProgressTrackingEnabled",
    "kafka.key.serializer": "keys are written as bytes; cast the key column instead",
    "kafka.value.serializer": "values are written as bytes; cast the value column instead",
}

_SECRET_HINTS = ("password", "secret", "jaas", "token", "ssl.key", "credentials")

_KNOWN = {
    "sinkid",
    "commitlog",
    "commitlogformat",
    "topic",
    "transactiontimeoutms",
    "committimeoutms",
    "commitlogtimeoutms",
    "clockskewms",
    "s3.endpoint",
    "s3.region",
    "s3.accesskeyid",
    "s3.secretaccesskey",
    "s3.pathstyle",
    # Spark passes these through to every sink; they are Spark's, not ours.
    "asyncprogresstrackingenabled",
    "asyncprogresstrackingcheckpointintervalms",
    "checkpointlocation",
    "queryname",
    *FILES_OPTION_KEYS,
}

MIN_TRANSACTION_TIMEOUT_MS = 1_000


def is_secret(key: str) -> bool:
    lowered = key.lower()
    return any(hint in lowered for hint in _SECRET_HINTS)


def redact(settings: Mapping[str, Any]) -> dict[str, Any]:
    """A copy that is safe to log or put in an error message."""
    return {k: ("***" if is_secret(k) else v) for k, v in settings.items()}


@dataclass(frozen=True)
class SinkOptions:
    sink_id: str
    commit_log: str
    bootstrap_servers: str
    topic: str | None
    # None until resolved against the broker's transaction.max.timeout.ms.
    transaction_timeout_ms: int | None
    commit_timeout_ms: int
    commit_log_timeout_ms: int
    clock_skew_ms: int
    kafka: dict[str, str] = field(repr=False)
    s3: S3Settings = field(default_factory=S3Settings)
    commit_log_format: LogFormat = "json"
    files: FilesOptions | None = None  # files mode, when option path is set

    @property
    def records_mode(self) -> bool:
        """Rows go to Kafka as records: with option topic, or whenever files mode is off."""
        return self.topic is not None or self.files is None

    def __repr__(self) -> str:
        return (
            f"SinkOptions(sink_id={self.sink_id!r}, commit_log={self.commit_log!r}, "
            f"bootstrap_servers={self.bootstrap_servers!r}, topic={self.topic!r}, "
            f"transaction_timeout_ms={self.transaction_timeout_ms}, kafka={redact(self.kafka)})"
        )

    @property
    def margin_ms(self) -> int:
        """Time a prepared transaction must still have when the driver decides to commit it.

        It covers the decision write, the EndTxn round and the clocks of driver and broker
        disagreeing; each of those has an explicit client deadline.
        """
        return self.commit_log_timeout_ms + self.commit_timeout_ms + self.clock_skew_ms

    def with_transaction_timeout(self, timeout_ms: int) -> SinkOptions:
        return replace(self, transaction_timeout_ms=timeout_ms)

    def require_transaction_timeout(self) -> int:
        if self.transaction_timeout_ms is None:
            raise ConfigError("transactionTimeoutMs was not resolved against the broker")
        return self.transaction_timeout_ms


def parse_options(raw: Mapping[str, str]) -> SinkOptions:
    """Validate the user's options; every error names the option.

    Raises:
        ConfigError: an option is missing, malformed, unknown, or owned by the sink.
    """
    options = {str(k).lower(): str(v) for k, v in raw.items()}
    originals = {str(k).lower(): str(k) for k in raw}
    _reject_forbidden(options)
    kafka = _kafka_settings(raw)
    _reject_unknown(options, originals)
    log_timeout_ms = _bounded(options, "commitlogtimeoutms", "commitLogTimeoutMs", 30_000)
    s3 = _s3_settings(options, log_timeout_ms)
    bootstrap = kafka.pop("bootstrap.servers", "").strip()
    if not bootstrap:
        raise ConfigError("option kafka.bootstrap.servers is required (host:port[,host:port])")
    timeout = _optional_int(options, "transactiontimeoutms", "transactionTimeoutMs")
    if timeout is None:
        timeout = _int_value(
            kafka.pop("transaction.timeout.ms", None), "kafka.transaction.timeout.ms"
        )
    else:
        kafka.pop("transaction.timeout.ms", None)
    if timeout is not None:
        # No upper bound here: the brokers' transaction.max.timeout.ms is the one that counts.
        _check_bounds(timeout, "transactionTimeoutMs", MIN_TRANSACTION_TIMEOUT_MS, 2**31 - 1)
    topic = options.get("topic", "").strip() or None
    return SinkOptions(
        sink_id=validate_sink_id(options.get("sinkid", "")),
        commit_log=_required(options, "commitlog", "commitLog"),
        bootstrap_servers=bootstrap,
        topic=topic,
        transaction_timeout_ms=timeout,
        commit_timeout_ms=_bounded(options, "committimeoutms", "commitTimeoutMs", 30_000),
        commit_log_timeout_ms=log_timeout_ms,
        clock_skew_ms=_bounded(options, "clockskewms", "clockSkewMs", 5_000, low=0),
        kafka=kafka,
        s3=s3,
        commit_log_format=_log_format(options),
        files=parse_files_options(options),
    )


def _reject_forbidden(options: Mapping[str, str]) -> None:
    for key, why in _REJECTED.items():
        if key in options and (key != "asyncprogresstrackingenabled" or _truthy(options[key])):
            raise ConfigError(f"option {key} is not supported: {why}")


def _kafka_settings(raw: Mapping[str, str]) -> dict[str, str]:
    kafka: dict[str, str] = {}
    for key, value in raw.items():
        if not str(key).lower().startswith(KAFKA_PREFIX):
            continue
        name = str(key)[len(KAFKA_PREFIX) :]
        if name.lower() in OWNED_KAFKA_SETTINGS:
            raise ConfigError(
                f"option kafka.{name} cannot be set: {OWNED_KAFKA_SETTINGS[name.lower()]}"
            )
        kafka[name] = str(value)
    return kafka


def _reject_unknown(options: Mapping[str, str], originals: Mapping[str, str]) -> None:
    unknown = sorted(
        originals[k] for k in options if k not in _KNOWN and not k.startswith(KAFKA_PREFIX)
    )
    if unknown:
        raise ConfigError(
            f"unknown option(s) {', '.join(unknown)}; Kafka client settings take the "
            f"prefix 'kafka.' (for example kafka.linger.ms)"
        )


def _s3_settings(options: Mapping[str, str], log_timeout_ms: int) -> S3Settings:
    """S3 deadlines fit inside commitLogTimeoutMs, which the prepare check's margin counts."""
    endpoint = options.get("s3.endpoint") or None
    path_style = options.get("s3.pathstyle")
    attempts = 3
    per_call_s = log_timeout_ms / 1000 / attempts / 2
    return S3Settings(
        connect_timeout_s=per_call_s,
        read_timeout_s=per_call_s,
        max_attempts=attempts,
        endpoint_url=endpoint,
        region=options.get("s3.region") or None,
        access_key_id=options.get("s3.accesskeyid") or None,
        secret_access_key=options.get("s3.secretaccesskey") or None,
        path_style=_truthy(path_style) if path_style is not None else endpoint is not None,
    )


def _log_format(options: Mapping[str, str]) -> LogFormat:
    value = options.get("commitlogformat", "").strip().lower() or "json"
    for known in LOG_FORMATS:
        if value == known:
            return known
    raise ConfigError(
        f"option commitLogFormat must be one of {', '.join(LOG_FORMATS)}, got "
        f"{options['commitlogformat']!r}"
    )


def _required(options: Mapping[str, str], key: str, name: str) -> str:
    value = options.get(key, "").strip()
    if not value:
        raise ConfigError(f"option {name} is required")
    return value


def _optional_int(options: Mapping[str, str], key: str, name: str) -> int | None:
    return _int_value(options.get(key), name)


def _int_value(value: str | None, name: str) -> int | None:
    if value is None or not value.strip():
        return None
    try:
        return int(value.strip())
    except ValueError:
        raise ConfigError(
            f"option {name} must be a whole number of milliseconds, got {value!r}"
        ) from None


def _bounded(options: Mapping[str, str], key: str, name: str, default: int, low: int = 100) -> int:
    value = _optional_int(options, key, name)
    if value is None:
        return default
    _check_bounds(value, name, low, 3_600_000)
    return value


def _check_bounds(value: int, name: str, low: int, high: int) -> None:
    if not low <= value <= high:
        raise ConfigError(f"option {name} must be between {low} and {high} ms, got {value}")


def _truthy(value: str) -> bool:
    return value.strip().lower() in {"true", "1", "yes"}
