"""Fixtures the Schema Registry tests share: a plain client of the test bed's registry (to look
at what the sink registered) and a fresh topic name."""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING

import pytest

from kafka_txn_sink import testing

if TYPE_CHECKING:
    from confluent_kafka.schema_registry import SchemaRegistryClient


@pytest.fixture
def client(schema_registry: testing.SchemaRegistry) -> SchemaRegistryClient:
    from confluent_kafka.schema_registry import SchemaRegistryClient

    return SchemaRegistryClient({"url": schema_registry.url})


@pytest.fixture
def topic() -> str:
    return f"orders_{uuid.uuid4().hex[:8]}"
