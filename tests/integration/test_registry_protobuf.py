"""The protobuf format against the test bed's real Schema Registry (Apicurio Registry,
Confluent-compatible API): the user's `.proto` registered as PROTOBUF or looked up, named by
each subject strategy, the latest version compiled, and each refusal as the error a user
reads; then values encoded with the resolved id and read back by `verify`'s decoder.

confluent_kafka.schema_registry is imported in the tests, not at collection (see
test_schema_registry_bed.py: the oldest clients' tier collects this directory).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pytest
from pyspark.sql import Row
from pyspark.sql.types import LongType, StringType, StructField, StructType

from kafka_txn_sink import testing
from kafka_txn_sink.errors import ConfigError, InputError, SchemaRegistryError
from kafka_txn_sink.options import parse_options
from kafka_txn_sink.serde.decode import WireDecoder
from kafka_txn_sink.serde.encode import FieldEncoder
from kafka_txn_sink.serde.options import SerdeOptions
from kafka_txn_sink.serde.resolve import Encoding, resolve

if TYPE_CHECKING:
    from confluent_kafka.schema_registry import SchemaRegistryClient

pytestmark = pytest.mark.registry

ORDER = StructType([StructField("id", StringType()), StructField("visits", LongType())])
INPUT = StructType([StructField("key", StringType()), StructField("value", ORDER)])


def proto(package: str, visits: str = "int64") -> str:
    return f"""syntax = "proto3";
package {package};

message Order {{
  string id = 1;
  {visits} visits = 2;
}}
"""


def serde(url: str, **options: str) -> SerdeOptions:
    base = {
        "kafka.bootstrap.servers": "127.0.0.1:9",
        "sinkId": "s",
        "commitLog": "/tmp/l",
        "topic": "t",
        "schema.registry.url": url,
        "valueFormat": "protobuf",
    }
    return parse_options({**base, **options}).serde


def resolved_value(options: SerdeOptions, topic: str) -> Encoding:
    found = resolve(options, INPUT, topic)
    assert found is not None and found.key is None and found.value is not None
    return found.value


def protobuf(text: str) -> Any:
    from confluent_kafka.schema_registry import Schema

    return Schema(text, "PROTOBUF")


def test_the_proto_is_registered_as_protobuf_under_the_topics_subject(
    schema_registry: testing.SchemaRegistry, client: SchemaRegistryClient, topic: str
) -> None:
    text = proto("shop")

    value = resolved_value(serde(schema_registry.url, valueSchema=text), topic)

    latest = client.get_latest_version(f"{topic}-value")
    assert (value.subject, value.schema_id) == (f"{topic}-value", latest.schema_id)
    assert latest.schema.schema_type == "PROTOBUF" and value.format == "protobuf"
    assert value.prefix == b"\x00" + value.schema_id.to_bytes(4, "big") + b"\x00"
    again = resolved_value(serde(schema_registry.url, valueSchema=text), topic)
    assert again.schema_id == value.schema_id  # registering twice: the same id


def test_with_auto_registration_off_a_registered_proto_is_looked_up(
    schema_registry: testing.SchemaRegistry, client: SchemaRegistryClient, topic: str
) -> None:
    text = proto("shop")
    registered = client.register_schema(f"{topic}-value", protobuf(text))

    value = resolved_value(
        serde(schema_registry.url, valueSchema=text, autoRegisterSchemas="false"), topic
    )

    assert value.schema_id == registered


def test_with_auto_registration_off_a_missing_proto_fails_naming_the_subject(
    schema_registry: testing.SchemaRegistry, client: SchemaRegistryClient, topic: str
) -> None:
    client.register_schema(f"{topic}-value", protobuf(proto("shop", visits="string")))
    options = serde(schema_registry.url, valueSchema=proto("shop"), autoRegisterSchemas="false")

    with pytest.raises(SchemaRegistryError) as caught:
        resolve(options, INPUT, topic)

    message = str(caught.value)
    assert message.startswith(
        f"subject '{topic}-value' of the Schema Registry {schema_registry.url} does not hold "
        f"the schema and option autoRegisterSchemas=false"
    )
    assert "nothing was written" in message


@pytest.mark.parametrize("strategy", ["record", "topic_record"])
def test_the_record_strategies_name_the_subject_after_the_message(
    schema_registry: testing.SchemaRegistry,
    client: SchemaRegistryClient,
    topic: str,
    strategy: str,
) -> None:
    package = f"shop_{topic}"
    options = serde(schema_registry.url, valueSchema=proto(package), subjectNameStrategy=strategy)

    value = resolved_value(options, topic)

    expected = f"{package}.Order" if strategy == "record" else f"{topic}-{package}.Order"
    assert value.subject == expected
    assert client.get_latest_version(expected).schema_id == value.schema_id


def test_the_latest_version_is_compiled_and_used_as_registered(
    schema_registry: testing.SchemaRegistry, client: SchemaRegistryClient, topic: str
) -> None:
    registered = client.register_schema(f"{topic}-value", protobuf(proto("shop")))

    value = resolved_value(serde(schema_registry.url, useLatestVersion="true"), topic)

    assert value.schema_id == registered and value.descriptor
    (encoded,) = FieldEncoder(value).cells([Row(id="o-1", visits=3)], 0)
    assert encoded is not None and encoded[:6] == value.prefix


def test_a_proto_that_does_not_compile_is_refused_naming_the_option_before_registering(
    schema_registry: testing.SchemaRegistry, client: SchemaRegistryClient, topic: str
) -> None:
    broken = 'syntax = "proto3";\nmessage Order {\n  strin id = 1;\n}\n'

    with pytest.raises(ConfigError) as caught:
        resolve(serde(schema_registry.url, valueSchema=broken), INPUT, topic)

    message = str(caught.value)
    assert message.startswith("option valueSchema is not a valid protobuf schema: ")
    assert "schema.proto:3:" in message and "strin" in message
    assert f"{topic}-value" not in client.get_subjects()


def test_a_row_that_does_not_fit_fails_naming_the_column_row_and_subject(
    schema_registry: testing.SchemaRegistry, topic: str
) -> None:
    value = resolved_value(serde(schema_registry.url, valueSchema=proto("shop", "int32")), topic)
    rows = [Row(id="o-1", visits=1), Row(id="o-2", visits=2**40)]

    with pytest.raises(InputError) as caught:
        FieldEncoder(value).cells(rows, first_row=10)

    assert str(caught.value).startswith(
        f"column value of row 11 of this task does not fit its protobuf schema (subject "
        f"'{topic}-value', id {value.schema_id}): Failed to parse visits field: Value out of "
        f"range: 1099511627776"
    )


def test_values_read_back_with_the_registered_proto(
    schema_registry: testing.SchemaRegistry, topic: str
) -> None:
    value = resolved_value(serde(schema_registry.url, valueSchema=proto("shop")), topic)
    (encoded,) = FieldEncoder(value).cells([Row(id="o-1", visits=3)], 0)
    assert encoded is not None

    decoded = WireDecoder({"url": schema_registry.url})(encoded)

    assert decoded == {"id": "o-1", "visits": "3"}  # int64 as text: protobuf's JSON mapping
