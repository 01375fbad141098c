"""Payload mode on the Arrow path: every file must be what the row path writes (the same
directories, header schema and records read back with fastavro), natively encoded where
Arrow's JSON reader follows the rules of json_schema and by the row path from the same spool
where it does not; bad payloads fail naming the column; rolling keeps its meaning."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any
from unittest.mock import patch

import fastavro
import pyarrow as pa
import pytest
from hypothesis import given
from hypothesis import strategies as st
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import BinaryType, StringType, StructField, StructType

from kafka_txn_sink.errors import InputError
from kafka_txn_sink.files import open_file, payload_arrow
from kafka_txn_sink.files.json_schema import Irreconcilable
from kafka_txn_sink.files.naming import FileNaming
from kafka_txn_sink.files.payload_arrow import KEEP_BYTES
from kafka_txn_sink.files.payload_spool import CHUNK_BYTES
from kafka_txn_sink.files.plan import FilePlan, plan_files
from kafka_txn_sink.files.references import WrittenFile
from kafka_txn_sink.files.writer import FileSet
from kafka_txn_sink.storage.files import LocalFileSink
from tests.unit.avro_support import PROPERTY, same
from tests.unit.test_files_arrow import by_rows
from tests.unit.test_json_schema import MODES, OBJECTS

SCHEMA = StructType([StructField("user", StringType()), StructField("payload", StringType())])


def plan(**kwargs: Any) -> FilePlan:
    kwargs.setdefault("partition_by", ["user"])
    schema = kwargs.pop("schema", SCHEMA)
    return plan_files(schema, payload_column="payload", **kwargs)


def batches(payloads: list[Any], size: int = 40, users: int = 3) -> list[pa.RecordBatch]:
    rows = [
        {
            "user": f"u{i % users}",
            "payload": p if p is None or isinstance(p, str) else json.dumps(p),
        }
        for i, p in enumerate(payloads)
    ]
    arrow = to_arrow_schema(SCHEMA)
    return [
        pa.RecordBatch.from_pylist(rows[i : i + size], schema=arrow)
        for i in range(0, len(rows), size)
    ]


def by_batches(
    plan_: FilePlan, batches_: list[pa.RecordBatch], root: Path
) -> tuple[list[WrittenFile], int]:
    """The files of the Arrow path, and how many rows were encoded natively."""
    with FileSet(plan_, LocalFileSink(root, durable=False), FileNaming(7, 3, 0)) as files:
        for batch in batches_:
            assert files.accepts(batch.schema)
            files.add_batch(batch)
        written = files.close()
        return written, files.native_rows


def read(written: WrittenFile) -> tuple[dict[str, Any], list[Any]]:
    with open(written.ref.location, "rb") as f:
        reader = fastavro.reader(f)
        records = list(reader)
    return json.loads(reader.metadata["avro.schema"]), records


def assert_same_files(expected: list[WrittenFile], got: list[WrittenFile]) -> None:
    """The same files per directory (the paths close the files of different directories in
    another order)."""
    expected = sorted(expected, key=lambda w: w.ref.partition_path)
    got = sorted(got, key=lambda w: w.ref.partition_path)
    assert [w.ref.partition_path for w in got] == [w.ref.partition_path for w in expected]
    for want, have in zip(expected, got, strict=True):
        want_schema, want_records = read(want)
        have_schema, have_records = read(have)
        assert have_schema == want_schema == have.schema
        assert have.ref.schema_fingerprint == want.ref.schema_fingerprint
        assert have.ref.records == want.ref.records
        assert same(have_records, want_records)


def log_line(i: int, rnd: random.Random) -> dict[str, Any]:
    line: dict[str, Any] = {
        "ts": f"2026-11-23T10:{i % 60:02d}:00.123Z",
        "day": "2026-11-23",  # Arrow reads this as a timestamp: it must stay the text
        "level": rnd.choice(["INFO", "WARN", "ERROR"]),
        "status": rnd.choice([200, 404, 500]),
        "latency": rnd.choice([1, 2.5, 1e-3]),
        "ok": rnd.random() < 0.5,
        "tags": [f"t{j}" for j in range(rnd.randrange(3))],
        "http": {"path": f"/items/{i}", "headers": {"a-b": "x"}} if i % 4 else None,
        "items": [{"sku": f"s{j}", "q": j} for j in range(rnd.randrange(3))],
        "nothing": None,
        "always_empty": [],
        "1st": "é\u2028😀",
    }
    if i % 5 == 0:
        line["rare"] = {"deep": [[1, 2], [], [None]]}
    return line


def test_log_lines_are_encoded_natively_as_the_row_path_writes_them(tmp_path: Path) -> None:
    rnd = random.Random(5)
    payloads = [log_line(i, rnd) for i in range(500)]
    expected = by_rows(plan(), batches(payloads), tmp_path / "rows")
    got, native = by_batches(plan(), batches(payloads), tmp_path / "arrow")
    assert native == len(payloads)
    assert_same_files(expected, got)
    schema = got[0].schema
    assert {f["name"]: f["type"] for f in schema["fields"]}["day"] == "string"


@pytest.mark.parametrize(
    "payloads",
    [
        [{"a": 1}, {"a": "x"}],  # two kinds: a union
        [{"a": True}, {"a": 1}],  # a boolean is never a number
        ['{"a": 1, "a": 2}'],  # the row path keeps the last
        ['{"a": "\\ud800"}'],  # a lone surrogate
        ['{"a": 1e400}'],  # beyond a double
        [{"e": {}}],  # a record without fields
        [{"e": [None]}],  # an array of nulls
        [{"x": None}],  # no field carries data
        ['{"a": 1} {"b": 2}'],  # two objects on one line
    ],
)
def test_what_arrow_reads_otherwise_is_written_by_the_row_path(
    tmp_path: Path, payloads: list[Any]
) -> None:
    expected = (
        by_rows(plan(partition_by=[]), batches(payloads), tmp_path / "rows")
        if payloads[0] != '{"a": 1} {"b": 2}'
        else None
    )
    if expected is None:
        with pytest.raises(InputError, match="column payload is not valid JSON"):
            by_batches(plan(partition_by=[]), batches(payloads), tmp_path / "arrow")
        return
    got, native = by_batches(plan(partition_by=[]), batches(payloads), tmp_path / "arrow")
    assert native == 0
    assert_same_files(expected, got)


@PROPERTY
@given(objs=OBJECTS, mode=MODES, chunk_bytes=st.sampled_from([CHUNK_BYTES, 40]))
def test_every_file_is_the_row_paths(
    tmp_path_factory: pytest.TempPathFactory,
    objs: list[dict[str, Any]],
    mode: Irreconcilable,
    chunk_bytes: int,
) -> None:
    root = tmp_path_factory.mktemp("payloads")
    plan_ = plan(irreconcilable=mode)
    expected = by_rows(plan_, batches(objs, size=3, users=2), root / "rows")
    with patch.object(open_file, "CHUNK_BYTES", chunk_bytes):  # 40: a chunk per batch part
        got, _ = by_batches(plan_, batches(objs, size=3, users=2), root / "arrow")
    assert_same_files(expected, got)


def chunked_payloads(third: Any) -> list[dict[str, Any]]:
    """Payloads whose types change from chunk to chunk: ints, then doubles and a new record
    field, then `third` in field `a` and a field of empty arrays."""
    first = [{"a": i, "ts": f"2026-11-23T10:00:{i % 60:02d}"} for i in range(100)]
    second = [{"a": i / 3, "o": {"x": i, "y": "z"}} for i in range(100)]
    return first + second + [{"a": third, "e": []} for _ in range(100)]


@pytest.mark.parametrize("keep_bytes", [KEEP_BYTES, 3_000, 0])
@pytest.mark.parametrize(("third", "natively"), [(None, True), (7, True), ("text", False)])
def test_a_file_read_in_chunks_is_the_row_paths(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    third: Any,
    natively: bool,
    keep_bytes: int,
) -> None:
    monkeypatch.setattr(open_file, "CHUNK_BYTES", 2_000)
    monkeypatch.setattr(payload_arrow, "KEEP_BYTES", keep_bytes)  # 0: every chunk read twice
    payloads = chunked_payloads(third)
    expected = by_rows(plan(partition_by=[]), batches(payloads), tmp_path / "rows")
    got, native = by_batches(plan(partition_by=[]), batches(payloads), tmp_path / "arrow")
    assert native == (len(payloads) if natively else 0)
    assert_same_files(expected, got)


# One kind per position (numbers mix, nulls anywhere, fields come and go): what Arrow's reader
# types by the rules. Floats are finite (NaN, Infinity: the row path's json.dumps writes them
# bare; both read them, but equality is the point of another test).
NUMBERS = st.integers(-(2**63), 2**63 - 1) | st.floats(allow_nan=False, allow_infinity=False)
TEXT = st.text(alphabet=st.characters(exclude_categories=["Cs"]), max_size=5)
ONE_KIND = st.fixed_dictionaries(
    {},
    optional={
        "n": st.none() | NUMBERS,
        "s": st.none() | TEXT,
        "b": st.none() | st.booleans(),
        # [null, 0] is read by Arrow as an invalid array: the row path writes such files
        "l": st.none() | st.lists(st.none() | NUMBERS, max_size=3),
        "o": st.none()
        | st.fixed_dictionaries(
            {"x-y": TEXT}, optional={"z": st.lists(st.fixed_dictionaries({"q": st.booleans()}))}
        ),
        "é": st.just([]),
    },
)


def natively_readable(objs: list[dict[str, Any]]) -> bool:
    """Enough for a file of `objs` to be encoded natively: some value is not null and no array
    starts with a null."""
    values = [v for o in objs for v in o.values()]
    lists = [v for v in values if isinstance(v, list) and v]
    return any(v is not None for v in values) and not any(v[0] is None for v in lists)


@PROPERTY
@given(objs=st.lists(ONE_KIND, min_size=1, max_size=12))
def test_objects_of_one_kind_per_position_are_encoded_natively(
    tmp_path_factory: pytest.TempPathFactory, objs: list[dict[str, Any]]
) -> None:
    root = tmp_path_factory.mktemp("one-kind")
    expected = by_rows(plan(), batches(objs, size=5, users=1), root / "rows")
    got, native = by_batches(plan(), batches(objs, size=5, users=1), root / "arrow")
    assert_same_files(expected, got)
    assert native == len(objs) if natively_readable(objs) else native in (0, len(objs))


@pytest.mark.parametrize(
    ("payload", "message"),
    [
        (None, r"row 2 of task partition 3: column payload is null"),
        ("[1, 2]", r"row 2 of task partition 3: column payload holds a JSON list"),
        ('{"a": 1', r"column payload is not valid JSON: .* \(payload 3 of the file for user=u0\)"),
    ],
)
def test_bad_payloads_name_the_column(tmp_path: Path, payload: str | None, message: str) -> None:
    with pytest.raises(InputError, match=message):
        by_batches(plan(), batches([{"a": 1}, {"a": 2}, payload, {"a": 3}], users=1), tmp_path)


def test_pretty_printed_and_binary_payloads(tmp_path: Path) -> None:
    pretty = [json.dumps({"a": i, "b": {"c": [i]}}, indent=2) for i in range(30)]
    expected = by_rows(plan(), batches(pretty), tmp_path / "rows")
    got, native = by_batches(plan(), batches(pretty), tmp_path / "arrow")
    assert native == 0  # a payload with a line break goes row by row
    assert_same_files(expected, got)

    binary = StructType([StructField("user", StringType()), StructField("payload", BinaryType())])
    rows = [{"user": "u", "payload": json.dumps({"a": i}).encode()} for i in range(30)]
    batch = pa.RecordBatch.from_pylist(rows, schema=to_arrow_schema(binary))
    got, native = by_batches(plan(schema=binary), [batch], tmp_path / "binary")
    assert native == 30
    assert read(got[0])[1] == [{"a": i} for i in range(30)]


@pytest.mark.parametrize("limits", [{"max_records_per_file": 70}, {"max_bytes_per_file": 2_000}])
def test_files_roll_as_on_the_row_path(tmp_path: Path, limits: dict[str, int]) -> None:
    payloads = [{"i": i, "text": "y" * (i % 50)} for i in range(600)]
    got, native = by_batches(plan(**limits), batches(payloads, size=64), tmp_path)
    assert native == 600
    records = [r for w in got for r in read(w)[1]]
    assert sorted(r["i"] for r in records) == list(range(600))
    if "max_records_per_file" in limits:
        assert max(w.ref.records for w in got) == 70
    else:
        spooled = [sum(len(json.dumps(r)) + 1 for r in read(w)[1]) for w in got]
        assert len(got) > 6 and max(spooled) < 2_000 + 200
