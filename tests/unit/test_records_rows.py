"""Records mode on the row writer (PySpark 4.0): the task hands rows over in groups after the
first row alone; rows with only a key and a value are produced a group at a time through
`send_many`, with their cells turned into bytes a column at a time; other rows (a topic,
partition or headers column) go one by one. Every row is produced, in order."""

from __future__ import annotations

import pytest
from pyspark.sql import Row
from pyspark.sql.types import BinaryType, StringType, StructField, StructType

from kafka_txn_sink.errors import InputError
from kafka_txn_sink.protocol import prepare
from kafka_txn_sink.protocol.prepare import _feed_rows
from kafka_txn_sink.records.columns import bytes_cells, plan_columns
from kafka_txn_sink.records.output import RecordsOutput
from tests.unit.test_arrow_writer import FakeTxn

KEY_VALUE = StructType([StructField("key", StringType()), StructField("value", BinaryType())])


def test_rows_are_produced_in_groups_after_the_first(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(prepare, "ROWS_PER_CALL", 4)
    rows = [Row(key=f"k{i}", value=bytearray(f"v{i}".encode())) for i in range(11)]
    txn = FakeTxn()
    records = RecordsOutput(txn, plan_columns(KEY_VALUE, "out"), "out")

    _feed_rows([records], iter(rows), batch_id=0)

    assert txn.bulk_calls == 4  # the first row alone, then 4, 4 and 3
    assert [(t, v, k) for t, v, k, _, _ in txn.sent] == [
        ("out", f"v{i}".encode(), f"k{i}".encode()) for i in range(11)
    ]
    assert all(type(v) is bytes and type(k) is bytes for _, v, k, _, _ in txn.sent)
    assert records.close() == ()


def test_values_without_keys() -> None:
    schema = StructType([StructField("value", StringType())])
    txn = FakeTxn()
    records = RecordsOutput(txn, plan_columns(schema, "out"), "out")
    records.add_rows([(f"v{i}",) for i in range(3)])
    assert [(v, k) for _, v, k, _, _ in txn.sent] == [(b"v0", None), (b"v1", None), (b"v2", None)]


def test_a_topic_column_sends_row_by_row() -> None:
    schema = StructType([StructField("value", StringType()), StructField("topic", StringType())])
    txn = FakeTxn()
    records = RecordsOutput(txn, plan_columns(schema, None), None)
    records.add_rows([(f"v{i}", f"t{i}") for i in range(3)])
    assert [(t, v) for t, v, _, _, _ in txn.sent] == [(f"t{i}", f"v{i}".encode()) for i in range(3)]
    assert txn.bulk_calls == 0


def test_a_bad_value_in_a_group_names_the_column_and_sends_nothing_of_the_group() -> None:
    txn = FakeTxn()
    records = RecordsOutput(txn, plan_columns(KEY_VALUE, "out"), "out")
    records.add_rows([("k", b"v")])
    with pytest.raises(InputError, match="column value holds a int"):
        records.add_rows([("k", b"w"), ("k", 5)])
    assert [v for _, v, _, _, _ in txn.sent] == [b"v"]


@pytest.mark.parametrize(
    ("cells", "expected"),
    [
        ([b"a", None], [b"a", None]),
        ([bytearray(b"a"), bytearray(b"\xff")], [b"a", b"\xff"]),
        (["a", "ü"], [b"a", "ü".encode()]),
        ([bytearray(b"a"), None, "b", memoryview(b"c")], [b"a", None, b"b", b"c"]),
        ([], []),
    ],
)
def test_cells_become_bytes(cells: list[object], expected: list[bytes | None]) -> None:
    converted = bytes_cells(cells, "key")
    assert converted == expected
    assert all(c is None or type(c) is bytes for c in converted)


@pytest.mark.parametrize("arrow", [False, True])
def test_provenance_headers_come_last_and_stay_out_of_the_digest(arrow: bool) -> None:
    """Each record gets the task's provenance after its own headers, with its ordinal in the
    task; the digest is that of the same records without them, so a replay whose rows come in
    another order (other ordinals) still matches."""
    import pyarrow as pa

    from kafka_txn_sink.records.provenance import Provenance

    rows = [(f"k{i}", f"v{i}".encode()) for i in range(5)]
    plain, stamped = FakeTxn(), FakeTxn()
    without = RecordsOutput(plain, plan_columns(KEY_VALUE, "out"), "out")
    provenance = Provenance("orders", 7, 2)
    within = RecordsOutput(stamped, plan_columns(KEY_VALUE, "out"), "out", provenance=provenance)
    replayed = RecordsOutput(
        FakeTxn(), plan_columns(KEY_VALUE, "out"), "out", provenance=provenance
    )
    if arrow:

        def batch(part: list[tuple[str, bytes]]) -> pa.RecordBatch:
            keys, values = zip(*part, strict=True)
            return pa.record_batch(
                [pa.array(keys), pa.array(values, pa.binary())], ["key", "value"]
            )

        without.add_batch(batch(rows))
        within.add_batch(batch(rows[:2]))
        within.add_batch(batch(rows[2:]))
        replayed.add_batch(batch(rows[::-1]))
    else:
        without.add_rows(rows)
        within.add_rows(rows[:2])
        within.add_rows(rows[2:])
        replayed.add_rows(rows[::-1])

    assert [headers for *_, headers in stamped.sent] == [
        [
            ("kts.sink", b"orders"),
            ("kts.batch", b"7"),
            ("kts.task", b"2"),
            ("kts.seq", str(i).encode()),
        ]
        for i in range(5)
    ]
    assert without.digest() == within.digest() == replayed.digest()
