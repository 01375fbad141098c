"""The file side of the verifier (files mode): reference messages, Avro files, orphans.

A reader of files mode follows the reference messages (or the commit log) to the files, so the
ids it sees are the ids in the referenced files, once per reference. Files under the sink's
path that no decision lists are either left by failed task attempts (named by this sink's
`files.naming` after an undecided batch, or after an attempt the decision did not pick: garbage
for `kafka-txn-sink vacuum`, invisible to readers) or orphans nobody can explain.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import IO, Any

import fastavro
from botocore.exceptions import BotoCoreError, ClientError

from kafka_txn_sink.errors import StagingError
from kafka_txn_sink.files.naming import is_schema_file, is_temp, parse_file_name
from kafka_txn_sink.files.references import parse_reference
from kafka_txn_sink.protocol.messages import FileRef
from kafka_txn_sink.storage import S3Settings, open_file_sink, parse_location
from kafka_txn_sink.storage.files import StoredFile
from kafka_txn_sink.storage.s3 import code_of, make_client, status_of
from kafka_txn_sink.verify.ids import IdStore, compare, id_bytes
from kafka_txn_sink.verify.kafka import Chunk, Progress
from kafka_txn_sink.verify.log import BatchCounter, LogView, OffsetIndex
from kafka_txn_sink.verify.report import FilesReport, IdsReport, Payload, RecordList

_NOT_FOUND = {"404", "NoSuchKey", "NotFound"}


# -- references ----------------------------------------------------------------------------


@dataclass(frozen=True)
class ReferenceSeen:
    """One reference message a read_committed consumer sees."""

    ref: FileRef
    batch_id: int | None
    partition: int
    offset: int


def parse_reference_message(value: bytes | None) -> tuple[FileRef, int | None] | None:
    """The file a reference names and its batch; None when the message is no reference."""
    if value is None:
        return None
    try:
        ref = parse_reference(value)
        batch = json.loads(value).get("batch_id")
    except (ValueError, TypeError):
        return None
    return ref, batch if isinstance(batch, int) else None


# -- files ---------------------------------------------------------------------------------


@dataclass
class FileIds:
    """What one Avro file holds, counted while its ids were handed over."""

    location: str
    rows: int = 0
    without_id: int = 0  # rows whose id field is null or absent
    missing: bool = False  # the file does not exist
    has_field: bool = True  # the id field is in the file's schema


_CHUNK = 10_000


class FileReader:
    """Reads the id field of every row of Avro files at local paths or `s3://` locations."""

    def __init__(self, id_field: str, s3: S3Settings | None = None) -> None:
        self.id_field = id_field
        self._s3 = s3 or S3Settings()
        self._client: Any = None

    def read(self, location: str, on_ids: Callable[[list[bytes]], None]) -> FileIds:
        """Hand the ids of every row to `on_ids`, in chunks; rows without one are counted.

        Raises:
            StagingError: the file exists but cannot be read or is not Avro.
        """
        result = FileIds(location)
        try:
            with self._open(location) as stream:
                if stream is None:
                    result.missing = True
                    return result
                self._read_rows(stream, result, on_ids)
        except (ValueError, EOFError, OSError) as exc:
            raise StagingError(f"cannot read the Avro file {location}: {exc}") from exc
        return result

    def _read_rows(
        self, stream: IO[bytes], result: FileIds, on_ids: Callable[[list[bytes]], None]
    ) -> None:
        rows = fastavro.reader(stream)
        schema = rows.writer_schema
        fields = schema.get("fields", []) if isinstance(schema, dict) else []
        name = self.id_field
        result.has_field = any(f.get("name") == name for f in fields)
        chunk: list[bytes] = []
        for row in rows:
            result.rows += 1
            ident = id_bytes(row.get(name)) if isinstance(row, dict) else None
            if ident is None:
                result.without_id += 1
                continue
            chunk.append(ident)
            if len(chunk) >= _CHUNK:
                on_ids(chunk)
                chunk = []
        if chunk:
            on_ids(chunk)

    @contextmanager
    def _open(self, location: str) -> Iterator[IO[bytes] | None]:
        parsed = parse_location(location, "file", StagingError)
        if parsed.scheme != "s3":
            try:
                stream = open(parsed.path, "rb")  # noqa: SIM115 (closed below)
            except FileNotFoundError:
                yield None
                return
            with stream:
                yield stream
            return
        with tempfile.TemporaryFile() as spool:
            if not self._download(parsed.bucket, parsed.path.lstrip("/"), spool, location):
                yield None
                return
            spool.seek(0)
            yield spool

    def _download(self, bucket: str, key: str, spool: IO[bytes], location: str) -> bool:
        if self._client is None:
            self._client = make_client(self._s3)
        try:
            body = self._client.get_object(Bucket=bucket, Key=key)["Body"]
            shutil.copyfileobj(body, spool, 1024 * 1024)
        except ClientError as exc:
            if code_of(exc) in _NOT_FOUND or status_of(exc) == 404:
                return False
            raise StagingError(self._scrub(f"cannot read {location}: {exc}")) from exc
        except BotoCoreError as exc:
            raise StagingError(self._scrub(f"cannot read {location}: {exc}")) from exc
        return True

    def _scrub(self, message: str) -> str:
        secret = self._s3.secret_access_key
        return message.replace(secret, "***") if secret else message


# -- what is stored under the path -----------------------------------------------------------


@dataclass
class StoredClasses:
    """The files under the sink's path, by what they are."""

    listed: int = 0  # a decision lists it
    left_by_failed_attempts: list[StoredFile] = field(default_factory=list)
    orphans: list[StoredFile] = field(default_factory=list)
    schemas: int = 0


def classify_stored(
    stored: Sequence[StoredFile],
    location: Callable[[str], str],
    listed: Mapping[str, object],
    attempts: Mapping[tuple[int, int, int], set[str]],
) -> StoredClasses:
    """Sort every stored file: listed by a decision, left by a failed attempt, or orphan.

    `attempts`: (batch, Spark partition, attempt) of each decided participant -> the tokens of
    its files. A file named for a decided participant with that participant's token, yet not
    listed, is an orphan: the decided attempt wrote it and its decision does not know it.
    """
    decided_batches = {batch for batch, _, _ in attempts}
    found = StoredClasses()
    for item in stored:
        if is_schema_file(item.name):
            found.schemas += 1
        elif location(item.name) in listed:
            found.listed += 1
        elif _from_failed_attempt(item.name, decided_batches, attempts):
            found.left_by_failed_attempts.append(item)
        else:
            found.orphans.append(item)
    return found


def _from_failed_attempt(
    name: str, decided: set[int], attempts: Mapping[tuple[int, int, int], set[str]]
) -> bool:
    parsed = parse_file_name(name)
    if parsed is None:
        return False
    if parsed.batch_id not in decided or is_temp(name):
        return True  # an undecided batch's, or a temporary no upload finished
    tokens = attempts.get((parsed.batch_id, parsed.partition, parsed.attempt))
    return tokens is None or parsed.token not in tokens


# -- the checks ------------------------------------------------------------------------------


@dataclass(frozen=True)
class FilesSpec:
    """What files mode verifies: see `verify.VerifySpec`."""

    references_topic: str | None
    path: str | None
    file_id_field: str
    s3: S3Settings | None


def take_references(
    refs: list[ReferenceSeen],
    aborted: RecordList,
    not_refs: RecordList,
    chunk: Chunk,
    index: OffsetIndex | None,
    counter: BatchCounter,
) -> None:
    """One chunk of the references topic: the references, the messages that are none, and
    the references outside every decided batch (aborted reads); counted per batch."""
    topic, partitions, offsets = chunk.topic, chunk.partitions, chunk.offsets
    batches = index.batches_of_chunk(chunk) if index is not None else None
    if batches is not None:
        counter.add(batches)
    for i, message in enumerate(chunk.messages):
        parsed = parse_reference_message(message.value())
        position = (partitions[i : i + 1], offsets[i : i + 1])
        if parsed is None:
            not_refs.add(topic, *position, [(message.value() or b"")[:200]])
            continue
        ref, batch_id = parsed
        refs.append(ReferenceSeen(ref, batch_id, int(partitions[i]), int(offsets[i])))
        if batches is not None and batches[i] < 0:
            aborted.add(topic, *position, [ref.location.encode()])


def _adder(ids: IdStore, times: int) -> Callable[[list[bytes]], None]:
    """Adds a file's ids once per reference to it: a file referenced twice is read twice."""

    def add(chunk: list[bytes]) -> None:
        for _ in range(times):
            ids.extend(chunk)

    return add


class FileChecks:
    """Files mode once the references are read: files, counts, orphans."""

    def __init__(
        self,
        spec: FilesSpec,
        log: LogView | None,
        refs: list[ReferenceSeen],
        unchecked: Sequence[int],
    ) -> None:
        """`unchecked`: decided batches that wrote past where the references were read."""
        self.spec = spec
        self.log = log
        self.refs = refs
        self.unchecked = set(unchecked)
        self.listed = log.files() if log else {}

    def run(
        self, aborted: RecordList, not_refs: RecordList, progress: Progress, notes: list[str]
    ) -> tuple[FilesReport, IdStore]:
        """The report (but its id comparison, which needs the input) and the ids read."""
        spec = self.spec
        followed = self._followed()
        ids = IdStore()
        report = FilesReport(
            references_topic=spec.references_topic,
            file_id_field=spec.file_id_field,
            references=len(self.refs),
            files_read=0,
            rows=0,
            ids=IdsReport(compare(IdStore(), IdStore())),
            without_id=[],
            aborted_reads=aborted,
            not_references=not_refs,
            undecided_references=self._undecided(),
            duplicate_references=[
                {"location": loc, "count": n} for loc, n in sorted(followed.items()) if n > 1
            ],
            missing_files=[],
            unreferenced_files=self._unreferenced(),
            orphan_files=[],
            left_by_failed_attempts={"count": 0, "bytes": 0},
            record_count_mismatches=[],
        )
        self._read_files(followed, ids, report, progress, notes)
        if spec.path:
            self._classify(report, notes)
        return report, ids

    def _followed(self) -> Counter[str]:
        """Location -> how many times a reader meets it: per reference, or per log listing."""
        if self.spec.references_topic:
            return Counter(r.ref.location for r in self.refs)
        return Counter({loc: len(found) for loc, found in self.listed.items()})

    def _undecided(self) -> list[Payload]:
        if self.log is None:
            return []
        return [
            {
                "batch": r.batch_id,
                "location": r.ref.location,
                "partition": r.partition,
                "offset": r.offset,
            }
            for r in self.refs
            if r.batch_id is None or r.batch_id not in self.log.batches
        ]

    def _unreferenced(self) -> list[Payload]:
        if self.log is None or not self.spec.references_topic:
            return []
        referenced = {r.ref.location for r in self.refs}
        return [
            {"batch": batch, "location": loc}
            for loc, found in sorted(self.listed.items())
            if loc not in referenced
            for batch, _ in found
            if batch not in self.unchecked
        ]

    def _read_files(
        self,
        followed: Counter[str],
        ids: IdStore,
        report: FilesReport,
        progress: Progress,
        notes: list[str],
    ) -> None:
        reader = FileReader(self.spec.file_id_field, self.spec.s3)
        claimed = self._claimed_records()
        no_field: list[str] = []
        task = progress.task("reading files", len(followed))
        for location, times in sorted(followed.items()):
            found = reader.read(location, _adder(ids, times))
            task.advance(1)
            if found.missing:
                report.missing_files.append(location)
                continue
            report.files_read += 1
            report.rows += found.rows * times
            if not found.has_field:
                no_field.append(location)
            if found.without_id:
                report.without_id.append({"location": location, "rows": found.without_id})
            wrong = {k: v for k, v in claimed.get(location, {}).items() if v != found.rows}
            if wrong:
                report.record_count_mismatches.append(
                    {"location": location, "file": found.rows, **wrong}
                )
        task.finish()
        if no_field:
            notes.append(
                f"{len(no_field)} file(s) have no field {self.spec.file_id_field!r} "
                f"(--file-id-field), e.g. {no_field[0]}"
            )

    def _claimed_records(self) -> dict[str, dict[str, int]]:
        """Location -> the record counts the log and the references claim for it."""
        claimed: dict[str, dict[str, int]] = {}
        for loc, found in self.listed.items():
            for _, ref in found:
                claimed.setdefault(loc, {})["log"] = ref.records
        for seen in self.refs:
            claimed.setdefault(seen.ref.location, {})["reference"] = seen.ref.records
        return claimed

    def _classify(self, report: FilesReport, notes: list[str]) -> None:
        assert self.spec.path is not None and self.log is not None
        sink = open_file_sink(self.spec.path, self.spec.s3)
        stored = sink.list()
        classes: StoredClasses = classify_stored(
            stored, sink.location, self.listed, self.log.attempts()
        )
        report.orphan_files = [
            {"name": f.name, "bytes": f.bytes, "modified_ms": int(f.modified_s * 1000)}
            for f in classes.orphans
        ]
        left = classes.left_by_failed_attempts
        report.left_by_failed_attempts = {"count": len(left), "bytes": sum(f.bytes for f in left)}
        if self.listed and not classes.listed:
            notes.append(
                f"none of the {len(self.listed)} files the log lists is under {sink.uri}: "
                "is --path the sink's path option?"
            )
