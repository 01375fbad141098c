"""Files mode's options (option `path` set): their table, their defaults, and their parsing.

options.py collects this table with the sink's own and the record formats' into one; the
checks of these options against the query's schema are the driver's plan (files/plan.py).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from kafka_txn_sink.errors import ConfigError
from kafka_txn_sink.option import Option

MiB = 1024 * 1024

PATH = Option("path", "where the files go; turns files mode on", group="files")
REFERENCES_TOPIC = Option(
    "referencesTopic",
    "topic of the reference messages (location, partition values, record count, bytes, batch, "
    "sink, and the file's Avro schema inline up to `schemaInlineMaxBytes`, else its location "
    "under `_schemas/`); no row of records mode is ever written to it",
    "",
    "with `path`",
    group="files",
)
PARTITION_BY = Option(
    "partitionBy",
    "comma-separated columns; Hive-style `col=value` directories with Hive's escaping and "
    "`__HIVE_DEFAULT_PARTITION__` for null",
    group="files",
)
TIME_PARTITION_COLUMN = Option(
    "timePartitionColumn",
    "a timestamp column whose value (never the wall clock) names time directories",
    group="files",
)
TIME_PARTITION_PATTERN = Option(
    "timePartitionPattern",
    "the time directories, with Java date-pattern letters, e.g. `date=yyyy-MM-dd/hour=HH`",
    group="files",
)
TIME_PARTITION_TIME_ZONE = Option(
    "timePartitionTimeZone", "time zone of the time directories", "UTC", group="files"
)
PAYLOAD_COLUMN = Option(
    "payloadColumn",
    "a JSON string column: each file holds these payloads, with the schema inferred and merged "
    "over that file's rows (rules in docs/files_mode.md); without it, files hold every "
    "non-partition column in the schema derived from Spark's",
    group="files",
)
IRRECONCILABLE_TYPES = Option(
    "irreconcilableTypes",
    "`union` or `string` for payload fields whose types cannot be merged",
    "`union`",
    group="files",
)
AVRO_CODEC = Option(
    "avroCodec", "`null`, `deflate`, `snappy`, `zstandard`", "`null`", group="files"
)
MAX_RECORDS_PER_FILE = Option(
    "maxRecordsPerFile", "roll a file after this many records (0: no limit)", "0", group="files"
)
MAX_BYTES_PER_FILE = Option(
    "maxBytesPerFile", "roll a file at about this size", str(128 * MiB), group="files"
)
MAX_OPEN_FILES = Option(
    "maxOpenFiles",
    "open files per task; rows of more keys per task than this interleave into many small "
    "files: raise it, or `repartition(n, <partition columns>)` (Spark cannot sort streams)",
    "32",
    group="files",
)
SCHEMA_INLINE_MAX_BYTES = Option(
    "schemaInlineMaxBytes",
    "largest schema carried inline in a reference message; a larger one is stored under "
    "`_schemas/` and referenced by location",
    str(64 * 1024),
    group="files",
)

FILES_OPTIONS: tuple[Option, ...] = (
    PATH,
    REFERENCES_TOPIC,
    PARTITION_BY,
    TIME_PARTITION_COLUMN,
    TIME_PARTITION_PATTERN,
    TIME_PARTITION_TIME_ZONE,
    PAYLOAD_COLUMN,
    IRRECONCILABLE_TYPES,
    AVRO_CODEC,
    MAX_RECORDS_PER_FILE,
    MAX_BYTES_PER_FILE,
    MAX_OPEN_FILES,
    SCHEMA_INLINE_MAX_BYTES,
)
_FILES_KEYS = frozenset(o.key for o in FILES_OPTIONS)

DEFAULT_MAX_BYTES_PER_FILE = int(MAX_BYTES_PER_FILE.default)
DEFAULT_MAX_OPEN_FILES = int(MAX_OPEN_FILES.default)
DEFAULT_SCHEMA_INLINE_MAX_BYTES = int(SCHEMA_INLINE_MAX_BYTES.default)


@dataclass(frozen=True)
class FilesOptions:
    """The options of files mode (option `path` set), checked against the schema by
    `files.plan.plan_files` on the driver."""

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


def parse_files_options(options: Mapping[str, str]) -> FilesOptions | None:
    """Files mode is on when `path` is set; None otherwise. Keys are lower-cased already.

    Raises:
        ConfigError: `referencesTopic` is missing, or a number is not a number.
    """
    path = options.get(PATH.key, "").strip()
    if not path:
        unused = sorted(k for k in _FILES_KEYS - {PATH.key} if k in options)
        if unused:
            raise ConfigError(f"option(s) {', '.join(unused)} need option {PATH} (files mode)")
        return None
    topic = options.get(REFERENCES_TOPIC.key, "").strip()
    if not topic:
        raise ConfigError(f"option {REFERENCES_TOPIC} is required with option {PATH} (files mode)")
    partition_by = tuple(
        c.strip() for c in options.get(PARTITION_BY.key, "").split(",") if c.strip()
    )
    return FilesOptions(
        path=path,
        references_topic=topic,
        partition_by=partition_by,
        time_column=options.get(TIME_PARTITION_COLUMN.key) or None,
        time_pattern=options.get(TIME_PARTITION_PATTERN.key) or None,
        time_zone=options.get(TIME_PARTITION_TIME_ZONE.key) or "UTC",
        payload_column=options.get(PAYLOAD_COLUMN.key) or None,
        # As the plan checks it and the file's header names it: references carry this spelling.
        codec=(options.get(AVRO_CODEC.key) or "null").strip().lower(),
        max_records_per_file=_number(options, MAX_RECORDS_PER_FILE, 0),
        max_bytes_per_file=_number(options, MAX_BYTES_PER_FILE, DEFAULT_MAX_BYTES_PER_FILE),
        max_open_files=_number(options, MAX_OPEN_FILES, DEFAULT_MAX_OPEN_FILES),
        irreconcilable=options.get(IRRECONCILABLE_TYPES.key) or "union",
        schema_inline_max_bytes=_number(
            options, SCHEMA_INLINE_MAX_BYTES, DEFAULT_SCHEMA_INLINE_MAX_BYTES
        ),
    )


def _number(options: Mapping[str, str], option: Option, default: int) -> int:
    raw = options.get(option.key)
    if raw is None or not raw.strip():
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ConfigError(f"option {option} must be a whole number, got {raw!r}") from None
    if value < 0:
        raise ConfigError(f"option {option} must not be negative, got {value}")
    return value
