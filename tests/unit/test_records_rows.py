"""Records mode on the row writer (PySpark 4.0): rows with only a key and a value are produced
in groups through `send_many`, after the first row alone; every row is produced, in order, by
`close`; other rows (a topic, partition or headers column) go one by one."""

from __future__ import annotations

import pytest
from pyspark.sql.types import BinaryType, StringType, StructField, StructType

from kafka_txn_sink.errors import InputError
from kafka_txn_sink.protocol.prepare import _feed_rows
from kafka_txn_sink.records import output
from kafka_txn_sink.records.columns import plan_columns
from kafka_txn_sink.records.output import RecordsOutput
from tests.unit.test_arrow_writer import FakeTxn

KEY_VALUE = StructType([StructField("key", StringType()), StructField("value", BinaryType())])


def test_rows_are_produced_in_groups_after_the_first(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(output, "ROW_BATCH", 4)
    rows = [(f"k{i}", f"v{i}".encode()) for i in range(11)]
    txn = FakeTxn()
    records = RecordsOutput(txn, plan_columns(KEY_VALUE, "out"), "out")

    _feed_rows([records], iter(rows), batch_id=0)
    assert len(txn.sent) == 9 and txn.bulk_calls == 2  # the first alone, then two groups of 4
    records.close()

    assert [(t, v, k) for t, v, k, _, _ in txn.sent] == [
        ("out", f"v{i}".encode(), f"k{i}".encode()) for i in range(11)
    ]
    assert txn.bulk_calls == 3


def test_values_without_keys_and_an_aborted_task(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(output, "ROW_BATCH", 100)
    schema = StructType([StructField("value", StringType())])
    txn = FakeTxn()
    records = RecordsOutput(txn, plan_columns(schema, "out"), "out")
    for i in range(5):
        records.add_row((f"v{i}",))
    records.abort()
    records.close()
    assert [(v, k) for _, v, k, _, _ in txn.sent] == [(b"v0", None)]


def test_a_topic_column_sends_row_by_row() -> None:
    schema = StructType([StructField("value", StringType()), StructField("topic", StringType())])
    txn = FakeTxn()
    records = RecordsOutput(txn, plan_columns(schema, None), None)
    for i in range(3):
        records.add_row((f"v{i}", f"t{i}"))
    records.close()
    assert [(t, v) for t, v, _, _, _ in txn.sent] == [(f"t{i}", f"v{i}".encode()) for i in range(3)]
    assert txn.bulk_calls == 0


def test_a_bad_value_in_a_group_names_the_column() -> None:
    txn = FakeTxn()
    records = RecordsOutput(txn, plan_columns(KEY_VALUE, "out"), "out")
    records.add_row(("k", b"v"))
    with pytest.raises(InputError, match="value"):
        records.add_row(("k", 5))
