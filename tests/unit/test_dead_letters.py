"""Option badRows=deadLetter in a task: a row whose fault is its own goes to the dead-letter
topic in the task's transaction, judged before anything of it is produced; the other rows go
out in order; a fault the brokers report is never the row's."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pytest
from pyspark.sql.types import BinaryType, IntegerType, StringType, StructField, StructType

from kafka_txn_sink.errors import InputError
from kafka_txn_sink.records.columns import plan_columns
from kafka_txn_sink.records.dead_letter import FRAMING_MARGIN, KIND, DeadLetters
from kafka_txn_sink.records.output import RecordsOutput
from kafka_txn_sink.records.provenance import Provenance
from tests.unit.test_arrow_writer import FakeTxn

KEY_VALUE = StructType([StructField("key", StringType()), StructField("value", BinaryType())])
LIMIT = 1_000 + FRAMING_MARGIN  # a record of more than 1,000 bytes is too large for "out"


@dataclass
class Topics(FakeTxn):
    """A transaction whose brokers know topics `out` (3 partitions) and `dlq`."""

    def partition_count(self, topic: str) -> int:
        if topic not in ("out", "dlq", "other"):
            raise InputError(f"topic {topic!r} does not exist", reason="topic")
        return 3


def output(schema: StructType, topic: str | None = "out") -> tuple[Topics, RecordsOutput]:
    txn = Topics()
    letters = DeadLetters("dlq", Provenance("orders", 4, 1), {"out": LIMIT, "dlq": 10 * LIMIT})
    return txn, RecordsOutput(txn, plan_columns(schema, topic), topic, dead_letters=letters)


def kinds(txn: FakeTxn) -> list[tuple[str, str | None]]:
    """Each record's topic and, for a dead letter, its kind, in the order produced."""
    found = []
    for topic, _, _, _, headers in txn.sent:
        kind = dict(headers or []).get(KIND)
        found.append((topic, kind.decode() if kind else None))
    return found


def test_a_group_with_a_bad_value_sets_that_row_aside_and_sends_the_rest_in_order() -> None:
    txn, records = output(KEY_VALUE)
    records.add_rows([("a", b"1"), ("b", 5), ("c", b"3")])
    assert kinds(txn) == [("out", None), ("dlq", "value_encoding"), ("out", None)]
    assert records.set_aside == 1
    _, value, key, _, headers = txn.sent[1]
    assert (key, value) == (b"b", b"5")  # the cell as JSON
    names = [name for name, _ in headers]
    assert names == [
        "kts.error.kind",
        "kts.error.message",
        "kts.sink",
        "kts.batch",
        "kts.task",
        "kts.seq",
    ]
    assert dict(headers)["kts.seq"] == b"1"


def test_a_record_too_large_for_its_topic_is_set_aside_before_it_is_produced() -> None:
    txn, records = output(KEY_VALUE)
    records.add_rows([("a", b"x" * 999), ("b", b"x" * 1_000), ("c", b"ok")])
    assert kinds(txn) == [("out", None), ("dlq", "too_large"), ("out", None)]


def test_topic_and_partition_columns_are_judged_against_the_brokers_metadata() -> None:
    schema = StructType(
        [
            StructField("value", BinaryType()),
            StructField("topic", StringType()),
            StructField("partition", IntegerType()),
        ]
    )
    txn, records = output(schema, topic=None)
    records.add_rows(
        [
            (b"1", "out", 0),
            (b"2", "missing", 0),
            (b"3", "other", 7),
            (b"4", None, 1),
            (b"5", "other", 2),
        ]
    )
    assert kinds(txn) == [
        ("out", None),
        ("dlq", "topic"),
        ("dlq", "partition"),
        ("dlq", "topic"),
        ("other", None),
    ]


def test_an_arrow_batch_with_a_faulty_row_goes_row_by_row() -> None:
    txn, records = output(KEY_VALUE)
    batch = pa.record_batch(
        [pa.array(["a", "b", "c"]), pa.array([b"1", b"x" * 2_000, b"3"], pa.binary())],
        ["key", "value"],
    )
    records.add_batch(batch)
    assert kinds(txn) == [("out", None), ("dlq", "too_large"), ("out", None)]
    clean = pa.record_batch([pa.array(["d"]), pa.array([b"4"], pa.binary())], ["key", "value"])
    txn.bulk_calls = 0
    records.add_batch(clean)
    assert txn.bulk_calls == 1  # a batch without a fault keeps the columnar path


def test_the_digest_leaves_the_position_out_so_a_reordered_replay_matches() -> None:
    rows = [("a", b"1"), ("b", 5), ("c", b"3"), ("d", 6)]
    _, first = output(KEY_VALUE)
    _, replay = output(KEY_VALUE)
    first.add_rows(rows)
    replay.add_rows(rows[::-1])
    assert first.digest() == replay.digest()


def test_a_fault_the_brokers_report_is_never_set_aside() -> None:
    @dataclass
    class Refusing(Topics):
        def send(self, *args: Any, **kwargs: Any) -> None:
            raise InputError("larger than the broker accepts", reason="delivery")

    txn = Refusing()
    letters = DeadLetters("dlq", Provenance("orders", 4, 1), {})
    records = RecordsOutput(txn, plan_columns(KEY_VALUE, "out"), "out", dead_letters=letters)
    with pytest.raises(InputError, match="larger than the broker accepts"):
        records.add_rows([("a", b"1")])
    assert records.set_aside == 0


def test_a_value_too_large_for_the_dead_letter_topic_is_cut_to_fit() -> None:
    txn = Topics()
    letters = DeadLetters("dlq", Provenance("orders", 4, 1), {"out": LIMIT, "dlq": LIMIT})
    records = RecordsOutput(txn, plan_columns(KEY_VALUE, "out"), "out", dead_letters=letters)
    records.add_rows([("a", b"x" * 5_000)])
    _, value, key, _, headers = txn.sent[0]
    size = len(key) + len(value) + sum(len(n) + len(v or b"") for n, v in headers)
    assert size <= LIMIT - FRAMING_MARGIN
    assert dict(headers)["kts.error.truncated"] == b"5000"
