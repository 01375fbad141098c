"""Avro names shared by both schema engines, and a schema's fingerprint and digest."""

from __future__ import annotations

import json
import re
from typing import Any

import fastavro

from kafka_txn_sink.files.avro_names import avro_field_names, fingerprint, schema_digest

# --- names ---------------------------------------------------------------------------------


def test_valid_names_are_kept_and_invalid_ones_sanitized() -> None:
    assert avro_field_names(["a", "_b", "C9"]) == ["a", "_b", "C9"]
    assert avro_field_names(["a-b", "1x", "", "é", "x y"]) == ["a_b", "_1x", "_", "__1", "x_y"]


def test_a_sanitized_name_never_takes_a_valid_name_of_the_record() -> None:
    # "a_b" comes later but keeps its name; the sanitized "a-b" gets the suffix.
    assert avro_field_names(["a-b", "a_b", "a.b"]) == ["a_b_1", "a_b", "a_b_2"]


def test_duplicate_valid_names_get_suffixes() -> None:
    assert avro_field_names(["a", "a", "a_1"]) == ["a", "a_2", "a_1"]


# --- fingerprints --------------------------------------------------------------------------


def test_fingerprint_is_crc64_of_the_canonical_form() -> None:
    schema = {"type": "record", "name": "R", "fields": [{"name": "x", "type": "long"}]}
    expected = fastavro.schema.fingerprint(
        fastavro.schema.to_parsing_canonical_form(schema), "CRC-64-AVRO"
    )
    assert fingerprint(schema) == expected
    assert re.fullmatch(r"[0-9a-f]{16}", fingerprint(schema))


def test_fingerprint_ignores_logical_types_but_the_digest_does_not() -> None:
    def decimal_schema(scale: int) -> dict[str, Any]:
        decimal = {"type": "bytes", "logicalType": "decimal", "precision": 10, "scale": scale}
        return {"type": "record", "name": "R", "fields": [{"name": "x", "type": decimal}]}

    assert fingerprint(decimal_schema(2)) == fingerprint(decimal_schema(4))
    assert schema_digest(decimal_schema(2)) != schema_digest(decimal_schema(4))
    assert schema_digest(decimal_schema(2)) == schema_digest(
        json.loads(json.dumps(decimal_schema(2)))
    )
