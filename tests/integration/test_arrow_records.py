"""The Arrow write path's producing on a real broker: a batch's columns go out through the bulk
`send_many`, with offsets, triple and delivery as the row path reports them."""

from __future__ import annotations

import uuid

import pyarrow as pa
import pytest
from pyspark.sql.types import BinaryType, StringType, StructField, StructType

from kafka_txn_sink.kafka.producer import POLL_EVERY, TaskTransaction, producer_config
from kafka_txn_sink.kafka.txn_admin import ONGOING, TxnAdmin
from kafka_txn_sink.records.arrow import record_columns, send_batch
from kafka_txn_sink.records.columns import plan_columns
from kafka_txn_sink.testing.topics import read_topic
from tests.e2e.harness import create_topics

pytestmark = pytest.mark.kafka


def test_arrow_batches_are_produced_in_one_prepared_transaction(kafka_bootstrap: str) -> None:
    topic = f"arrow_{uuid.uuid4().hex[:8]}"
    create_topics(kafka_bootstrap, 3, topic)
    schema = StructType([StructField("key", StringType()), StructField("value", BinaryType())])
    columns = plan_columns(schema, topic)
    rows = 2 * POLL_EVERY + 7  # past the points where delivery reports are served
    batches = [
        pa.record_batch(
            [
                pa.array([f"k{i}" for i in range(start, min(rows, start + 1000))]),
                pa.array(
                    [f"v{i}".encode() for i in range(start, min(rows, start + 1000))], pa.binary()
                ),
            ],
            names=["key", "value"],
        )
        for start in range(0, rows, 1000)
    ]
    txn_id = f"arrowtest_{uuid.uuid4().hex[:8]}-0"
    txn = TaskTransaction(producer_config(kafka_bootstrap, {}, txn_id, 60_000), timeout_s=30)
    txn.init()
    for batch in batches:
        send_batch(txn, record_columns(batch, columns), topic)
    prepared = txn.prepare()
    txn.detach()

    assert prepared is not None and prepared.rows == rows
    assert sum(last - first + 1 for first, last in prepared.offsets[topic].values()) == rows, (
        prepared.offsets
    )
    with TxnAdmin(kafka_bootstrap, {}) as txn_admin:
        state = txn_admin.describe([txn_id])[txn_id]
        assert (state.state, state.triple) == (ONGOING, prepared.triple)
        [result] = txn_admin.end_transactions([prepared.triple], commit=True, deadline_s=30)
        assert result.ok, result.error
    seen = read_topic(kafka_bootstrap, topic, "read_committed")
    assert sorted((s.key, s.value) for s in seen) == sorted(
        (f"k{i}".encode(), f"v{i}".encode()) for i in range(rows)
    )
