"""Record formats of a Schema Registry through real Spark, the real broker and the test bed's
real registry: the values a consumer decodes with confluent-kafka's own deserializers, each id
once at read_committed whatever kill struck, and bad input failing the batch whole.

The query's key is the input's id (raw), its value a struct of the id and the input value's
length, written as Avro or JSON Schema (and, without a kill, as Protobuf of the user's `.proto`,
read by confluent-kafka's ProtobufDeserializer).
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from kafka_txn_sink import testing
from kafka_txn_sink.protocol.messages import SchemaUse
from kafka_txn_sink.testing.topics import read_topic
from tests.e2e.conftest import NEWEST
from tests.e2e.harness import (
    Pipeline,
    assert_exactly_once,
    committed_report,
    kill_group,
    open_transactions,
    produce_ids,
)
from tests.e2e.test_repair import cli_json, verify_args

pytestmark = [pytest.mark.kafka, pytest.mark.spark, pytest.mark.registry]

N = 500  # batch 0 of 400 rows (maxOffsetsPerTrigger), batch 1 of 100
VALUE = "named_struct('id', CAST(key AS STRING), 'size', CAST(length(value) AS BIGINT)) AS value"
VALUE_JSON_SCHEMA = {
    "$schema": "http://json-schema.org/draft-07/schema#",
    "title": "Order",
    "type": "object",
    "properties": {"id": {"type": "string"}, "size": {"type": "integer"}},
    "required": ["id", "size"],
}


def with_format(pipeline: Pipeline, registry: testing.SchemaRegistry, fmt: str) -> Pipeline:
    pipeline.options.update({"valueFormat": fmt, "schema.registry.url": registry.url})
    pipeline.select = ["key", VALUE]
    return pipeline


def decoded_values(pipeline: Pipeline, registry: testing.SchemaRegistry, fmt: str) -> list[Any]:
    """The output's committed values through confluent-kafka's deserializer of `fmt`."""
    from confluent_kafka.schema_registry import SchemaRegistryClient
    from confluent_kafka.schema_registry.avro import AvroDeserializer
    from confluent_kafka.schema_registry.json_schema import JSONDeserializer
    from confluent_kafka.serialization import MessageField, SerializationContext

    client = SchemaRegistryClient({"url": registry.url})
    deserializer: Any = (
        AvroDeserializer(client)
        if fmt == "avro"
        else JSONDeserializer(None, schema_registry_client=client)
    )
    context = SerializationContext(pipeline.output, MessageField.VALUE)
    return [
        deserializer(r.value, context)
        for r in read_topic(pipeline.bootstrap, pipeline.output, "read_committed")
    ]


VALUE_AVRO_SCHEMA = {
    "type": "record",
    "name": "Order",
    "namespace": "shop",
    "fields": [
        {"name": "id", "type": ["null", "string"], "default": None},
        {"name": "size", "type": ["null", "long"], "default": None},
    ],
}
USERS_SCHEMAS = {"avro": VALUE_AVRO_SCHEMA, "json-schema": VALUE_JSON_SCHEMA}
# (Spark line, format, the subject registered before the query with auto-registration off);
# the full tier runs every one. CI: tests/integration/test_registry_*.py without Spark, the
# pinned schema's replay after a kill after the decision (test_repair_pinned_schema.py), and
# New York's values read back by the registry's deserializers (test_time_zones.py).
CASES = [
    ("4.0", "avro", False, (pytest.mark.full,)),
    (NEWEST, "avro", False, (pytest.mark.full,)),
    ("4.0", "json-schema", True, (pytest.mark.full,)),
    ("4.0", "avro", True, (pytest.mark.full,)),
    (NEWEST, "avro", True, (pytest.mark.full,)),
    (NEWEST, "json-schema", True, (pytest.mark.full,)),
]


@pytest.mark.parametrize(
    ("pipeline", "fmt", "registered"),
    [pytest.param(line, fmt, reg, marks=marks) for line, fmt, reg, marks in CASES],
    indirect=["pipeline"],
)
def test_values_are_read_once_by_the_registry_s_deserializer_after_a_kill_after_the_decision(
    pipeline: Pipeline,
    schema_registry: testing.SchemaRegistry,
    capsys: pytest.CaptureFixture[str],
    fmt: str,
    registered: bool,
) -> None:
    with_format(pipeline, schema_registry, fmt)
    expected_id = pre_registered(pipeline, schema_registry, fmt) if registered else None
    ids = produce_ids(pipeline.bootstrap, pipeline.input, N)
    process = pipeline.start("driver.after_decision=block@1")
    pipeline.wait_reached("driver.after_decision", process)
    kill_group(process)

    restarted = pipeline.run()

    assert restarted.returncode == 0, restarted.error
    assert_exactly_once(pipeline, ids)
    values = decoded_values(pipeline, schema_registry, fmt)
    assert sorted(v["id"] for v in values) == sorted(ids)
    assert {v["size"] for v in values} == {len(json.dumps({"id": ids[0]}))}
    schema_ids = {
        int.from_bytes(r.value[1:5], "big")
        for r in read_topic(pipeline.bootstrap, pipeline.output, "read_committed")
    }
    assert len(schema_ids) == 1 and expected_id in (None, *schema_ids)
    used = SchemaUse("value", fmt, f"{pipeline.output}-value", schema_ids.pop())
    log = pipeline.open_log()
    assert [log.decision(b).schemas for b in log.decided_batches()] == [(used,), (used,)]
    # verify reads the ids out of the values
    registry = ["--output-id", "registry:id", "--schema-registry-url", schema_registry.url]
    code, report = cli_json(capsys, "verify", *verify_args(pipeline), *registry)
    assert code == 0 and report["exact"], report
    records = report["records"]
    assert (records["id"], records["seen"], records["without_id_count"]) == ("registry:id", N, 0)


def pre_registered(pipeline: Pipeline, registry: testing.SchemaRegistry, fmt: str) -> int:
    """Register the user's schema of `fmt` under the output's value subject, and have the sink
    write with it and without registering anything."""
    from confluent_kafka.schema_registry import Schema, SchemaRegistryClient

    text = json.dumps(USERS_SCHEMAS[fmt])
    client = SchemaRegistryClient({"url": registry.url})
    kind = "AVRO" if fmt == "avro" else "JSON"
    schema_id = int(client.register_schema(f"{pipeline.output}-value", Schema(text, kind)))
    pipeline.options.update({"valueSchema": text, "autoRegisterSchemas": "false"})
    return schema_id


@pytest.mark.full  # CI: test_dead_letter_reasons badRows=fail, and the serializers' unit tests
def test_a_null_where_the_schema_forbids_it_fails_the_batch_naming_column_and_subject(
    pipeline: Pipeline, schema_registry: testing.SchemaRegistry
) -> None:
    with_format(pipeline, schema_registry, "avro")
    schema = {"type": "record", "name": "Order", "fields": [
        {"name": "id", "type": "string"}, {"name": "size", "type": ["null", "long"]}]}
    pipeline.options["valueSchema"] = json.dumps(schema)
    # One row in 50 has no id; the Spark type allows it, the user's schema does not.
    pipeline.select = ["key", VALUE.replace("CAST(key AS STRING)",
                                            "IF(offset % 50 = 7, NULL, CAST(key AS STRING))")]
    produce_ids(pipeline.bootstrap, pipeline.input, 120)

    outcome = pipeline.run()

    assert outcome.returncode != 0
    assert "does not fit its avro schema" in outcome.error
    assert f"(subject '{pipeline.output}-value', id " in outcome.error
    assert "column value of row " in outcome.error
    assert committed_report(pipeline.bootstrap, pipeline.output, []).seen == 0
    assert open_transactions(pipeline.bootstrap, pipeline.sink_id) == []


# The full tier: the CI tier has the same refusal at the driver's resolution
# (tests/integration/test_registry_formats.py).
@pytest.mark.full
def test_an_incompatible_schema_fails_the_query_before_any_transaction(
    pipeline: Pipeline, schema_registry: testing.SchemaRegistry
) -> None:
    from confluent_kafka.schema_registry import Schema, SchemaRegistryClient

    subject = f"{pipeline.output}-value"
    client = SchemaRegistryClient({"url": schema_registry.url})
    client.register_schema(subject, Schema(json.dumps(
        {"type": "record", "name": "Value", "namespace": "kafka_txn_sink",
         "fields": [{"name": "id", "type": "long"}]}), "AVRO"))
    client.set_compatibility(subject, "BACKWARD")
    with_format(pipeline, schema_registry, "avro")  # id as string: not BACKWARD compatible
    produce_ids(pipeline.bootstrap, pipeline.input, 50)

    outcome = pipeline.run("task.after_init=signal")

    assert outcome.returncode != 0
    assert f"subject '{subject}': the Schema Registry {schema_registry.url} refused as " \
        "incompatible" in outcome.error
    assert pipeline.reached_batches("task.after_init") == [], "a task opened a transaction"
    assert read_topic(pipeline.bootstrap, pipeline.output, "read_uncommitted") == []


VALUE_PROTO = """syntax = "proto3";
package shop;

message Order {
  string id = 1;
  int64 size = 2;
}
"""


def test_protobuf_values_are_read_once_by_the_registry_s_protobuf_deserializer(
    pipeline: Pipeline, schema_registry: testing.SchemaRegistry, capsys: pytest.CaptureFixture[str]
) -> None:
    from confluent_kafka.schema_registry.protobuf import ProtobufDeserializer
    from confluent_kafka.serialization import MessageField, SerializationContext

    from kafka_txn_sink.serde.protobuf import compile_proto, message_class

    with_format(pipeline, schema_registry, "protobuf")
    pipeline.options["valueSchema"] = VALUE_PROTO
    ids = produce_ids(pipeline.bootstrap, pipeline.input, N)

    outcome = pipeline.run()

    assert outcome.returncode == 0, outcome.error
    assert_exactly_once(pipeline, ids)
    records = read_topic(pipeline.bootstrap, pipeline.output, "read_committed")
    # The consumer's class is compiled from the same .proto, as a consumer's protoc would.
    order = message_class(compile_proto(VALUE_PROTO))
    deserializer = ProtobufDeserializer(order, {"use.deprecated.format": False})
    context = SerializationContext(pipeline.output, MessageField.VALUE)
    values = [deserializer(r.value, context) for r in records]
    assert sorted(v.id for v in values) == sorted(ids)
    assert {v.size for v in values} == {len(json.dumps({"id": ids[0]}))}
    schema_ids = {int.from_bytes(r.value[1:5], "big") for r in records}
    assert len(schema_ids) == 1
    used = SchemaUse("value", "protobuf", f"{pipeline.output}-value", schema_ids.pop())
    log = pipeline.open_log()
    assert {log.decision(b).schemas for b in log.decided_batches()} == {(used,)}
    registry = ["--output-id", "registry:id", "--schema-registry-url", schema_registry.url]
    code, report = cli_json(capsys, "verify", *verify_args(pipeline), *registry)
    assert code == 0 and report["exact"], report
    assert (report["records"]["seen"], report["records"]["without_id_count"]) == (N, 0)
