"""The verifier's parts without a broker: ids, offset ranges, checkpoints, file names, report."""

from __future__ import annotations

import io
import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from confluent_kafka import KafkaError, TopicPartition
from hypothesis import given, settings
from hypothesis import strategies as st

from kafka_txn_sink import cli
from kafka_txn_sink.cli import verify as cli_verify
from kafka_txn_sink.errors import ConfigError, InputError, KafkaUnavailableError
from kafka_txn_sink.files.naming import parse_file_name
from kafka_txn_sink.protocol.messages import (
    Completion,
    Decision,
    FileRef,
    LostParticipant,
    OffsetRanges,
    Participant,
    Triple,
)
from kafka_txn_sink.storage.files import StoredFile
from kafka_txn_sink.testing.topics import compare_ids
from kafka_txn_sink.verify import VerifySpec
from kafka_txn_sink.verify.checkpoint import read_checkpoint
from kafka_txn_sink.verify.files import classify_stored
from kafka_txn_sink.verify.ids import IdSource, IdStore, compare
from kafka_txn_sink.verify.kafka import Chunk, KafkaReader, PartitionRange
from kafka_txn_sink.verify.log import BatchCounter, BatchView, LogView, OffsetIndex
from kafka_txn_sink.verify.report import (
    IdsReport,
    InputReport,
    RecordList,
    RecordsReport,
    VerifyReport,
)

# -- ids -----------------------------------------------------------------------------------


def test_id_source_parses_key_and_json_fields() -> None:
    assert IdSource.parse("key", "--input-id") == IdSource()
    assert IdSource.parse("json:event.id", "--input-id").field == ("event", "id")
    with pytest.raises(ConfigError, match="--output-id must be key, json:FIELD or registry:FIELD"):
        IdSource.parse("json:", "--output-id")
    with pytest.raises(ConfigError, match=r"^--output-id=registry:id needs --schema-registry-url$"):
        IdSource.parse("registry:id", "--output-id")
    with pytest.raises(ConfigError, match="--input-id"):
        IdSource.parse("value", "--input-id")


def test_id_source_reads_keys_and_json_values() -> None:
    assert IdSource().of(b"k1", b"{}") == b"k1"
    nested = IdSource.parse("json:e.id", "x")
    assert nested.of(None, b'{"e": {"id": "a"}}') == b"a"
    assert nested.of(None, b'{"e": {"id": 42}}') == b"42"  # the key b"42" is the same id
    assert nested.of(None, b'{"e": {}}') is None
    assert nested.of(None, b"not json") is None
    assert nested.of(None, b'{"e": 3}') is None
    assert nested.of(None, None) is None


def test_id_source_reads_registry_values_through_their_decoder() -> None:
    def decode(value: bytes) -> object:
        if not value.startswith(b"\x00"):
            raise InputError("not Confluent's wire format")
        return json.loads(value[5:])

    registry = IdSource.parse("registry:e.id", "--output-id", decode)
    assert str(registry) == "registry:e.id"
    assert registry.of(None, b'\x00\x00\x00\x00\x01{"e": {"id": "a"}}') == b"a"
    assert registry.of(None, b'{"e": {"id": "a"}}') is None  # not the wire format: no id


def store(*ids: str) -> IdStore:
    found = IdStore()
    found.extend([i.encode() for i in ids])
    return found


def test_a_loss_and_a_duplicate_do_not_cancel_out() -> None:
    diff = compare(store("a", "b", "c"), store("a", "c", "c"))

    assert (diff.expected, diff.seen) == (3, 3)
    assert diff.lost.to_pylist() == [b"b"]
    assert diff.duplicated.to_pylist() == [b"c"]
    assert diff.duplicated_counts.tolist() == [2]
    assert not diff.exact


def test_empty_sides() -> None:
    assert compare(store(), store()).exact
    assert compare(store("a"), store()).lost.to_pylist() == [b"a"]
    unexpected = compare(store(), store("z", "z"))
    assert unexpected.unexpected.to_pylist() == [b"z"]
    assert unexpected.duplicated.to_pylist() == [b"z"]  # unexpected, and twice


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.text("abcdefgh", min_size=0, max_size=3), max_size=60),
    st.lists(st.text("abcdefgh", min_size=0, max_size=3), max_size=60),
)
def test_compare_agrees_with_counting_every_id(expected: list[str], seen: list[str]) -> None:
    diff = compare(store(*expected), store(*seen))
    reference = compare_ids(expected, seen)

    assert [b.decode() for b in diff.lost.to_pylist()] == reference.missing
    assert (
        dict(
            zip(
                [b.decode() for b in diff.duplicated.to_pylist()],
                diff.duplicated_counts.tolist(),
                strict=True,
            )
        )
        == reference.duplicated
    )
    assert [b.decode() for b in diff.unexpected.to_pylist()] == reference.unexpected


def test_many_ids_spread_over_buckets() -> None:
    ids = [f"id-{n}" for n in range(20_000)]
    diff = compare(store(*ids), store(*ids[1:], ids[7]))

    assert diff.lost.to_pylist() == [b"id-0"]
    assert diff.duplicated.to_pylist() == [b"id-7"]


# -- the log's offsets -----------------------------------------------------------------------


def participant(partition: int, offsets: OffsetRanges, rows: int, attempt: int = 0) -> Participant:
    return Participant(partition, attempt, Triple(f"s-{partition}", 7, 0), rows, offsets)


def decision(batch_id: int, *participants: Participant) -> Decision:
    rows = sum(p.rows for p in participants)
    return Decision("s", "q", batch_id, participants, len(participants), rows, 1)


def test_offset_index_merges_a_batchs_interleaved_ranges() -> None:
    index = OffsetIndex(
        [(0, "out", 0, 0, 4), (0, "out", 0, 2, 9), (1, "out", 0, 12, 15), (1, "out", 1, 0, 3)]
    )
    offsets = np.array([0, 5, 9, 10, 11, 12, 15, 16])

    assert index.batches_of("out", 0, offsets).tolist() == [0, 0, 0, -1, -1, 1, 1, -1]
    assert index.batches_of("out", 1, np.array([3, 4])).tolist() == [1, -1]
    assert index.batches_of("other", 0, np.array([0])).tolist() == [-1]


def test_expected_records_leave_out_recorded_losses() -> None:
    lost = LostParticipant(Triple("s-1", 7, 0), 1, 5, {"out": {1: (0, 4)}}, "aborted")
    view = BatchView(
        decision(0, participant(0, {"out": {0: (0, 9)}}, 10), participant(1, {}, 5)),
        Completion("s", 0, 2, lost=(lost,)),
    )

    assert view.expected_records() == 10
    assert view.lost_rows() == 5


def test_batch_counts_and_the_batches_that_cannot_be_checked() -> None:
    log = LogView("log", "s")
    log.batches = {
        0: BatchView(decision(0, participant(0, {"out": {0: (0, 9)}}, 10)), None),
        1: BatchView(decision(1, participant(0, {"out": {0: (10, 14)}}, 5)), None),
        2: BatchView(decision(2, participant(0, {"refs": {0: (0, 0)}}, 1)), None),
        3: BatchView(decision(3, participant(0, {"out": {0: (15, 20)}}, 6)), None),
    }
    counter = BatchCounter(topics_read={"out"})
    counter.add(np.array([0] * 10 + [1] * 4 + [-1]))

    wrong, not_read, after = counter.mismatches(log, {"out": {0: 15}})

    assert wrong == [{"batch": 1, "expected": 5, "seen": 4}]
    assert not_read == [2]
    assert after == [3]  # decided past where the reading stopped


# -- the checkpoint --------------------------------------------------------------------------


def checkpoint(path: Path, ends: dict[int, dict[str, dict[str, int]]], commits: list[int]) -> Path:
    for folder in ("offsets", "commits", "sources/0"):
        (path / folder).mkdir(parents=True, exist_ok=True)
    meta = json.dumps({"batchWatermarkMs": 0, "batchTimestampMs": 1, "conf": {}})
    for batch, end in ends.items():
        (path / "offsets" / str(batch)).write_text(f"v1\n{meta}\n-\n{json.dumps(end)}")
        (path / "offsets" / f".{batch}.crc").write_bytes(b"crc")
    for batch in commits:
        (path / "commits" / str(batch)).write_text('v1\n{"nextBatchWatermarkMs":0}')
    (path / "sources/0/0").write_bytes(b'\0v1\n{"in":{"0":3,"1":0}}')
    return path


def test_checkpoint_ends_at_the_last_committed_batch(tmp_path: Path) -> None:
    ends = {0: {"in": {"0": 5, "1": 2}}, 1: {"in": {"0": 9, "1": 4}}, 2: {"in": {"0": 12}}}
    found = read_checkpoint(str(checkpoint(tmp_path, ends, [0, 1])), ["in"])

    assert (found.batch, found.committed) == (1, 1)
    assert found.end == {"in": {0: 9, 1: 4}}
    assert found.start == {"in": {0: 3, 1: 0}}
    assert found.notes == []


def test_checkpoint_takes_a_batch_the_log_decided_before_spark_committed(tmp_path: Path) -> None:
    ends = {0: {"in": {"0": 5}}, 1: {"in": {"0": 9}}}
    found = read_checkpoint(str(checkpoint(tmp_path, ends, [0])), ["in"], decided=[0, 1])

    assert (found.batch, found.committed) == (1, 0)
    assert found.end == {"in": {0: 9}}
    assert "batch 1 is decided in the commit log" in found.notes[0]


def test_checkpoint_errors_name_the_option(tmp_path: Path) -> None:
    path = checkpoint(tmp_path / "c", {0: {"in": {"0": 5}}}, [0])
    with pytest.raises(ConfigError, match="--input-topic other: not read by the query"):
        read_checkpoint(str(path), ["other"])
    empty = checkpoint(tmp_path / "e", {0: {"in": {"0": 5}}}, [])
    with pytest.raises(ConfigError, match="no batch is committed yet"):
        read_checkpoint(str(empty), ["in"])
    with pytest.raises(ConfigError, match="not a Spark streaming checkpoint"):
        read_checkpoint(str(tmp_path / "nothing"), ["in"])


# -- files -----------------------------------------------------------------------------------


def test_file_names_of_this_sink_parse() -> None:
    name = "user=a/part-0000000012-00003-001-00004-0a1b2c3d.avro"
    parsed = parse_file_name(name)
    assert parsed is not None
    assert (parsed.batch_id, parsed.partition, parsed.attempt, parsed.seq) == (12, 3, 1, 4)
    assert parsed.token == "0a1b2c3d"
    assert parse_file_name(f"user=a/.{name.split('/')[1]}.0a1b.tmp") == parsed
    assert parse_file_name("user=a/part-notes.avro") is None


def test_stored_files_are_listed_left_over_or_orphans() -> None:
    listed = "part-0000000001-00000-000-00000-aaaaaaaa.avro"
    names = {
        listed: "listed",
        "part-0000000001-00000-000-00001-aaaaaaaa.avro": "orphan",  # the decided attempt's
        "part-0000000001-00000-000-00000-bbbbbbbb.avro": "left",  # an earlier run's attempt 0
        "part-0000000001-00000-001-00000-cccccccc.avro": "left",  # a losing attempt
        "part-0000000002-00000-000-00000-dddddddd.avro": "left",  # an undecided batch
        ".part-0000000001-00000-000-00002-aaaaaaaa.avro.12ab.tmp": "left",  # a temporary
        "README.txt": "orphan",
        "_schemas/abc.avsc": "schema",
    }
    stored = [StoredFile(n, 10, 1.0) for n in names]
    found = classify_stored(
        stored, lambda n: f"/root/{n}", {f"/root/{listed}": []}, {(1, 0, 0): {"aaaaaaaa"}}
    )

    assert found.listed == 1 and found.schemas == 1
    assert sorted(f.name for f in found.orphans) == sorted(
        n for n, kind in names.items() if kind == "orphan"
    )
    assert sorted(f.name for f in found.left_by_failed_attempts) == sorted(
        n for n, kind in names.items() if kind == "left"
    )


def test_log_view_files_and_attempts() -> None:
    ref = FileRef("/root/u=a/part-0000000004-00002-001-00000-abcdef01.avro", "u=a", {}, 3, 9, "f")
    log = LogView("log", "s")
    log.batches = {
        4: BatchView(decision(4, Participant(2, 1, Triple("s-2", 7, 0), 1, {}, (ref,))), None)
    }

    assert log.files() == {ref.location: [(4, ref)]}
    assert log.attempts() == {(4, 2, 1): {"abcdef01"}}


# -- the report ------------------------------------------------------------------------------


def report() -> VerifyReport:
    without = RecordList()
    without.add("in", np.array([0]), np.array([7]), [None])
    aborted = RecordList()
    aborted.add("out", np.array([1, 1]), np.array([3, 4]), [b"x", b"\xff"])
    return VerifyReport(
        input=InputReport(["in"], "key", 4, 3, without, {"source": "topic ends"}),
        records=RecordsReport(
            ["out"],
            "key",
            5,
            IdsReport(compare(store("a", "b", "c"), store("a", "c", "c", "x", ""))),
            aborted,
        ),
        files=None,
        log=None,
        notes=["a note"],
    )


def test_streamed_json_is_the_same_document() -> None:
    found = report()
    out = io.StringIO()
    found.write_json(out)

    body = json.loads(out.getvalue())
    assert out.getvalue() == json.dumps(found.to_json(), indent=2, sort_keys=True) + "\n"
    assert body["exact"] is False
    assert body["records"]["lost"] == ["b"]
    assert body["records"]["duplicated"] == {"c": 2}
    assert body["records"]["unexpected"] == ["", "x"]
    assert body["records"]["aborted_reads"][1] == {
        "topic": "out",
        "partition": 1,
        "offset": 4,
        "id": "\\xff",  # bytes that are not UTF-8 are escaped, not dropped
    }
    assert body["anomalies"]["input.without_id"] == 1


def test_the_payload_for_people_is_capped_but_counts_stay() -> None:
    body = report().payload(1)
    assert body["records"]["unexpected"] == [""]
    assert body["records"]["unexpected_count"] == 2
    assert len(body["records"]["aborted_reads"]) == 1
    assert body["anomalies"]["records.aborted_reads"] == 2


# -- the spec and the command line -------------------------------------------------------------


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"input_topics": ()}, "--input-topic is required"),
        ({}, "nothing to verify"),
        ({"path": "/data"}, "--path needs --log"),
        ({"output_topics": ("o",), "output_id": "json"}, "--output-id must be key, json:FIELD"),
        ({"output_topics": ("o",), "log_format": "xml"}, "--log-format"),
    ],
)
def test_spec_errors_name_the_option(changes: dict[str, Any], message: str) -> None:
    spec = replace(VerifySpec(bootstrap="b:1", input_topics=("in",)), **changes)
    with pytest.raises(ConfigError, match=message):
        spec.check()


def test_cli_usage_error_before_any_broker(capsys: pytest.CaptureFixture[str]) -> None:
    # The broker address is unreachable on purpose: the options are checked first.
    code = cli.main(["verify", "--bootstrap", "127.0.0.1:1", "--input-topic", "in"])
    err = capsys.readouterr().err

    assert code == 2
    assert err.startswith("kafka-txn-sink: error: nothing to verify")
    assert cli.main(["verify", "--input-topic", "in", "--output-topic", "o"]) == 2
    assert "--bootstrap" in capsys.readouterr().err


# -- the range reader, on a scripted consumer -------------------------------------------------


class _Error:
    def code(self) -> int:
        return KafkaError._PARTITION_EOF

    def str(self) -> str:
        return "end of partition"


class _Message:
    def __init__(self, topic: str, partition: int, offset: int, eof: bool = False) -> None:
        self._where = (topic, partition, offset)
        self._eof = eof

    def topic(self) -> str:
        return self._where[0]

    def partition(self) -> int:
        return self._where[1]

    def offset(self) -> int:
        return self._where[2]

    def error(self) -> _Error | None:
        return _Error() if self._eof else None

    def key(self) -> bytes:
        return f"{self._where[1]}:{self._where[2]}".encode()


class _Consumer:
    """Hands out scripted batches, then nothing."""

    def __init__(self, batches: list[list[_Message]]) -> None:
        self.batches = batches
        self.paused: list[int] = []

    def consume(self, count: int, timeout: float) -> list[_Message]:
        return self.batches.pop(0) if self.batches else []

    def assign(self, partitions: object) -> None:
        pass

    resume = assign

    def unassign(self) -> None:
        pass

    def pause(self, partitions: list[TopicPartition]) -> None:
        self.paused += [p.partition for p in partitions]

    def position(self, partitions: list[TopicPartition]) -> list[TopicPartition]:
        return [TopicPartition(p.topic, p.partition, 0) for p in partitions]


def scripted(batches: list[list[_Message]], stall_s: float = 5.0) -> KafkaReader:
    reader = KafkaReader("127.0.0.1:1", stall_timeout_s=stall_s)
    reader._consumer.close()
    reader._consumer = _Consumer(batches)  # type: ignore[assignment]
    return reader


def read_all(reader: KafkaReader, ranges: list[PartitionRange]) -> list[tuple[int, int]]:
    seen: list[tuple[int, int]] = []

    def take(chunk: Chunk) -> None:
        seen.extend(zip(chunk.partitions.tolist(), chunk.offsets.tolist(), strict=True))

    reader.read("t", ranges, take)
    return seen


def test_records_before_their_partitions_eof_in_one_batch_are_all_read() -> None:
    batch = [_Message("t", 0, 0), _Message("t", 1, 0), _Message("t", 0, 1)]
    # The EOF events come after the records in the same batch, below the range ends.
    batch += [_Message("t", 0, 2, eof=True), _Message("t", 1, 1, eof=True)]
    reader = scripted([batch])

    seen = read_all(reader, [PartitionRange("t", 0, 0, 2), PartitionRange("t", 1, 0, 1)])

    assert sorted(seen) == [(0, 0), (0, 1), (1, 0)]


def test_records_past_the_range_and_of_other_topics_are_not_read() -> None:
    batch = [_Message("old", 0, 0), _Message("t", 0, 4), _Message("t", 0, 5), _Message("t", 0, 6)]
    reader = scripted([batch])

    seen = read_all(reader, [PartitionRange("t", 0, 4, 6)])

    assert seen == [(0, 4), (0, 5)]
    assert reader._consumer.paused == [0]  # type: ignore[attr-defined]


def test_a_partition_without_progress_is_an_error_naming_it() -> None:
    reader = scripted([[_Message("t", 0, 0)]], stall_s=0.2)

    with pytest.raises(
        KafkaUnavailableError, match=r"no progress in 0.2 s reading t\[0\] \(up to 5\)"
    ):
        read_all(reader, [PartitionRange("t", 0, 0, 5)])


def test_progress_bars_count_and_finish() -> None:
    with cli_verify._progress(enabled=True) as progress:
        task = progress.task("reading", 10)
        task.advance(4)
        task.finish()
        bars = progress._progress  # type: ignore[attr-defined]
        [shown] = bars.tasks
    assert (shown.completed, shown.total, shown.description) == (10, 10, "reading")
    with cli_verify._progress(enabled=False) as silent:
        silent.task("x", None).advance(1)  # no bar, no output
