"""What to verify: the topics, the ids, the commit log and the files `verify` reads."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from kafka_txn_sink import extras
from kafka_txn_sink.commit_log import LOG_FORMATS
from kafka_txn_sink.errors import ConfigError
from kafka_txn_sink.storage import S3Settings
from kafka_txn_sink.verify.ids import IdSource


@dataclass(frozen=True)
class VerifySpec:
    """What to verify. Records mode needs `output_topics`; files mode `references_topic`
    and/or `path` (with `log`, which lists the files)."""

    bootstrap: str
    input_topics: tuple[str, ...]
    input_id: str = "key"  # key | json:FIELD
    checkpoint: str | None = None  # the query's checkpointLocation: bounds the input
    output_topics: tuple[str, ...] = ()
    output_id: str = "key"
    log: str | None = None  # the sink's commitLog
    log_format: str = "auto"  # auto | json | delta
    references_topic: str | None = None
    path: str | None = None
    file_id_field: str = "id"
    s3: S3Settings | None = None
    kafka: Mapping[str, str] = field(default_factory=dict)
    schema_registry: Mapping[str, str] = field(default_factory=dict)  # its client's settings
    timeout_s: float = 30.0
    stall_timeout_s: float = 60.0

    def check(self) -> tuple[IdSource, IdSource]:
        """The id sources of input and output.

        Raises:
            ConfigError: a missing or contradictory option; the message names it.
        """
        if not self.input_topics:
            raise ConfigError("--input-topic is required")
        if not (self.output_topics or self.references_topic or self.path):
            raise ConfigError(
                "nothing to verify: give --output-topic (records mode) and/or "
                "--references-topic or --path (files mode)"
            )
        if self.path and not self.log:
            raise ConfigError("--path needs --log: orphan files are those no decision lists")
        if self.log_format != "auto" and self.log_format not in LOG_FORMATS:
            raise ConfigError(f"--log-format must be auto, json or delta, not {self.log_format!r}")
        if not self.file_id_field:
            raise ConfigError("--file-id-field must not be empty")
        decode = None
        if self.schema_registry.get("url"):
            extras.require("verify --schema-registry-url", "registry")
            from kafka_txn_sink.serde.decode import WireDecoder

            decode = WireDecoder(self.schema_registry)
        return (
            IdSource.parse(self.input_id, "--input-id", decode),
            IdSource.parse(self.output_id, "--output-id", decode),
        )
