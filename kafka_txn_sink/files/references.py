"""Files mode: the reference message each task publishes for each file.

A task writes its rows into Avro files (`writer.FileSet`), uploads them under names unique
to the attempt, then produces one reference per file to `referencesTopic` inside the same
Kafka transaction as its records (if any). The files exist before the decision, but only the
files a decision lists are referenced for read_committed consumers; the commit log lists them too.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from kafka_txn_sink.files.avro_names import schema_digest
from kafka_txn_sink.files.naming import schema_file_name
from kafka_txn_sink.protocol.messages import FileRef
from kafka_txn_sink.storage.files import FileSink

REFERENCE_KIND = "kafka_txn_sink.file"
"""The `kind` of every reference message, which tells it from other messages of the topic."""
REFERENCE_VERSION = 1
"""The version of the reference message's layout."""


@dataclass(frozen=True)
class WrittenFile:
    """A file a task wrote and uploaded, with the Avro schema its reference needs."""

    ref: FileRef
    schema: dict[str, Any]
    name: str  # relative to the sink's root


def store_schema(sink: FileSink, schema: dict[str, Any]) -> str:
    """Write `schema` beside the files as `_schemas/<sha256>.avsc` (once); returns that name."""
    name = schema_file_name(schema_digest(schema))
    sink.put_text(name, json.dumps(schema, sort_keys=True, separators=(",", ":")))
    return name


@dataclass(frozen=True)
class Reference:
    """One reference message: keyed by the file's partition path, the JSON body as value."""

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
