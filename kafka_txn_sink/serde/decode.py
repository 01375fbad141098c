"""Reading Confluent's wire format back: for `kafka-txn-sink verify` and the test kit.

A value is magic byte 0, a 4-byte schema id, then the payload; the schema is fetched from the
registry once per id (confluent-kafka's client), and the payload decoded as its type says: Avro
with fastavro, JSON Schema as JSON, protobuf (the message indexes, then the message) as the dict
of protobuf's JSON mapping, with the schema's `.proto` compiled (serde/protobuf.py).
"""

from __future__ import annotations

import io
import json
from collections.abc import Mapping
from typing import Any

from kafka_txn_sink.errors import InputError
from kafka_txn_sink.serde.resolve import registry_client


class WireDecoder:
    """Decodes values of Confluent's wire format against one registry."""

    def __init__(self, settings: Mapping[str, str]) -> None:
        """`settings`: the registry client's (`url`, auth, TLS)."""
        self._client = registry_client(settings)
        self._readers: dict[int, Any] = {}

    def __call__(self, data: bytes) -> Any:
        """The value `data` holds.

        Raises:
            InputError: `data` is not in the wire format, or its schema id is unknown.
        """
        if len(data) < 5 or data[0] != 0:
            raise InputError("not Confluent's wire format (magic byte 0 and a schema id)")
        schema_id = int.from_bytes(data[1:5], "big")
        reader = self._readers.get(schema_id)
        if reader is None:
            reader = self._readers[schema_id] = self._reader(schema_id)
        return reader(data[5:])

    def _reader(self, schema_id: int) -> Any:
        try:
            schema = self._client.get_schema(schema_id)
        except Exception as exc:  # unknown id, or no answer: the record cannot be read
            raise InputError(f"schema id {schema_id}: the registry has no schema ({exc})") from None
        if (schema.schema_type or "AVRO") == "JSON":
            return json.loads
        if schema.schema_type == "PROTOBUF":
            from kafka_txn_sink import extras
            from kafka_txn_sink.serde.protobuf import message_reader

            extras.require(f"schema id {schema_id} (protobuf)", "protobuf")

            return message_reader(schema.schema_str)
        import fastavro

        parsed = fastavro.parse_schema(json.loads(schema.schema_str))
        return lambda payload: fastavro.schemaless_reader(io.BytesIO(payload), parsed)
