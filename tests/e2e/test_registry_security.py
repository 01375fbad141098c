"""A secured Schema Registry on the user's path: a streaming query through real Spark writes Avro
values against a registry that wants HTTPS (a certificate of the test bed's CA) and a static
bearer token (tests/registry_gateway.py, in front of the test bed's real registry), and a
read_committed consumer decodes them with confluent-kafka's AvroDeserializer, whose own registry
client goes through the same gateway: each id once.

The refusals (a wrong token, an unknown CA, no client certificate) fail at the driver's
resolution, before any task: tests/integration/test_registry_security.py.
"""

from __future__ import annotations

import base64
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from kafka_txn_sink import testing
from kafka_txn_sink.testing.topics import read_topic
from tests.e2e.harness import Pipeline, assert_exactly_once, produce_ids
from tests.e2e.test_registry_formats import with_format
from tests.registry_gateway import (
    RegistryGateway,
    bearer_headers,
    bearer_settings,
    issue_certificates,
    sink_options,
)

pytestmark = [pytest.mark.kafka, pytest.mark.spark, pytest.mark.registry]

N = 300  # one batch
TOKEN = "tok-e2e-3b8d-bearer"


def decoded_values(pipeline: Pipeline, settings: Mapping[str, str]) -> list[Any]:
    """The output's committed values through confluent-kafka's AvroDeserializer, its registry
    client configured with `settings`."""
    from confluent_kafka.schema_registry import SchemaRegistryClient
    from confluent_kafka.schema_registry.avro import AvroDeserializer
    from confluent_kafka.serialization import MessageField, SerializationContext

    deserializer = AvroDeserializer(SchemaRegistryClient(dict(settings)))
    context = SerializationContext(pipeline.output, MessageField.VALUE)
    records = read_topic(pipeline.bootstrap, pipeline.output, "read_committed")
    return [deserializer(r.value, context) for r in records]


@pytest.mark.full  # CI: tests/integration/test_registry_security.py
def test_avro_values_written_through_an_https_bearer_gateway_are_read_once(
    pipeline: Pipeline, schema_registry: testing.SchemaRegistry, tmp_path: Path
) -> None:
    certificates = issue_certificates(tmp_path / "tls")
    tls = certificates.server_tls()
    with RegistryGateway(schema_registry, bearer_headers(TOKEN), tls) as gateway:
        settings = {
            "url": gateway.url,
            "ssl.ca.location": str(certificates.ca),
            **bearer_settings(TOKEN),
        }
        with_format(pipeline, schema_registry, "avro")
        pipeline.options.update(sink_options(settings))  # the gateway's URL, not the registry's
        ids = produce_ids(pipeline.bootstrap, pipeline.input, N)

        outcome = pipeline.run()

        assert outcome.returncode == 0, outcome.error
        sink_requests = gateway.requests
        values = decoded_values(pipeline, settings)

    assert sink_requests > 0 and gateway.refused == 0 and gateway.failed_handshakes == 0
    assert_exactly_once(pipeline, ids)
    assert sorted(v["id"] for v in values) == sorted(ids)
    assert TOKEN not in outcome.stderr


def test_a_refused_basic_auth_password_shows_nowhere_in_sparks_error(
    pipeline: Pipeline, schema_registry: testing.SchemaRegistry
) -> None:
    """Spark prints a failed query's options in its error, hiding only those its redaction
    regex matches: given as `basic.auth.username` and `.password` (not `user.info`), the
    password is hidden; the batch fails at the driver with nothing published."""
    password = "pw-e2e-9f2c-basic"
    wanted = {"Authorization": "Basic " + base64.b64encode(b"alice:right-one").decode()}
    with RegistryGateway(schema_registry, wanted) as gateway:
        with_format(pipeline, schema_registry, "avro")
        pipeline.options.update(sink_options({
            "url": gateway.url, "basic.auth.username": "alice", "basic.auth.password": password,
        }))  # fmt: skip
        ids = produce_ids(pipeline.bootstrap, pipeline.input, N)

        outcome = pipeline.run()

    assert outcome.returncode != 0
    assert "HTTP 401" in outcome.error and gateway.refused > 0, outcome.error
    assert password not in outcome.error and password not in outcome.stderr
    assert read_topic(pipeline.bootstrap, pipeline.output, "read_uncommitted") == []
    assert ids
