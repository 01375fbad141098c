"""The verifier's report: every anomaly with every offending id, as JSON or for people.

Lists of ids stay in pyarrow arrays until they are written; `write_json` streams them, so a
report of millions of lost ids never exists as one Python list or one string.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import IO, Any

import numpy as np
import pyarrow as pa

from kafka_txn_sink.verify.ids import IdDiff, as_text, texts

Payload = dict[str, Any]


class RecordList:
    """Kafka records, by position, with the id (or location) each one carries, if any."""

    def __init__(self, label: str = "id") -> None:
        self.label = label
        self._chunks: list[tuple[str, np.ndarray, np.ndarray, pa.Array]] = []
        self.count = 0

    def add(
        self, topic: str, partitions: np.ndarray, offsets: np.ndarray, values: list[bytes | None]
    ) -> None:
        """Records of `topic` at these partitions and offsets, with their ids (or values)."""
        if len(values):
            self._chunks.append((topic, partitions, offsets, pa.array(values, pa.binary())))
            self.count += len(values)

    def rows(self, limit: int | None = None) -> Iterator[Payload]:
        """The records as JSON rows, the first `limit` of them (all: None)."""
        shown = 0
        for topic, partitions, offsets, values in self._chunks:
            for partition, offset, value in zip(
                partitions.tolist(), offsets.tolist(), values.to_pylist(), strict=True
            ):
                if limit is not None and shown >= limit:
                    return
                shown += 1
                yield {
                    "topic": topic,
                    "partition": partition,
                    "offset": offset,
                    self.label: None if value is None else as_text(value),
                }


@dataclass
class IdsReport:
    """One output's ids against the input's."""

    diff: IdDiff
    without_id: RecordList = field(default_factory=RecordList)

    def anomalies(self) -> dict[str, int]:
        """How many ids are lost, duplicated and unexpected."""
        return {
            "lost": len(self.diff.lost),
            "duplicated": len(self.diff.duplicated),
            "unexpected": len(self.diff.unexpected),
        }


@dataclass
class InputReport:
    """What was read of the input: its range, records and ids."""

    topics: list[str]
    id_source: str
    records: int
    ids: int
    without_id: RecordList
    range: Payload


@dataclass
class RecordsReport:
    """Records mode's outputs: their ids against the input's, and aborted reads."""

    topics: list[str]
    id_source: str
    records: int
    ids: IdsReport
    aborted_reads: RecordList


@dataclass
class FilesReport:
    """Files mode's outputs: references, files, their ids against the input's, orphans."""

    references_topic: str | None
    file_id_field: str
    references: int
    files_read: int
    rows: int
    ids: IdsReport
    without_id: list[Payload]  # {"location", "rows"}: rows whose id field is null or absent
    aborted_reads: RecordList  # references outside every decided batch's offsets
    not_references: RecordList  # messages of the references topic that are no reference
    undecided_references: list[Payload]
    duplicate_references: list[Payload]
    missing_files: list[str]
    unreferenced_files: list[Payload]
    orphan_files: list[Payload]
    left_by_failed_attempts: Payload
    record_count_mismatches: list[Payload]


@dataclass
class LogReport:
    """The commit log: decided and incomplete batches, counts that differ, recorded losses."""

    uri: str
    sink_id: str
    decided: int
    incomplete: list[int]
    count_mismatches: list[Payload]
    recorded_losses: list[Payload]
    unchecked: Payload


@dataclass
class VerifyReport:
    """Everything one verification found; `exact` when there is no anomaly."""

    input: InputReport
    records: RecordsReport | None
    files: FilesReport | None
    log: LogReport | None
    notes: list[str]
    elapsed_s: float = 0.0

    def anomalies(self) -> dict[str, int]:
        """How many of each kind of anomaly; every kind present, zero or not."""
        found = {"input.without_id": self.input.without_id.count}
        if self.records is not None:
            found.update({f"records.{k}": v for k, v in self.records.ids.anomalies().items()})
            found["records.without_id"] = self.records.ids.without_id.count
            found["records.aborted_reads"] = self.records.aborted_reads.count
        if self.files is not None:
            found.update(_files_anomalies(self.files))
        if self.log is not None:
            found["log.count_mismatches"] = len(self.log.count_mismatches)
            found["log.recorded_losses"] = len(self.log.recorded_losses)
        return found

    @property
    def exact(self) -> bool:
        """No anomaly of any kind."""
        return not any(self.anomalies().values())

    def to_json(self) -> Payload:
        """The whole report as plain JSON values (every list in full)."""
        materialized: Payload = json.loads(json.dumps(self._payload(None), default=_plain))
        return materialized

    def write_json(self, out: IO[str]) -> None:
        """The report as one JSON document, long lists streamed."""
        _write(self._payload(None), out, 0)
        out.write("\n")

    def payload(self, limit: int) -> Payload:
        """The report with every list cut to `limit` items (for people; counts stay whole)."""
        materialized: Payload = json.loads(json.dumps(self._payload(limit), default=_plain))
        return materialized

    def _payload(self, limit: int | None) -> Payload:
        anomalies = self.anomalies()
        return {
            "exact": not any(anomalies.values()),
            "anomalies": anomalies,
            "input": _input_json(self.input, limit),
            "records": _records_json(self.records, limit) if self.records else None,
            "files": _files_json(self.files, limit) if self.files else None,
            "log": _log_json(self.log) if self.log else None,
            "notes": self.notes,
            "elapsed_s": round(self.elapsed_s, 3),
        }


def _files_anomalies(files: FilesReport) -> dict[str, int]:
    found = {f"files.{k}": v for k, v in files.ids.anomalies().items()}
    found.update(
        {
            "files.without_id": sum(x["rows"] for x in files.without_id),
            "files.aborted_reads": files.aborted_reads.count,
            "files.not_references": files.not_references.count,
            "files.undecided_references": len(files.undecided_references),
            "files.duplicate_references": len(files.duplicate_references),
            "files.missing_files": len(files.missing_files),
            "files.unreferenced_files": len(files.unreferenced_files),
            "files.orphan_files": len(files.orphan_files),
            "files.record_count_mismatches": len(files.record_count_mismatches),
        }
    )
    return found


# -- JSON shapes ---------------------------------------------------------------------------


class _Lazy:
    """A list or mapping produced on demand while writing."""

    def __init__(self, items: Callable[[], Iterator[Any]], mapping: bool = False) -> None:
        self.items = items
        self.mapping = mapping


def _plain(value: Any) -> Any:
    if isinstance(value, _Lazy):
        return dict(value.items()) if value.mapping else list(value.items())
    raise TypeError(f"not JSON: {type(value).__name__}")


def _ids(values: pa.Array, limit: int | None) -> _Lazy:
    return _Lazy(lambda: texts(values, limit))


def _counted(diff: IdDiff, limit: int | None) -> _Lazy:
    def items() -> Iterator[tuple[str, int]]:
        counts = diff.duplicated_counts.tolist()
        return zip(texts(diff.duplicated, limit), counts, strict=False)

    return _Lazy(items, mapping=True)


def _records(found: RecordList, limit: int | None) -> _Lazy:
    return _Lazy(lambda: found.rows(limit))


def _cut(items: list[Any], limit: int | None) -> list[Any]:
    return items if limit is None else items[:limit]


def _ids_json(report: IdsReport, limit: int | None) -> Payload:
    diff = report.diff
    return {
        "expected": diff.expected,
        "seen": diff.seen,
        "lost": _ids(diff.lost, limit),
        "lost_count": len(diff.lost),
        "duplicated": _counted(diff, limit),
        "duplicated_count": len(diff.duplicated),
        "unexpected": _ids(diff.unexpected, limit),
        "unexpected_count": len(diff.unexpected),
    }


def _input_json(found: InputReport, limit: int | None) -> Payload:
    return {
        "topics": found.topics,
        "id": found.id_source,
        "records": found.records,
        "ids": found.ids,
        "without_id": _records(found.without_id, limit),
        "without_id_count": found.without_id.count,
        "range": found.range,
    }


def _records_json(found: RecordsReport, limit: int | None) -> Payload:
    return {
        "topics": found.topics,
        "id": found.id_source,
        "records": found.records,
        **_ids_json(found.ids, limit),
        "without_id": _records(found.ids.without_id, limit),
        "without_id_count": found.ids.without_id.count,
        "aborted_reads": _records(found.aborted_reads, limit),
        "aborted_reads_count": found.aborted_reads.count,
    }


def _files_json(found: FilesReport, limit: int | None) -> Payload:
    return {
        "references_topic": found.references_topic,
        "file_id_field": found.file_id_field,
        "references": found.references,
        "files_read": found.files_read,
        "rows": found.rows,
        **_ids_json(found.ids, limit),
        "without_id": _cut(found.without_id, limit),
        "aborted_reads": _records(found.aborted_reads, limit),
        "aborted_reads_count": found.aborted_reads.count,
        "not_references": _records(found.not_references, limit),
        "not_references_count": found.not_references.count,
        "undecided_references": _cut(found.undecided_references, limit),
        "duplicate_references": _cut(found.duplicate_references, limit),
        "missing_files": _cut(found.missing_files, limit),
        "unreferenced_files": _cut(found.unreferenced_files, limit),
        "orphan_files": _cut(found.orphan_files, limit),
        "left_by_failed_attempts": found.left_by_failed_attempts,
        "record_count_mismatches": _cut(found.record_count_mismatches, limit),
    }


def _log_json(found: LogReport) -> Payload:
    return {
        "uri": found.uri,
        "sink_id": found.sink_id,
        "decided": found.decided,
        "incomplete": found.incomplete,
        "count_mismatches": found.count_mismatches,
        "recorded_losses": found.recorded_losses,
        "unchecked": found.unchecked,
    }


# -- streaming writer ----------------------------------------------------------------------


def _write(value: Any, out: IO[str], depth: int) -> None:
    """`json.dump(value, out, indent=2, sort_keys=True)`, streaming `_Lazy` items."""
    if isinstance(value, _Lazy):
        if value.mapping:
            _write_items(((str(k), v) for k, v in value.items()), out, depth, "{}")
        else:
            _write_items(((None, v) for v in value.items()), out, depth, "[]")
    elif isinstance(value, dict):
        _write_items(((str(k), value[k]) for k in sorted(value)), out, depth, "{}")
    elif isinstance(value, list | tuple):
        _write_items(((None, v) for v in value), out, depth, "[]")
    else:
        out.write(json.dumps(value))


def _write_items(
    items: Iterator[tuple[str | None, Any]], out: IO[str], depth: int, brackets: str
) -> None:
    inner = "\n" + "  " * (depth + 1)
    empty = True
    for key, item in items:
        out.write(("[" if brackets == "[]" else "{") + inner if empty else "," + inner)
        empty = False
        if key is not None:
            out.write(json.dumps(key) + ": ")
        _write(item, out, depth + 1)
    out.write(brackets if empty else "\n" + "  " * depth + brackets[1])
