"""One verification, in order: the outputs' end offsets, the commit log, the input range, the
input's ids, the outputs' ids (records topics, reference messages and files), the report.

The order makes one consistent picture while the query may still run: the outputs' end offsets
are taken first (at read_committed: below any open transaction), then the commit log is read,
so every record under those ends was decided before the log was read.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import cast

import numpy as np

from kafka_txn_sink.commit_log import LogFormat, detect_format, open_commit_log
from kafka_txn_sink.errors import ConfigError
from kafka_txn_sink.protocol.messages import PROGRESS_PARTITION
from kafka_txn_sink.verify.checkpoint import read_checkpoint
from kafka_txn_sink.verify.files import FileChecks, FilesSpec, ReferenceSeen, take_references
from kafka_txn_sink.verify.ids import IdSource, IdStore, compare
from kafka_txn_sink.verify.kafka import (
    Chunk,
    KafkaReader,
    NoProgress,
    Offsets,
    PartitionRange,
    Progress,
    Watermarks,
    offsets_json,
)
from kafka_txn_sink.verify.log import BatchCounter, LogView, OffsetIndex
from kafka_txn_sink.verify.report import (
    FilesReport,
    IdsReport,
    InputReport,
    LogReport,
    Payload,
    RecordList,
    RecordsReport,
    VerifyReport,
)
from kafka_txn_sink.verify.spec import VerifySpec


def verify(spec: VerifySpec, progress: Progress | None = None) -> VerifyReport:
    """Read everything `spec` names and report every anomaly.

    Raises:
        ConfigError: an option is wrong (a topic that does not exist, no checkpoint there).
        KafkaTxnSinkError: the brokers, the commit log or the files cannot be read.
    """
    started = time.monotonic()
    input_source, output_source = spec.check()
    run = _Run(spec, progress or NoProgress())
    with KafkaReader(spec.bootstrap, spec.kafka, spec.timeout_s, spec.stall_timeout_s) as reader:
        marks = reader.watermarks(_topics(spec))
        log = run.load_log()
        ranges, range_info = run.input_ranges(marks, log)
        inputs = run.read_input(reader, ranges, input_source, range_info)
        index = log.index() if log else None
        counter = BatchCounter()
        records = run.read_records(reader, marks, output_source, index, counter)
        files = run.read_files(reader, marks, log, index, counter)
    expected = inputs[1]
    report = VerifyReport(
        input=inputs[0],
        records=_with_ids(records, expected) if records else None,
        files=_with_file_ids(files, expected) if files else None,
        log=run.log_report(log, counter) if log else None,
        notes=run.notes,
    )
    report.elapsed_s = time.monotonic() - started
    return report


def _topics(spec: VerifySpec) -> list[tuple[str, str]]:
    found = [(t, "--input-topic") for t in spec.input_topics]
    found += [(t, "--output-topic") for t in spec.output_topics]
    if spec.references_topic:
        found.append((spec.references_topic, "--references-topic"))
    return found


@dataclass
class _RecordsRead:
    topics: list[str]
    id_source: str
    records: int = 0
    ids: IdStore = field(default_factory=IdStore)
    without_id: RecordList = field(default_factory=RecordList)
    aborted_reads: RecordList = field(default_factory=RecordList)


@dataclass
class _FilesRead:
    report: FilesReport
    ids: IdStore


def _with_ids(read: _RecordsRead, expected: IdStore) -> RecordsReport:
    return RecordsReport(
        topics=read.topics,
        id_source=read.id_source,
        records=read.records,
        ids=IdsReport(compare(expected, read.ids), read.without_id),
        aborted_reads=read.aborted_reads,
    )


def _with_file_ids(read: _FilesRead, expected: IdStore) -> FilesReport:
    read.report.ids = IdsReport(compare(expected, read.ids))
    return read.report


class _Run:
    """One verification: the steps of `verify`, and the notes they leave."""

    def __init__(self, spec: VerifySpec, progress: Progress) -> None:
        self.spec = spec
        self.progress = progress
        self.notes: list[str] = []
        self.read_end: Offsets = {}

    # -- commit log ------------------------------------------------------------------------

    def load_log(self) -> LogView | None:
        spec = self.spec
        if not spec.log:
            if spec.output_topics:
                self.notes.append(
                    "no --log: aborted reads and counts against the commit log are not checked"
                )
            return None
        fmt = (
            detect_format(spec.log, spec.s3)
            if spec.log_format == "auto"
            else cast(LogFormat, spec.log_format)
        )
        commit_log = open_commit_log(spec.log, spec.s3, fmt)
        meta = commit_log.sink_meta()
        if meta is None:
            raise ConfigError(
                f"--log {spec.log}: no commit log there ({commit_log.uri} has no sink record); "
                "pass the sink's commitLog option"
            )
        log = LogView.load(commit_log, meta.sink_id, self.progress)
        if log.incomplete:
            self.notes.append(
                f"batches {log.incomplete} are decided but not completed: their records stay "
                "invisible until `kafka-txn-sink recover --execute` (or the query) completes them"
            )
        return log

    def log_report(self, log: LogView, counter: BatchCounter) -> LogReport:
        wrong, not_read, after = counter.mismatches(log, self.read_end)
        if not_read:
            self.notes.append(
                f"{len(not_read)} batch(es) wrote topics this verification did not read: their "
                "record counts are not checked"
            )
        if after:
            self.notes.append(
                f"batches {after} wrote past the outputs' end offsets taken at the start (decided "
                "meanwhile, or their transactions are still open): not checked"
            )
        losses = [
            {
                "batch": b,
                "transactional_id": x.triple.transactional_id,
                "partition": x.partition,
                "rows": x.rows,
                "offsets": {
                    t: {str(p): list(r) for p, r in parts.items()} for t, parts in x.offsets.items()
                },
                "reason": x.reason,
            }
            for b, view in sorted(log.batches.items())
            for x in view.unrepaired()
            if x.partition != PROGRESS_PARTITION
        ]
        groups = [
            b
            for b, view in sorted(log.batches.items())
            if any(x.partition == PROGRESS_PARTITION for x in view.unrepaired())
        ]
        if groups:
            self.notes.append(
                f"batches {groups}: their consumer group's offsets (option consumerGroup) were "
                "aborted with them and wait for the replay's repair; no row is lost by that"
            )
        return LogReport(
            uri=log.uri,
            sink_id=log.sink_id,
            decided=len(log.batches),
            incomplete=log.incomplete,
            count_mismatches=wrong,
            recorded_losses=losses,
            unchecked={"topics_not_read": not_read, "beyond_read_end": after},
        )

    # -- input -----------------------------------------------------------------------------

    def input_ranges(
        self, marks: Watermarks, log: LogView | None
    ) -> tuple[list[PartitionRange], Payload]:
        spec = self.spec
        if spec.checkpoint is None:
            self.notes.append(
                "no --checkpoint: the input is read up to the topics' end offsets when the "
                "verification started, which may be past what the query has processed"
            )
            ranges = [r for t in spec.input_topics for r in marks.ranges(t, {}, marks.end[t])]
            return ranges, {"source": "topic ends", "end": offsets_json(marks.end)}
        found = read_checkpoint(
            spec.checkpoint, spec.input_topics, spec.s3, log.decided if log else ()
        )
        self.notes.extend(found.notes)
        ranges = []
        for topic in spec.input_topics:
            spans = marks.ranges(topic, found.start.get(topic, {}), found.end[topic])
            ranges += self._checked(spans, marks, found.start, found.end)
        return ranges, {
            "source": "checkpoint",
            "checkpoint": spec.checkpoint,
            "batch": found.batch,
            "committed_batch": found.committed,
            "start": offsets_json(
                {
                    t: {r.partition: r.start for r in ranges if r.topic == t}
                    for t in spec.input_topics
                }
            ),
            "end": offsets_json(found.end),
        }

    def _checked(
        self, ranges: list[PartitionRange], marks: Watermarks, start: Offsets, end: Offsets
    ) -> list[PartitionRange]:
        for r in ranges:
            now = marks.end[r.topic][r.partition]
            if r.partition not in end[r.topic]:
                self.notes.append(
                    f"{r.topic}[{r.partition}] is not in the checkpoint's offsets: not read"
                )
            wanted = start.get(r.topic, {}).get(r.partition, 0)
            if wanted < marks.low[r.topic][r.partition] and r.end > r.start:
                self.notes.append(
                    f"{r.topic}[{r.partition}] starts at offset {r.start}: the records before "
                    "it were deleted (retention) and are not verified"
                )
            if r.end > now:
                raise ConfigError(
                    f"--checkpoint {self.spec.checkpoint}: the query read {r.topic}[{r.partition}] "
                    f"up to offset {r.end}, but it ends at {now} now (re-created topic, or an "
                    "open transaction in the input?)"
                )
        return ranges

    def read_input(
        self,
        reader: KafkaReader,
        ranges: list[PartitionRange],
        source: IdSource,
        range_info: Payload,
    ) -> tuple[InputReport, IdStore]:
        read = _RecordsRead(list(self.spec.input_topics), str(source))
        task = self.progress.task("reading the input", sum(r.size for r in ranges))
        for topic in self.spec.input_topics:
            spans = [r for r in ranges if r.topic == topic]
            reader.read(
                topic, spans, lambda chunk: _take_ids(read, chunk, source, None, None), task
            )
        task.finish()
        report = InputReport(
            topics=read.topics,
            id_source=read.id_source,
            records=read.records,
            ids=read.ids.count,
            without_id=read.without_id,
            range=range_info,
        )
        return report, read.ids

    # -- records mode ----------------------------------------------------------------------

    def read_records(
        self,
        reader: KafkaReader,
        marks: Watermarks,
        source: IdSource,
        index: OffsetIndex | None,
        counter: BatchCounter,
    ) -> _RecordsRead | None:
        topics = list(self.spec.output_topics)
        if not topics:
            return None
        read = _RecordsRead(topics, str(source))
        for topic in topics:
            ranges = self._output_ranges(topic, marks)
            task = self.progress.task(f"reading {topic}", sum(r.size for r in ranges))
            reader.read(
                topic, ranges, lambda chunk: _take_ids(read, chunk, source, index, counter), task
            )
            task.finish()
            counter.topics_read.add(topic)
        return read

    def _output_ranges(self, topic: str, marks: Watermarks) -> list[PartitionRange]:
        self.read_end[topic] = dict(marks.end[topic])
        return marks.ranges(topic, {}, marks.end[topic])

    # -- files mode ------------------------------------------------------------------------

    def read_files(
        self,
        reader: KafkaReader,
        marks: Watermarks,
        log: LogView | None,
        index: OffsetIndex | None,
        counter: BatchCounter,
    ) -> _FilesRead | None:
        spec = self.spec
        if not (spec.references_topic or spec.path):
            return None
        refs: list[ReferenceSeen] = []
        aborted, not_refs = RecordList("location"), RecordList("value")
        if spec.references_topic:
            topic = spec.references_topic
            ranges = self._output_ranges(topic, marks)
            task = self.progress.task(f"reading {topic}", sum(r.size for r in ranges))
            reader.read(
                topic,
                ranges,
                lambda chunk: take_references(refs, aborted, not_refs, chunk, index, counter),
                task,
            )
            task.finish()
            counter.topics_read.add(topic)
        checks = FileChecks(
            FilesSpec(spec.references_topic, spec.path, spec.file_id_field, spec.s3),
            log,
            refs,
            counter.mismatches(log, self.read_end)[2] if log else [],
        )
        report, ids = checks.run(aborted, not_refs, self.progress, self.notes)
        return _FilesRead(report, ids)


def _take_ids(
    read: _RecordsRead,
    chunk: Chunk,
    source: IdSource,
    index: OffsetIndex | None,
    counter: BatchCounter | None,
) -> None:
    """One chunk of a records topic (or the input): ids, and where the log has no batch."""
    if source.field:
        ids = [source.of(m.key(), m.value()) for m in chunk.messages]
    else:
        ids = [m.key() for m in chunk.messages]
    read.records += len(ids)
    topic, partitions, offsets = chunk.topic, chunk.partitions, chunk.offsets
    if None in ids:
        none = np.array([i is None for i in ids])
        read.without_id.add(topic, partitions[none], offsets[none], [None] * int(none.sum()))
        read.ids.extend([i for i in ids if i is not None])
    else:
        read.ids.extend(cast(list[bytes], ids))
    if index is None or counter is None:
        return
    batches = index.batches_of_chunk(chunk)
    counter.add(batches)
    outside = batches < 0
    if outside.any():
        read.aborted_reads.add(
            topic, partitions[outside], offsets[outside], [ids[i] for i in np.flatnonzero(outside)]
        )
