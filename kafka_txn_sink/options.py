"""The sink's options: one table, from which parsing, defaults, errors and the README come.

Every option the sink takes is an `Option` in `OPTIONS` below (the sink's own here; files mode's,
the record formats', consumerGroup's and createTopics' from their modules); its name is spelled
nowhere else (error messages format the `Option`, and `python -m kafka_txn_sink.options` prints
the README's tables).
Options are parsed and validated once, on the driver, into a `SinkOptions` that travels to the
tasks. Spark hands options over case-insensitively, so names match in any case.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from kafka_txn_sink import margin
from kafka_txn_sink.commit_log import LOG_FORMATS, LogFormat
from kafka_txn_sink.dead_letter_options import (
    DEAD_LETTER_OPTIONS,
    DeadLetterOptions,
    parse_dead_letter_options,
)
from kafka_txn_sink.errors import ConfigError
from kafka_txn_sink.files_options import (
    FILES_OPTIONS,
    REFERENCES_TOPIC,
    FilesOptions,
    parse_files_options,
)
from kafka_txn_sink.group_options import (
    GROUP_KAFKA_PREFIX,
    GROUP_OPTIONS,
    GroupOptions,
    parse_group_options,
)
from kafka_txn_sink.kafka.producer_settings import producer_config
from kafka_txn_sink.kafka.security import option_settings
from kafka_txn_sink.option import Option, truthy
from kafka_txn_sink.protocol.txn_ids import validate_sink_id
from kafka_txn_sink.redaction import mask_in_logs, redact
from kafka_txn_sink.serde.options import (
    KEY_FORMAT,
    REGISTRY_PREFIX,
    REGISTRY_SETTINGS,
    SERDE_OPTIONS,
    VALUE_FORMAT,
    SerdeOptions,
    parse_serde_options,
)
from kafka_txn_sink.storage import S3Settings
from kafka_txn_sink.topic_options import (
    TOPIC_CONFIG_PREFIX,
    TOPIC_OPTIONS,
    TopicCreation,
    parse_topic_options,
)

# -- the sink -----------------------------------------------------------------------------------
BOOTSTRAP = Option(
    "kafka.bootstrap.servers",
    "brokers, as for Spark's Kafka sink (host:port[,host:port])",
    "",
    "yes",
)
TOPIC = Option(
    "topic",
    "output topic of records mode; wins over a `topic` column, as in Spark's Kafka sink (the "
    "column routes only without it); may not be `referencesTopic`",
    "",
    "unless a `topic` column exists",
)
SINK_ID = Option(
    "sinkId",
    "letters, digits, `.`, `_`; prefixes the transactional ids `{sinkId}-{slot}-{partition}`. "
    "Keep it stable across restarts and unique per sink",
    "",
    "yes",
)
COMMIT_LOG = Option(
    "commitLog",
    "where decisions are recorded: a local/mounted path or `s3://bucket/prefix`",
    "",
    "yes",
)
TRANSACTION_TIMEOUT = Option(
    "transactionTimeoutMs",
    "the tasks' transaction timeout (also accepted as `kafka.transaction.timeout.ms`); above the "
    "brokers' `transaction.max.timeout.ms` is an error, and so is one not above the commit "
    "margin",
    "the brokers' `transaction.max.timeout.ms`",
)
COMMIT_TIMEOUT = Option(
    "commitTimeoutMs", "deadline for the EndTxn round and every driver request to Kafka", "30000"
)
COMMIT_LOG_TIMEOUT = Option(
    "commitLogTimeoutMs",
    "deadline for one commit-log write (S3 timeouts are derived from it)",
    "30000",
)
CLOCK_SKEW = Option("clockSkewMs", "allowance for driver/broker clock difference", "5000")
COMMIT_LOG_FORMAT = Option(
    "commitLogFormat",
    "`json`: one small JSON object per record; `delta`: the same records as rows of a Delta "
    "table at `commitLog` (written with delta-rs), queryable with Spark SQL or any Delta reader",
    "`json`",
)
S3_ENDPOINT = Option(
    "s3.endpoint",
    "S3-compatible endpoint of an `s3://` commit log or files path (AWS S3, MinIO, ...)",
    "AWS S3",
)
S3_REGION = Option("s3.region", "region of the S3 bucket", "boto3's")
S3_ACCESS_KEY_ID = Option("s3.accessKeyId", "S3 access key id", "boto3's credential chain")
S3_SECRET_ACCESS_KEY = Option(
    "s3.secretAccessKey", "S3 secret access key (never logged)", "boto3's credential chain"
)
S3_PATH_STYLE = Option(
    "s3.pathStyle", "path-style S3 addressing", "`true` with `s3.endpoint`, else `false`"
)
WRITE_ID = Option(
    "writeId",
    "the id of a batch write (`df.write`), 1-200 printable characters: a write is committed at "
    "most once per id, so a re-run after a failure completes or redoes it and a re-run after a "
    "success writes nothing. Refused in streaming queries",
    "",
    "in batch writes",
)
HEADER_COLUMNS = Option(
    "headerColumns",
    "comma-separated string or binary columns, each written as a header of its name after the "
    "`headers` column's (records mode; a null cell is a header without a value)",
)
PROVENANCE_HEADERS = Option(
    "provenanceHeaders",
    "`true`: each record also gets headers `kts.sink` (the sink id), `kts.batch` (the batch id), "
    "`kts.task` (the Spark partition) and `kts.seq` (the row's ordinal in its task), after every "
    "other header, so readers that cannot read transactionally can audit what they read (and, "
    "where a replay hands each task the same rows in the same order, de-duplicate by them); "
    "records mode; records then go one by one, not through the columnar fast path",
    "`false`",
)
KAFKA_SETTINGS = Option(
    "kafka.<librdkafka setting>",
    "passed to the producer (e.g. `kafka.linger.ms`, `kafka.compression.type`, SASL/TLS settings)",
)

OPTIONS: tuple[Option, ...] = (
    BOOTSTRAP,
    TOPIC,
    SINK_ID,
    COMMIT_LOG,
    TRANSACTION_TIMEOUT,
    COMMIT_TIMEOUT,
    COMMIT_LOG_TIMEOUT,
    CLOCK_SKEW,
    COMMIT_LOG_FORMAT,
    S3_ENDPOINT,
    S3_REGION,
    S3_ACCESS_KEY_ID,
    S3_SECRET_ACCESS_KEY,
    S3_PATH_STYLE,
    WRITE_ID,
    HEADER_COLUMNS,
    PROVENANCE_HEADERS,
    KAFKA_SETTINGS,
    *FILES_OPTIONS,
    *SERDE_OPTIONS,
    *GROUP_OPTIONS,
    *TOPIC_OPTIONS,
    *DEAD_LETTER_OPTIONS,
)

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

# Spark passes these through to every sink; they are Spark's, not ours.
_SPARK_OPTIONS = frozenset(
    {
        "asyncprogresstrackingenabled",
        "asyncprogresstrackingcheckpointintervalms",
        "checkpointlocation",
        "queryname",
    }
)
_KNOWN = frozenset(
    o.key for o in OPTIONS if o not in (KAFKA_SETTINGS, REGISTRY_SETTINGS, TOPIC_OPTIONS[-1])
)
_KNOWN |= _SPARK_OPTIONS

MIN_TRANSACTION_TIMEOUT_MS = 1_000
MAX_WRITE_ID_LENGTH = 200


@dataclass(frozen=True)
class SinkOptions:
    """Every option of one sink, parsed and validated."""

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
    write_id: str | None = None  # a batch write's id (option writeId); None in streaming
    serde: SerdeOptions = field(default_factory=SerdeOptions)  # records' key and value formats
    progress: GroupOptions | None = None  # option consumerGroup
    header_columns: tuple[str, ...] = ()  # option headerColumns
    provenance_headers: bool = False  # option provenanceHeaders
    dead_letter: DeadLetterOptions | None = None  # option badRows=deadLetter
    create_topics: TopicCreation | None = None  # option createTopics

    @property
    def records_mode(self) -> bool:
        """Rows go to Kafka as records: with option topic, or whenever files mode is off."""
        return self.topic is not None or self.files is None

    def __repr__(self) -> str:
        return (
            f"SinkOptions(sink_id={self.sink_id!r}, commit_log={self.commit_log!r}, "
            f"bootstrap_servers={self.bootstrap_servers!r}, topic={self.topic!r}, "
            f"transaction_timeout_ms={self.transaction_timeout_ms}, write_id={self.write_id!r}, "
            f"kafka={redact(self.kafka)})"
        )

    @property
    def margin_ms(self) -> int:
        """Time a prepared transaction must still have when the driver decides to commit it:
        every step from the prepare check to the last EndTxn at its deadline (margin.py)."""
        return sum(step.bound_ms for step in self._commit_path())

    def explain_margin(self) -> str:
        """The steps `margin_ms` adds up, for messages (margin.commit_path)."""
        return margin.explain(self._commit_path())

    def _commit_path(self) -> tuple[margin.Step, ...]:
        in_txn = self.progress is not None and not self.progress.elsewhere  # progress.py
        return margin.commit_path(
            self.commit_log_timeout_ms,
            self.commit_timeout_ms,
            self.clock_skew_ms,
            self.commit_log_format,
            progress=in_txn,
        )

    @property
    def client_timeout_s(self) -> float:
        """Deadline of one Kafka client call of the tasks and the driver, in seconds."""
        return self.commit_timeout_ms / 1000

    def producer_config(self, txn_id: str) -> dict[str, Any]:
        """The settings of a transactional producer of id `txn_id` (tasks and republishing).

        Its secrets are masked in this process's logs from now on: tasks get the options
        unpickled, never parsed.
        """
        mask_in_logs(self.kafka)
        return producer_config(
            self.bootstrap_servers, self.kafka, txn_id, self.require_transaction_timeout()
        )

    def with_transaction_timeout(self, timeout_ms: int) -> SinkOptions:
        """These options with the transaction timeout resolved against the brokers."""
        return replace(self, transaction_timeout_ms=timeout_ms)

    def require_transaction_timeout(self) -> int:
        """The resolved transaction timeout.

        Raises:
            ConfigError: it was not resolved against the brokers yet.
        """
        if self.transaction_timeout_ms is None:
            raise ConfigError(f"{TRANSACTION_TIMEOUT} was not resolved against the broker")
        return self.transaction_timeout_ms


def parse_options(raw: Mapping[str, str]) -> SinkOptions:
    """Validate the user's options; every error names the option.

    Raises:
        ConfigError: an option is missing, malformed, unknown, or owned by the sink.
        MissingExtraError: an option needs an extra of the package that is not installed.
        ConfigError: a Kafka client's version is outside its tested range.
    """
    options = {str(k).lower(): str(v) for k, v in raw.items()}
    originals = {str(k).lower(): str(k) for k in raw}
    mask_in_logs(options)
    _reject_forbidden(options)
    kafka = option_settings(_kafka_settings(raw))
    _reject_unknown(options, originals)
    log_timeout_ms = _bounded(options, COMMIT_LOG_TIMEOUT, 30_000)
    s3 = _s3_settings(options, log_timeout_ms)
    bootstrap = kafka.pop("bootstrap.servers", "").strip()
    if not bootstrap:
        raise ConfigError(f"option {BOOTSTRAP} is required (host:port[,host:port])")
    timeout = _int_value(options.get(TRANSACTION_TIMEOUT.key), str(TRANSACTION_TIMEOUT))
    if timeout is None:
        timeout = _int_value(
            kafka.pop("transaction.timeout.ms", None), "kafka.transaction.timeout.ms"
        )
    else:
        kafka.pop("transaction.timeout.ms", None)
    if timeout is not None:
        # No upper bound here: the brokers' transaction.max.timeout.ms is the one that counts.
        _check_bounds(timeout, str(TRANSACTION_TIMEOUT), MIN_TRANSACTION_TIMEOUT_MS, 2**31 - 1)
    topic = options.get(TOPIC.key, "").strip() or None
    files = parse_files_options(options)
    if files is not None and topic == files.references_topic:
        raise ConfigError(
            f"option {TOPIC} and option {REFERENCES_TOPIC} name the same topic {topic!r}: "
            f"consumers take every message there as a committed file reference, so no row may "
            f"be written to it; give records mode another topic"
        )
    parsed = SinkOptions(
        sink_id=validate_sink_id(options.get(SINK_ID.key, "")),
        commit_log=_required(options, COMMIT_LOG),
        bootstrap_servers=bootstrap,
        topic=topic,
        transaction_timeout_ms=timeout,
        commit_timeout_ms=_bounded(options, COMMIT_TIMEOUT, 30_000),
        commit_log_timeout_ms=log_timeout_ms,
        clock_skew_ms=_bounded(options, CLOCK_SKEW, 5_000, low=0),
        kafka=kafka,
        s3=s3,
        commit_log_format=_log_format(options),
        files=files,
        write_id=_write_id(options),
        serde=parse_serde_options(options, raw),
        progress=parse_group_options(options, records_mode=topic is not None or files is None),
        header_columns=tuple(
            c.strip() for c in options.get(HEADER_COLUMNS.key, "").split(",") if c.strip()
        ),
        provenance_headers=truthy(options.get(PROVENANCE_HEADERS.key, "false")),
        create_topics=parse_topic_options(options),
        dead_letter=parse_dead_letter_options(
            options,
            records_mode=topic is not None or files is None,
            reserved={
                str(TOPIC): topic,
                str(REFERENCES_TOPIC): files.references_topic if files is not None else None,
            },
        ),
    )
    if parsed.header_columns and not parsed.records_mode:
        raise ConfigError(f"option {HEADER_COLUMNS} is for records mode (option {TOPIC})")
    if parsed.provenance_headers and not parsed.records_mode:
        raise ConfigError(f"option {PROVENANCE_HEADERS} is for records mode (option {TOPIC})")
    if parsed.serde.uses_registry and not parsed.records_mode:
        raise ConfigError(
            f"options {KEY_FORMAT} and {VALUE_FORMAT} are for records mode (option {TOPIC}); "
            f"files mode writes Avro files of its own schema"
        )
    return parsed


def options_tables() -> str:
    """The README's option tables (Markdown): the sink's, files mode's, the record formats'."""
    sections = []
    groups = (
        ("sink", "Sink options"),
        ("files", "Files mode options"),
        ("registry", "Record formats and the Schema Registry (records mode)"),
    )
    for group, title in groups:
        header = ["| option | required | default | meaning |", "|---|---|---|---|"]
        lines = [f"#### {title}", "", *header]
        for option in OPTIONS:
            if option.group == group:
                lines.append(
                    f"| `{option.name}` | {option.required} | {option.default} | {option.meaning} |"
                )
        sections.append("\n".join(lines))
    return "\n\n".join(sections) + "\n"


def _reject_forbidden(options: Mapping[str, str]) -> None:
    for key, why in _REJECTED.items():
        if key in options and (key != "asyncprogresstrackingenabled" or truthy(options[key])):
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
        originals[k]
        for k in options
        if k not in _KNOWN
        and not k.startswith(
            (KAFKA_PREFIX, REGISTRY_PREFIX, GROUP_KAFKA_PREFIX, TOPIC_CONFIG_PREFIX)
        )
    )
    if unknown:
        raise ConfigError(
            f"unknown option(s) {', '.join(unknown)}; Kafka client settings take "
            "the prefix 'kafka.' (for example kafka.linger.ms)"
        )


def _s3_settings(options: Mapping[str, str], log_timeout_ms: int) -> S3Settings:
    """S3 deadlines fit inside commitLogTimeoutMs, which the prepare check's margin counts."""
    endpoint, path_style = options.get(S3_ENDPOINT.key) or None, options.get(S3_PATH_STYLE.key)
    attempts = 3
    per_call_s = log_timeout_ms / 1000 / attempts / 2
    return S3Settings(
        connect_timeout_s=per_call_s,
        read_timeout_s=per_call_s,
        max_attempts=attempts,
        endpoint_url=endpoint,
        region=options.get(S3_REGION.key) or None,
        access_key_id=options.get(S3_ACCESS_KEY_ID.key) or None,
        secret_access_key=options.get(S3_SECRET_ACCESS_KEY.key) or None,
        path_style=truthy(path_style) if path_style is not None else endpoint is not None,
    )


def _log_format(options: Mapping[str, str]) -> LogFormat:
    value = options.get(COMMIT_LOG_FORMAT.key, "").strip().lower() or "json"
    for known in LOG_FORMATS:
        if value == known:
            return known
    raise ConfigError(
        f"option {COMMIT_LOG_FORMAT} must be one of {', '.join(LOG_FORMATS)}, got "
        f"{options[COMMIT_LOG_FORMAT.key]!r}"
    )


def _write_id(options: Mapping[str, str]) -> str | None:
    raw = options.get(WRITE_ID.key)
    if raw is None:
        return None
    value = raw.strip()
    if not 1 <= len(value) <= MAX_WRITE_ID_LENGTH or not value.isprintable():
        raise ConfigError(
            f"option {WRITE_ID} must be 1-{MAX_WRITE_ID_LENGTH} printable characters, "
            f"got {raw[: MAX_WRITE_ID_LENGTH + 20]!r}"
        )
    return value


def _required(options: Mapping[str, str], option: Option) -> str:
    value = options.get(option.key, "").strip()
    if not value:
        raise ConfigError(f"option {option} is required")
    return value


def _int_value(value: str | None, name: str) -> int | None:
    if value is None or not value.strip():
        return None
    try:
        return int(value.strip())
    except ValueError:
        raise ConfigError(
            f"option {name} must be a whole number of milliseconds, got {value!r}"
        ) from None


def _bounded(options: Mapping[str, str], option: Option, default: int, low: int = 100) -> int:
    value = _int_value(options.get(option.key), str(option))
    if value is None:
        return default
    _check_bounds(value, str(option), low, 3_600_000)
    return value


def _check_bounds(value: int, name: str, low: int, high: int) -> None:
    if not low <= value <= high:
        raise ConfigError(f"option {name} must be between {low} and {high} ms, got {value}")


if __name__ == "__main__":
    sys.stdout.write(options_tables())
