"""The test bed's Schema Registry (Apicurio Registry, Confluent-compatible API) through
confluent-kafka's own client and serializers, and how its start fails when it fails.

confluent_kafka.schema_registry is imported in the tests, not at collection: the oldest clients'
tier (ci/test_clients.sh) collects this directory with confluent-kafka 2.7.0, whose registry
client needs httpx, which the CI venv does not have (2.16's needs httpx2).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from kafka_txn_sink import testing

if TYPE_CHECKING:
    from confluent_kafka.schema_registry import Schema, SchemaRegistryClient

# The full tier (ci/test_full.sh): the CI tier meets the registry through the record formats'
# tests (tests/integration/test_registry_formats.py and the e2e ones).
pytestmark = [pytest.mark.registry, pytest.mark.full]

USER_V1 = {
    "type": "record",
    "name": "User",
    "namespace": "kts.test",
    "fields": [{"name": "name", "type": "string"}, {"name": "visits", "type": "long"}],
}
# BACKWARD: a reader of the new schema must read data of the old one. A new field without a
# default breaks that; with a default it does not.
USER_REQUIRED_FIELD = {**USER_V1, "fields": [*USER_V1["fields"], {"name": "age", "type": "int"}]}
USER_DEFAULTED_FIELD = {
    **USER_V1, "fields": [*USER_V1["fields"], {"name": "age", "type": "int", "default": 0}],
}


def avro(schema: dict[str, object]) -> Schema:
    from confluent_kafka.schema_registry import Schema

    return Schema(json.dumps(schema), "AVRO")


@pytest.fixture
def client(schema_registry: testing.SchemaRegistry) -> SchemaRegistryClient:
    from confluent_kafka.schema_registry import SchemaRegistryClient

    return SchemaRegistryClient({"url": schema_registry.url})


def test_the_url_is_the_confluent_compatible_api(
    schema_registry: testing.SchemaRegistry,
) -> None:
    assert re.fullmatch(r"http://127\.0\.0\.1:\d+/apis/ccompat/v7", schema_registry.url)


def test_registering_a_schema_again_gives_the_same_id(
    client: SchemaRegistryClient, unique: Callable[[str], str]
) -> None:
    subject = f"{unique('users')}-value"

    first = client.register_schema(subject, avro(USER_V1))
    again = client.register_schema(subject, avro(USER_V1))

    assert again == first
    latest = client.get_latest_version(subject)
    assert (latest.schema_id, latest.version) == (first, 1)
    assert json.loads(client.get_schema(first).schema_str) == USER_V1


def test_avro_serializer_and_deserializer_round_trip_a_record(
    client: SchemaRegistryClient, unique: Callable[[str], str]
) -> None:
    from confluent_kafka.schema_registry.avro import AvroDeserializer, AvroSerializer
    from confluent_kafka.serialization import MessageField, SerializationContext

    topic = unique("users")
    context = SerializationContext(topic, MessageField.VALUE)
    record = {"name": "ada", "visits": 3}

    payload = AvroSerializer(client, json.dumps(USER_V1))(record, context)
    assert payload is not None

    schema_id = client.get_latest_version(f"{topic}-value").schema_id
    assert payload[0] == 0  # the magic byte, then the schema id in 4 bytes, big-endian
    assert int.from_bytes(payload[1:5], "big") == schema_id
    assert AvroDeserializer(client)(payload, context) == record


def test_an_incompatible_schema_is_refused_under_backward(
    client: SchemaRegistryClient, unique: Callable[[str], str]
) -> None:
    from confluent_kafka.schema_registry.error import SchemaRegistryError

    subject = f"{unique('users')}-value"
    client.register_schema(subject, avro(USER_V1))
    client.set_compatibility(subject, "BACKWARD")
    assert client.get_compatibility(subject) == "BACKWARD"

    assert client.test_compatibility(subject, avro(USER_REQUIRED_FIELD)) is False
    assert client.test_compatibility(subject, avro(USER_DEFAULTED_FIELD)) is True
    with pytest.raises(SchemaRegistryError) as refused:
        client.register_schema(subject, avro(USER_REQUIRED_FIELD))

    # Apicurio answers HTTP 409 with error_code 0 (Confluent's registry: 409 and 409), so a
    # caller must key on the HTTP status.
    assert (refused.value.http_status_code, refused.value.error_code) == (409, 0)
    assert "Incompatible" in refused.value.error_message
    assert client.get_versions(subject) == [1]


def test_a_json_schema_registers(
    client: SchemaRegistryClient, unique: Callable[[str], str]
) -> None:
    from confluent_kafka.schema_registry import Schema

    subject = f"{unique('events')}-value"
    text = json.dumps({
        "$schema": "http://json-schema.org/draft-07/schema#",
        "type": "object",
        "properties": {"id": {"type": "integer"}, "kind": {"type": "string"}},
        "required": ["id"],
    })  # fmt: skip

    schema_id = client.register_schema(subject, Schema(text, "JSON"))

    assert client.register_schema(subject, Schema(text, "JSON")) == schema_id
    registered = client.get_schema(schema_id)
    assert registered.schema_type == "JSON"
    assert json.loads(registered.schema_str) == json.loads(text)


def test_a_start_that_does_not_become_ready_in_time_fails_with_its_log(tmp_path: Path) -> None:
    registry = testing.SchemaRegistry(tmp_path / "slow")

    with pytest.raises(testing.TestbedError) as failed:
        registry.start(timeout=0.5)  # a JVM is not ready in half a second

    message = str(failed.value)
    assert "waiting for the Schema Registry (Apicurio Registry" in message
    assert "--- last" in message and str(registry.log_path) in message
    assert not registry.is_running()


def test_a_registry_that_exits_during_start_fails_with_its_log(tmp_path: Path) -> None:
    registry = testing.SchemaRegistry(tmp_path / "tiny", heap="1k")  # the JVM refuses this heap

    with pytest.raises(testing.TestbedError, match=r"exited \(1\) during start") as failed:
        registry.start(timeout=60)

    assert "heap" in str(failed.value)  # the JVM's own words, from the tail of the log
    assert not registry.is_running()
