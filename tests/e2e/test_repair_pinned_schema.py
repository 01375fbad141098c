"""A repair encodes with the schemas its batch's decision recorded (issue 39, N3).

With `useLatestVersion=true` the sink writes with the subject's latest schema. A driver killed
after batch 1's decision stays down past the transaction timeout, and meanwhile a new compatible
version of the subject is registered. The replay of batch 1 must still write its records with
the schema id the decision recorded, or its records would differ from the lost ones (the id is
in every value), the repair would refuse them and the rows would stay lost.
"""

from __future__ import annotations

import json

import pytest

from kafka_txn_sink import testing
from kafka_txn_sink.testing.topics import read_topic
from tests.e2e.harness import Pipeline, assert_exactly_once
from tests.e2e.test_registry_formats import (
    VALUE_AVRO_SCHEMA,
    decoded_values,
    pre_registered,
    with_format,
)
from tests.e2e.test_repair import kill_at_batch_1_and_wait_for_the_timeout

pytestmark = [pytest.mark.kafka, pytest.mark.spark, pytest.mark.registry]


def test_a_replay_after_a_new_schema_version_writes_with_the_decisions_schema(
    pipeline: Pipeline, schema_registry: testing.SchemaRegistry
) -> None:
    from confluent_kafka.schema_registry import Schema, SchemaRegistryClient

    with_format(pipeline, schema_registry, "avro")
    first_id = pre_registered(pipeline, schema_registry, "avro")
    del pipeline.options["valueSchema"]
    pipeline.options["useLatestVersion"] = "true"
    ids = kill_at_batch_1_and_wait_for_the_timeout(pipeline, "driver.after_decision")
    newer = {
        **VALUE_AVRO_SCHEMA,
        "fields": [
            *VALUE_AVRO_SCHEMA["fields"],  # type: ignore[list-item]
            {"name": "note", "type": ["null", "string"], "default": None},
        ],
    }
    client = SchemaRegistryClient({"url": schema_registry.url})
    subject = f"{pipeline.output}-value"
    second_id = int(client.register_schema(subject, Schema(json.dumps(newer), "AVRO")))
    assert second_id != first_id
    assert client.get_latest_version(subject).schema_id == second_id

    restarted = pipeline.run()

    assert restarted.returncode == 0, restarted.error
    assert_exactly_once(pipeline, ids)
    log = pipeline.open_log()
    repair = log.repair(1, 1)
    assert repair is not None and repair.refused == () and len(repair.repaired) > 0
    committed = read_topic(pipeline.bootstrap, pipeline.output, "read_committed")
    assert {int.from_bytes((r.value or b"")[1:5], "big") for r in committed} == {first_id}
    assert sorted(v["id"] for v in decoded_values(pipeline, schema_registry, "avro")) == sorted(ids)
