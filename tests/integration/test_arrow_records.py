"""The Arrow write path's producing on a real broker: a batch's columns go out through the bulk
`send_many`, with offsets, triple and delivery as the row path reports them: the offsets are
what a read_committed consumer sees, keyed records land where librdkafka puts them, and a
refused record anywhere in a batch fails the task."""

from __future__ import annotations

import uuid
from concurrent.futures import ThreadPoolExecutor

import pyarrow as pa
import pytest
from pyspark.sql.types import BinaryType, StringType, StructField, StructType

from kafka_txn_sink.errors import InputError
from kafka_txn_sink.kafka.producer import POLL_EVERY, Prepared, TaskTransaction
from kafka_txn_sink.kafka.producer_settings import producer_config
from kafka_txn_sink.kafka.txn_admin import ONGOING, TxnAdmin
from kafka_txn_sink.records.arrow import record_columns, send_batch
from kafka_txn_sink.records.columns import Routing, plan_columns
from kafka_txn_sink.testing.topics import read_topic
from tests.e2e.harness import commit_prepared, create_small_topic, create_topics

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
        send_batch(txn, record_columns(batch, columns), Routing(topic))
    prepared = txn.prepare()
    txn.detach()

    assert prepared is not None and prepared.rows == rows
    assert sum(last - first + 1 for first, last in prepared.offsets[topic].values()) == rows, (
        prepared.offsets
    )
    with TxnAdmin(kafka_bootstrap, {}) as txn_admin:
        state = txn_admin.describe([txn_id])[txn_id]
        assert (state.state, state.triple) == (ONGOING, prepared.triple)
    commit_prepared(kafka_bootstrap, prepared)
    seen = read_topic(kafka_bootstrap, topic, "read_committed")
    assert sorted((s.key, s.value) for s in seen) == sorted(
        (f"k{i}".encode(), f"v{i}".encode()) for i in range(rows)
    )


def prepared_arrow_task(
    bootstrap: str, topic: str, txn_id: str, keys: list[bytes | None], tag: str
) -> Prepared:
    """One task's transaction of `keys` (values `{tag}:{i}`) through `send_many`, prepared."""
    txn = TaskTransaction(producer_config(bootstrap, {}, txn_id, 60_000), timeout_s=30)
    txn.init()
    values = [f"{tag}:{i}".encode() for i in range(len(keys))]
    for start in range(0, len(keys), 700):  # several calls: partitions are reported across them
        txn.send_many(topic, values[start : start + 700], keys[start : start + 700])
    prepared = txn.prepare()
    txn.detach()
    assert prepared is not None and prepared.rows == len(keys)
    return prepared


def test_recorded_offsets_are_what_a_read_committed_consumer_sees(kafka_bootstrap: str) -> None:
    topic = f"arrow_{uuid.uuid4().hex[:8]}"
    create_topics(kafka_bootstrap, 4, topic)
    keys: list[bytes | None] = [f"k{i}".encode() if i % 5 else None for i in range(3000)]
    run = uuid.uuid4().hex[:8]
    # Two tasks at once: their records interleave in every partition, so no range is contiguous.
    with ThreadPoolExecutor(2) as pool:
        prepared = list(
            pool.map(
                lambda tag: prepared_arrow_task(
                    kafka_bootstrap, topic, f"arrowtest_{run}-{tag}", keys, tag
                ),
                ["a", "b"],
            )
        )
    commit_prepared(kafka_bootstrap, *prepared)
    seen = read_topic(kafka_bootstrap, topic, "read_committed")

    assert len(seen) == 2 * len(keys)
    for tag, task in zip(["a", "b"], prepared, strict=True):
        mine = [s for s in seen if s.value.startswith(f"{tag}:".encode())]
        ranges: dict[int, tuple[int, int]] = {}
        for s in mine:
            first, last = ranges.get(s.partition, (s.offset, s.offset))
            ranges[s.partition] = (min(first, s.offset), max(last, s.offset))
        assert task.offsets == {topic: ranges}


def test_keyed_records_go_where_librdkafka_puts_them(kafka_bootstrap: str) -> None:
    topic = f"arrow_{uuid.uuid4().hex[:8]}"
    create_topics(kafka_bootstrap, 7, topic)
    keys = [uuid.uuid4().hex.encode()[: i % 40] for i in range(2000)]  # 0 to 39 bytes
    txn_id = f"arrowtest_{uuid.uuid4().hex[:8]}-0"
    txn = TaskTransaction(producer_config(kafka_bootstrap, {}, txn_id, 60_000), timeout_s=30)
    txn.init()
    for i, key in enumerate(keys):  # record by record: librdkafka's murmur2 partitioner
        txn.send(topic, value=f"one:{i}".encode(), key=key)
    txn.send_many(topic, [f"many:{i}".encode() for i in range(len(keys))], keys)
    prepared = txn.prepare()
    txn.detach()
    assert prepared is not None
    commit_prepared(kafka_bootstrap, prepared)

    partition_of = {s.value: s.partition for s in read_topic(kafka_bootstrap, topic)}

    assert len(partition_of) == 2 * len(keys)
    assert [partition_of[f"many:{i}".encode()] for i in range(len(keys))] == [
        partition_of[f"one:{i}".encode()] for i in range(len(keys))
    ]


def test_a_failed_delivery_in_the_middle_of_a_batch_fails_the_task(kafka_bootstrap: str) -> None:
    topic = f"arrow_{uuid.uuid4().hex[:8]}"
    create_small_topic(kafka_bootstrap, topic, max_message_bytes=20_000)
    values = [f"v{i}".encode() for i in range(3000)]
    values[1500] = b"x" * 50_000  # the client accepts it (1 MB), the topic refuses it
    txn_id = f"arrowtest_{uuid.uuid4().hex[:8]}-0"
    txn = TaskTransaction(producer_config(kafka_bootstrap, {}, txn_id, 60_000), timeout_s=30)
    txn.init()

    with pytest.raises(InputError, match="larger than the broker accepts") as failure:
        txn.send_many(topic, values, [b"same-key"] * len(values))  # one partition
        txn.prepare()
    txn.detach()

    assert topic in str(failure.value)
    assert read_topic(kafka_bootstrap, topic, "read_committed") == []


def test_a_batch_for_a_missing_topic_fails_naming_it(kafka_bootstrap: str) -> None:
    topic = f"missing_{uuid.uuid4().hex[:8]}"  # the test broker creates no topic by itself
    txn_id = f"arrowtest_{uuid.uuid4().hex[:8]}-0"
    txn = TaskTransaction(producer_config(kafka_bootstrap, {}, txn_id, 60_000), timeout_s=30)
    txn.init()

    with pytest.raises(InputError, match=f"topic '{topic}' .* does not exist"):
        txn.send_many(topic, [b"v"], [b"k"])
    txn.abort()
    txn.detach()
