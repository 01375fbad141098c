"""Files mode: its options, and the reference message each task publishes for each file.

A task writes its rows into Avro files (`avro_files.FileSet`), uploads them under names unique
to the attempt, then produces one reference per file to `referencesTopic` inside the same
Kafka transaction as its records (if any). The files exist before the decision, but only the
files a decision lists are referenced for read_committed consumers; the commit log lists them too.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from kafka_txn_sink.errors import ConfigError
from kafka_txn_sink.files import writer as avro_files
from kafka_txn_sink.files.writer import FilePlan, WrittenFile, plan_files, store_schema
from kafka_txn_sink.protocol.messages import FileRef
from kafka_txn_sink.storage.files import FileSink

REFERENCE_KIND = "kafka_txn_sink.file"
REFERENCE_VERSION = 1
DEFAULT_SCHEMA_INLINE_MAX_BYTES = 64 * 1024

# Lower-cased option keys of files mode (Spark hands options over case-insensitively).
OPTION_KEYS = frozenset(
    {
        "path",
        "referencestopic",
        "partitionby",
        "timepartitioncolumn",
        "timepartitionpattern",
        "timepartitiontimezone",
        "payloadcolumn",
        "avrocodec",
        "maxrecordsperfile",
        "maxbytesperfile",
        "maxopenfiles",
        "irreconcilabletypes",
        "schemainlinemaxbytes",
    }
)


@dataclass(frozen=True)
class FilesOptions:
    path: str
    references_topic: str
    partition_by: tuple[str, ...]
    time_column: str | None
    time_pattern: str | None
    time_zone: str
    payload_column: str | None
    codec: str
    max_records_per_file: int
    max_bytes_per_file: int
    max_open_files: int
    irreconcilable: str
    schema_inline_max_bytes: int

    def plan(self, schema: Any) -> FilePlan:
        """Check these options against the input schema (driver side).

        Raises:
            ConfigError / InputError: an option or a column does not fit; the message names it.
        """
        if self.irreconcilable not in ("union", "string"):
            raise ConfigError(
                f"option irreconcilableTypes must be union or string, got {self.irreconcilable!r}"
            )
        return plan_files(
            schema,
            partition_by=self.partition_by,
            time_column=self.time_column,
            time_pattern=self.time_pattern,
            time_zone_name=self.time_zone,
            payload_column=self.payload_column,
            codec=self.codec,
            max_records_per_file=self.max_records_per_file,
            max_bytes_per_file=self.max_bytes_per_file,
            max_open_files=self.max_open_files,
            irreconcilable="string" if self.irreconcilable == "string" else "union",
        )


def parse_files_options(options: Mapping[str, str]) -> FilesOptions | None:
    """Files mode is on when `path` is set; None otherwise. Keys are lower-cased already.

    Raises:
        ConfigError: `referencesTopic` is missing, or a number is not a number.
    """
    path = options.get("path", "").strip()
    if not path:
        unused = sorted(k for k in OPTION_KEYS - {"path"} if k in options)
        if unused:
            raise ConfigError(f"option(s) {', '.join(unused)} need option path (files mode)")
        return None
    topic = options.get("referencestopic", "").strip()
    if not topic:
        raise ConfigError("option referencesTopic is required with option path (files mode)")
    partition_by = tuple(c.strip() for c in options.get("partitionby", "").split(",") if c.strip())
    return FilesOptions(
        path=path,
        references_topic=topic,
        partition_by=partition_by,
        time_column=options.get("timepartitioncolumn") or None,
        time_pattern=options.get("timepartitionpattern") or None,
        time_zone=options.get("timepartitiontimezone") or "UTC",
        payload_column=options.get("payloadcolumn") or None,
        # As the plan checks it and the file's header names it: references carry this spelling.
        codec=(options.get("avrocodec") or "null").strip().lower(),
        max_records_per_file=_number(options, "maxrecordsperfile", "maxRecordsPerFile", 0),
        max_bytes_per_file=_number(
            options, "maxbytesperfile", "maxBytesPerFile", avro_files.DEFAULT_MAX_BYTES
        ),
        max_open_files=_number(
            options, "maxopenfiles", "maxOpenFiles", avro_files.DEFAULT_MAX_OPEN_FILES
        ),
        irreconcilable=options.get("irreconcilabletypes") or "union",
        schema_inline_max_bytes=_number(
            options, "schemainlinemaxbytes", "schemaInlineMaxBytes", DEFAULT_SCHEMA_INLINE_MAX_BYTES
        ),
    )


@dataclass(frozen=True)
class Reference:
    key: bytes
    value: bytes


def reference(
    written: WrittenFile,
    *,
    sink: FileSink,
    sink_id: str,
    batch_id: int,
    codec: str,
    inline_max_bytes: int,
) -> Reference:
    """The message that publishes one file: where it is, what it holds, and its schema.

    The schema is inline up to `inline_max_bytes`; above, the message carries its fingerprint
    and where the schema is stored beside the files, so a reference never nears the broker's
    message size limit.
    """
    schema_text = json.dumps(written.schema, sort_keys=True, separators=(",", ":"))
    body: dict[str, Any] = {
        "kind": REFERENCE_KIND,
        "version": REFERENCE_VERSION,
        "sink_id": sink_id,
        "batch_id": batch_id,
        **written.ref.to_json(),
        "codec": codec,
    }
    if len(schema_text.encode()) <= inline_max_bytes:
        body["schema"] = written.schema
    else:
        body["schema_location"] = sink.location(store_schema(sink, written.schema))
    return Reference(
        key=written.ref.partition_path.encode(),
        value=json.dumps(body, sort_keys=True, separators=(",", ":")).encode(),
    )


def parse_reference(value: bytes) -> FileRef:
    """The file a reference message names (for readers and the verifier)."""
    body = json.loads(value)
    if body.get("kind") != REFERENCE_KIND:
        raise ValueError(f"not a kafka_txn_sink file reference: {str(body)[:200]}")
    fields = FileRef.__dataclass_fields__
    return FileRef(**{k: v for k, v in body.items() if k in fields})


def _number(options: Mapping[str, str], key: str, name: str, default: int) -> int:
    raw = options.get(key)
    if raw is None or not raw.strip():
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ConfigError(f"option {name} must be a whole number, got {raw!r}") from None
    if value < 0:
        raise ConfigError(f"option {name} must not be negative, got {value}")
    return value
