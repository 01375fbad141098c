"""Record formats without a registry: the options, the derived schemas, and the tasks' encoding
in Confluent's wire format (read back with fastavro and json, as a consumer would)."""

from __future__ import annotations

import io
import json
import re
import struct
from datetime import date, datetime, timezone
from decimal import Decimal
from typing import Any

import fastavro
import pyarrow as pa
import pytest
from pyspark.sql import Row
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    DateType,
    DecimalType,
    IntegerType,
    LongType,
    MapType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from kafka_txn_sink.errors import ConfigError, InputError
from kafka_txn_sink.options import parse_options
from kafka_txn_sink.redaction import redact
from kafka_txn_sink.serde.encode import FieldEncoder
from kafka_txn_sink.serde.resolve import Encoding, derived_schema

BASE = {"kafka.bootstrap.servers": "b:9092", "topic": "orders", "sinkId": "s", "commitLog": "/l"}
REGISTRY = {"schema.registry.url": "http://127.0.0.1:1"}
ORDER = StructType(
    [
        StructField("id", StringType(), nullable=False),
        StructField("amount", DecimalType(10, 2)),
        StructField("at", TimestampType()),
        StructField("tags", ArrayType(StringType())),
        StructField("extra", MapType(StringType(), LongType())),
    ]
)
ROW = Row(
    id="o-1",
    amount=Decimal("12.50"),
    at=datetime(2026, 11, 26, 12, 0, tzinfo=timezone.utc),
    tags=["a", None],
    extra={"n": 3},
)


def encoding(fmt: str, data_type: Any, schema: str | None = None) -> Encoding:
    text = schema or derived_schema("value", data_type, fmt)  # type: ignore[arg-type]
    return Encoding("value", fmt, "orders-value", 7, text, data_type)  # type: ignore[arg-type]


def wire(message: bytes) -> tuple[int, bytes]:
    """Confluent's wire format: magic byte 0, a 4-byte big-endian id, the payload."""
    magic, schema_id = struct.unpack(">bI", message[:5])
    assert magic == 0
    return schema_id, message[5:]


# -- options ------------------------------------------------------------------------------------


def test_raw_is_the_default_and_needs_no_registry() -> None:
    serde = parse_options(BASE).serde
    assert (serde.key.format, serde.value.format, serde.uses_registry) == ("raw", "raw", False)


def test_the_registry_settings_lose_their_prefix_and_keep_their_secrets_out_of_repr() -> None:
    options = parse_options(
        {
            **BASE,
            **REGISTRY,
            "valueFormat": "AVRO",
            "schema.registry.basic.auth.user.info": "alice:s3cr3t-pw",
        }
    )
    serde = options.serde
    assert serde.value.format == "avro" and serde.key.raw
    assert serde.registry["basic.auth.user.info"] == "alice:s3cr3t-pw"
    assert "s3cr3t-pw" not in repr(serde) and "s3cr3t-pw" not in repr(options)
    assert redact(serde.registry)["basic.auth.user.info"] == "***"


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (
            {"valueFormat": "xml"},
            "option valueFormat must be one of raw, avro, json-schema, protobuf, got 'xml'",
        ),
        ({"valueFormat": "avro"}, "option schema.registry.url is required with valueFormat=avro"),
        ({"valueSchema": "{}"}, "option valueSchema needs option valueFormat set to avro"),
        ({**REGISTRY}, "option(s) schema.registry.url need option keyFormat or valueFormat"),
        (
            {**REGISTRY, "keyFormat": "avro", "subjectNameStrategy": "by_name"},
            "option subjectNameStrategy must be one of topic, record, topic_record",
        ),
    ],
)
def test_a_bad_format_option_is_refused_naming_it(extra: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError, match="^" + re.escape(message)):
        parse_options({**BASE, **extra})


def test_files_mode_alone_refuses_a_record_format() -> None:
    files = {**BASE, "path": "/tmp/f", "referencesTopic": "refs", **REGISTRY}
    del files["topic"]
    with pytest.raises(ConfigError, match="are for records mode"):
        parse_options({**files, "valueFormat": "avro"})


# -- derived schemas -----------------------------------------------------------------------------


def test_an_avro_schema_is_derived_as_files_mode_maps_types() -> None:
    schema = json.loads(derived_schema("value", ORDER, "avro"))
    assert (schema["type"], schema["name"], schema["namespace"]) == (
        "record",
        "Value",
        "kafka_txn_sink",
    )
    fields = {f["name"]: f["type"] for f in schema["fields"]}
    assert fields["id"] == "string"
    assert fields["amount"][1]["logicalType"] == "decimal"
    assert json.loads(derived_schema("key", StringType(), "avro")) == "string"


def test_a_json_schema_is_derived_with_required_fields_and_nullable_types() -> None:
    schema = json.loads(derived_schema("value", ORDER, "json-schema"))
    assert schema["title"] == "Value" and schema["required"] == ["id"]
    assert schema["properties"]["id"] == {"type": "string"}
    assert {"type": "null"} in schema["properties"]["at"]["oneOf"]


def test_a_type_json_cannot_carry_is_refused_naming_the_column() -> None:
    odd = StructType([StructField("m", MapType(IntegerType(), StringType()))])
    with pytest.raises(InputError, match=r"column value\.m is a map with int keys"):
        derived_schema("value", odd, "json-schema")


# -- encoding ------------------------------------------------------------------------------------


def test_avro_values_are_in_the_wire_format_and_read_back_by_fastavro() -> None:
    e = encoding("avro", ORDER)
    encoded = FieldEncoder(e).cells([ROW, None], first_row=0)

    assert encoded[1] is None  # a null value stays null: a tombstone
    assert encoded[0] is not None
    schema_id, payload = wire(encoded[0])
    record = fastavro.schemaless_reader(io.BytesIO(payload), json.loads(e.schema))
    assert schema_id == 7
    assert record == {
        "id": "o-1",
        "amount": Decimal("12.50"),
        "at": datetime(2026, 11, 26, 12, 0, tzinfo=timezone.utc),
        "tags": ["a", None],
        "extra": {"n": 3},
    }


def test_the_arrow_path_encodes_the_same_bytes_as_the_row_path() -> None:
    e = encoding("avro", ORDER)
    arrow_type = pa.struct(
        [
            ("id", pa.string()),
            ("amount", pa.decimal128(10, 2)),
            ("at", pa.timestamp("us", tz="UTC")),
            ("tags", pa.list_(pa.string())),
            ("extra", pa.map_(pa.string(), pa.int64())),
        ]
    )
    cells = [ROW.asDict(), None]
    cells[0]["extra"] = [("n", 3)]
    array = pa.array(cells, type=arrow_type)

    assert FieldEncoder(e).array(array, 0) == FieldEncoder(e).cells([ROW, None], 0)


def test_a_primitive_key_is_encoded_with_its_primitive_schema() -> None:
    e = Encoding("key", "avro", "orders-key", 3, derived_schema("key", StringType(), "avro"),
                 StringType())
    (encoded,) = FieldEncoder(e).cells(["k-1"], 0)
    assert encoded is not None and wire(encoded) == (3, b"\x06k-1")


def test_a_null_where_the_schema_forbids_it_names_the_column_row_and_subject() -> None:
    e = encoding("avro", ORDER)
    bad = Row(id=None, amount=None, at=None, tags=None, extra=None)
    with pytest.raises(InputError) as caught:
        FieldEncoder(e).cells([ROW, ROW, bad], first_row=40)
    message = str(caught.value)
    assert message.startswith("column value of row 42 of this task does not fit its avro schema")
    assert "subject 'orders-value', id 7" in message and "column id is null" in message


def test_a_value_that_does_not_fit_the_users_schema_is_refused() -> None:
    users = json.dumps(
        {"type": "record", "name": "V", "fields": [{"name": "n", "type": "int"}]}
    )
    e = encoding("avro", StructType([StructField("n", LongType())]), users)
    with pytest.raises(InputError, match="column value of row 0 of this task does not fit"):
        FieldEncoder(e).cells([Row(n=2**40)], 0)


def test_json_values_are_validated_and_written_compactly() -> None:
    e = encoding("json-schema", ORDER)
    (encoded,) = FieldEncoder(e).cells([ROW], 0)
    assert encoded is not None
    schema_id, payload = wire(encoded)
    assert schema_id == 7
    assert json.loads(payload) == {
        "id": "o-1",
        "amount": 12.5,
        "at": "2026-11-26T12:00:00+00:00",
        "tags": ["a", None],
        "extra": {"n": 3},
    }
    assert b" " not in payload


def test_a_json_value_against_the_users_schema_names_where_it_does_not_fit() -> None:
    users = json.dumps({"type": "object", "properties": {"d": {"type": "string", "maxLength": 3}}})
    e = encoding("json-schema", StructType([StructField("d", DateType())]), users)
    with pytest.raises(InputError, match=r"row 5 .* at d: '2026-11-26' is too long"):
        FieldEncoder(e).cells([Row(d=date(2026, 11, 26))], 5)


def test_binary_json_values_are_base64() -> None:
    e = encoding("json-schema", StructType([StructField("b", BinaryType())]))
    (encoded,) = FieldEncoder(e).cells([Row(b=bytearray(b"\x00\xff"))], 0)
    assert encoded is not None and json.loads(wire(encoded)[1]) == {"b": "AP8="}


def test_a_username_and_password_become_the_clients_user_info() -> None:
    from kafka_txn_sink.serde.options import registry_settings

    settings = registry_settings({
        "schema.registry.url": "http://r", "schema.registry.basic.auth.username": "alice",
        "schema.registry.basic.auth.password": "pw-0451-secret",
    })  # fmt: skip

    assert settings == {
        "url": "http://r", "basic.auth.user.info": "alice:pw-0451-secret",
    }  # fmt: skip


@pytest.mark.parametrize(
    "given",
    [
        {"schema.registry.basic.auth.username": "alice"},
        {"schema.registry.basic.auth.password": "pw-0451-secret"},
        {"schema.registry.basic.auth.username": "alice",
         "schema.registry.basic.auth.password": "pw-0451-secret",
         "schema.registry.basic.auth.user.info": "alice:pw-0451-secret"},
    ],
)  # fmt: skip
def test_half_a_pair_or_both_forms_are_refused_naming_the_options(given: dict[str, str]) -> None:
    from kafka_txn_sink.serde.options import registry_settings

    pattern = r"basic\.auth\.username and .*basic\.auth\.password"
    with pytest.raises(ConfigError, match=pattern) as caught:
        registry_settings(given)
    assert "pw-0451-secret" not in str(caught.value)


def test_user_info_is_taken_with_a_warning_that_shows_no_secret(
    caplog: pytest.LogCaptureFixture,
) -> None:
    from kafka_txn_sink.serde import options as serde_options

    serde_options._user_info_warned = False
    with caplog.at_level("WARNING"):
        settings = serde_options.registry_settings(
            {"schema.registry.basic.auth.user.info": "alice:pw-0451-secret"}
        )
        serde_options.registry_settings(
            {"schema.registry.basic.auth.user.info": "alice:pw-0451-secret"}
        )

    assert settings == {"basic.auth.user.info": "alice:pw-0451-secret"}
    [warning] = [r.getMessage() for r in caplog.records if "user.info" in r.getMessage()]
    assert "basic.auth.username" in warning and "pw-0451-secret" not in warning


def test_a_username_with_a_colon_is_refused() -> None:
    from kafka_txn_sink.serde.options import registry_settings

    with pytest.raises(ConfigError, match=r"basic\.auth\.username cannot hold ':'"):
        registry_settings({
            "schema.registry.basic.auth.username": "a:b",
            "schema.registry.basic.auth.password": "pw-0451-secret",
        })  # fmt: skip


def test_user_info_in_the_url_is_taken_with_a_warning_that_shows_no_secret(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Spark's plans show `schema.registry.url` in clear, as they show `basic.auth.user.info`."""
    from kafka_txn_sink.serde import options as serde_options

    monkeypatch.setattr(serde_options, "_url_user_info_warned", False, raising=False)
    given = {"schema.registry.url": "https://alice:pw-0917-url@r.example.com/"}
    with caplog.at_level("WARNING"):
        settings = serde_options.registry_settings(given)
        serde_options.registry_settings(given)

    assert settings == {"url": "https://alice:pw-0917-url@r.example.com/"}  # the client's auth
    [warning] = [r.getMessage() for r in caplog.records if "url" in r.getMessage()]
    assert "option schema.registry.url holds a user info" in warning
    assert "schema.registry.basic.auth.password" in warning and "pw-0917-url" not in warning
