"""What the commit log says was committed, in the shape the verifier checks records against.

Every visible record of the sink's topics must lie in the offsets of a decided batch's
participants (or of a republish round of a decided batch, files mode); a visible record
anywhere else is an aborted read. Each decided batch must show exactly as many records as it
decided, less what its completion marker records as lost, plus what repairs wrote again.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

import numpy as np

from kafka_txn_sink.commit_log import CommitLog
from kafka_txn_sink.files.naming import parse_file_name
from kafka_txn_sink.protocol.messages import (
    Completion,
    Decision,
    FileRef,
    LostParticipant,
    OffsetRanges,
    Triple,
)
from kafka_txn_sink.protocol.repair import BatchLevels, batch_levels
from kafka_txn_sink.verify.kafka import Chunk, Progress

_MAX_REPUBLISH_ROUNDS = 100  # a bound on the rounds read per batch; recovery stops far below


@dataclass(frozen=True)
class BatchView:
    """One decided batch: its decision, completion (if any), and republish rounds' ranges."""

    decision: Decision
    completion: Completion | None
    republished: tuple[tuple[OffsetRanges, int], ...] = ()  # (offsets, references) per round
    repairs: tuple[Decision, ...] = ()  # repair levels 1, 2, ... (protocol/repair.py)
    repair_completions: tuple[Completion | None, ...] = ()

    def levels(self) -> BatchLevels:
        """The decision and its repairs, with their completions."""
        return BatchLevels(
            (self.decision, *self.repairs), (self.completion, *self.repair_completions)
        )

    def unrepaired(self) -> list[LostParticipant]:
        """Lost participants no repair wrote again: the batch's losses as they stand."""
        levels = self.levels()
        return [*levels.waiting(), *levels.refused()]

    @property
    def batch_id(self) -> int:
        """The batch decided."""
        return self.decision.batch_id

    def ranges(self) -> list[tuple[str, int, int, int]]:
        """(topic, partition, first, last) of every transaction this batch may have made
        visible."""
        found = [
            (topic, partition, first, last)
            for level in self.levels().levels
            for participant in level.participants
            for topic, parts in participant.offsets.items()
            for partition, (first, last) in parts.items()
        ]
        found += [
            (topic, partition, first, last)
            for offsets, _ in self.republished
            for topic, parts in offsets.items()
            for partition, (first, last) in parts.items()
        ]
        return found

    def expected_records(self) -> int:
        """Records the batch should show: every participant's, but those recorded as lost or
        republished (whose own records the broker aborted), plus the last republish round's."""
        republished = set(self._republished_partitions())
        kept = sum(
            p.rows
            for p in self.decision.participants
            if p.triple not in self._lost() and p.partition not in republished
        )
        repaired = sum(
            p.rows for r in self.repairs for p in r.participants if p.triple not in self._lost()
        )
        return kept + repaired + (self.republished[-1][1] if self.republished else 0)

    def lost_rows(self) -> int:
        """Rows recorded lost and not repaired (0 while incomplete)."""
        return sum(x.rows for x in self.unrepaired())

    def _lost(self) -> set[Triple]:
        completions = (self.completion, *self.repair_completions)
        return {x.triple for c in completions if c is not None for x in c.lost}

    def _republished_partitions(self) -> tuple[int, ...]:
        return self.completion.republished if self.completion else ()


@dataclass
class LogView:
    """Every decided batch of a sink's commit log."""

    uri: str
    sink_id: str
    batches: dict[int, BatchView] = field(default_factory=dict)

    @classmethod
    def load(cls, commit_log: CommitLog, sink_id: str, progress: Progress) -> LogView:
        """Read every decided batch of `commit_log`, its completion and republish rounds."""
        view = cls(commit_log.uri, sink_id)
        decided = commit_log.decided_batches()
        task = progress.task("reading the commit log", len(decided))
        for batch_id in decided:
            decision = commit_log.decision(batch_id)
            if decision is not None:
                completion = commit_log.completion(batch_id)
                # Only files mode republishes, and a completion names the partitions it did.
                republished = completion is None or bool(completion.republished)
                rounds = _republish_rounds(commit_log, batch_id) if republished else ()
                view.batches[batch_id] = BatchView(decision, completion, rounds)
                if completion is not None and completion.lost:  # only then can it have repairs
                    levels = batch_levels(commit_log, decision)
                    view.batches[batch_id] = BatchView(
                        decision, completion, rounds, levels.levels[1:], levels.completions[1:]
                    )
            task.advance(1)
        task.finish()
        return view

    @property
    def decided(self) -> list[int]:
        """The decided batch ids, ascending."""
        return sorted(self.batches)

    @property
    def incomplete(self) -> list[int]:
        """Decided batches without a completion marker, ascending."""
        return [b for b, view in sorted(self.batches.items()) if view.completion is None]

    def files(self) -> dict[str, list[tuple[int, FileRef]]]:
        """location -> every (batch, file) the decisions list there (normally one)."""
        found: dict[str, list[tuple[int, FileRef]]] = {}
        for batch_id, view in sorted(self.batches.items()):
            for participant in view.decision.participants:
                for ref in participant.files:
                    found.setdefault(ref.location, []).append((batch_id, ref))
        return found

    def attempts(self) -> dict[tuple[int, int, int], set[str]]:
        """(batch, Spark partition, attempt) of every decided participant -> the tokens in its
        files' names (see files.naming)."""
        found: dict[tuple[int, int, int], set[str]] = {}
        for batch_id, view in self.batches.items():
            for participant in view.decision.participants:
                tokens = found.setdefault(
                    (batch_id, participant.partition, participant.attempt), set()
                )
                for ref in participant.files:
                    parsed = parse_file_name(ref.location)
                    if parsed is not None:
                        tokens.add(parsed.token)
        return found

    def index(self) -> OffsetIndex:
        """Which batch's ranges hold each offset of the sink's topics."""
        return OffsetIndex(
            (view.batch_id, *r) for view in self.batches.values() for r in view.ranges()
        )


def _republish_rounds(commit_log: CommitLog, batch_id: int) -> tuple[tuple[OffsetRanges, int], ...]:
    rounds: list[tuple[OffsetRanges, int]] = []
    for round_ in range(_MAX_REPUBLISH_ROUNDS):
        record = commit_log.republish(batch_id, round_)
        if record is None:
            break
        rounds.append((record.offsets, record.references))
    return tuple(rounds)


class OffsetIndex:
    """Which decided batch's ranges hold an offset, per topic partition (vectorised).

    The ranges of one batch are merged where they overlap (its tasks write the same partitions
    concurrently); ranges of different batches never overlap in a sound log.
    """

    def __init__(self, ranges: Iterable[tuple[int, str, int, int, int]]) -> None:
        grouped: dict[tuple[str, int], dict[int, list[tuple[int, int]]]] = {}
        for batch_id, topic, partition, first, last in ranges:
            grouped.setdefault((topic, partition), {}).setdefault(batch_id, []).append(
                (first, last)
            )
        self._index: dict[tuple[str, int], tuple[np.ndarray, np.ndarray, np.ndarray]] = {}
        for key, by_batch in grouped.items():
            rows = sorted(
                (first, last, batch_id)
                for batch_id, spans in by_batch.items()
                for first, last in _merge(spans)
            )
            columns = np.array(rows, np.int64).reshape(-1, 3)
            self._index[key] = (columns[:, 0].copy(), columns[:, 1].copy(), columns[:, 2].copy())

    @property
    def topics(self) -> set[str]:
        """The topics any decided range is in."""
        return {topic for topic, _ in self._index}

    def batches_of_chunk(self, chunk: Chunk) -> np.ndarray:
        """The decided batch of each record of `chunk`, -1 where none holds it."""
        batches = np.full(len(chunk.offsets), -1, np.int64)
        for partition in np.unique(chunk.partitions).tolist():
            where = chunk.partitions == partition
            batches[where] = self.batches_of(chunk.topic, partition, chunk.offsets[where])
        return batches

    def batches_of(self, topic: str, partition: int, offsets: np.ndarray) -> np.ndarray:
        """The decided batch of each offset, -1 where none holds it."""
        found = self._index.get((topic, partition))
        result = np.full(len(offsets), -1, np.int64)
        if found is None or not len(offsets):
            return result
        starts, ends, batches = found
        at = np.searchsorted(starts, offsets, side="right") - 1
        inside = (at >= 0) & (offsets <= ends[np.maximum(at, 0)])
        result[inside] = batches[at[inside]]
        return result


def _merge(spans: list[tuple[int, int]]) -> list[tuple[int, int]]:
    merged: list[tuple[int, int]] = []
    for first, last in sorted(spans):
        if merged and first <= merged[-1][1] + 1:
            merged[-1] = (merged[-1][0], max(merged[-1][1], last))
        else:
            merged.append((first, last))
    return merged


@dataclass
class BatchCounter:
    """Visible records per decided batch, over the topics the verifier read."""

    counts: Counter[int] = field(default_factory=Counter)
    topics_read: set[str] = field(default_factory=set)

    def add(self, batches: np.ndarray) -> None:
        """Count one record per entry of `batches` (-1 entries, outside every batch, are not)."""
        values, counts = np.unique(batches[batches >= 0], return_counts=True)
        for batch_id, count in zip(values.tolist(), counts.tolist(), strict=True):
            self.counts[batch_id] += count

    def mismatches(
        self, log: LogView, read_end: Mapping[str, Mapping[int, int]]
    ) -> tuple[list[dict[str, int]], list[int], list[int]]:
        """Batches whose visible records differ from what they decided; and the batches that
        cannot be checked because they wrote a topic not read, or past where the reading
        stopped (decided while the verifier ran, or with transactions still open)."""
        wrong: list[dict[str, int]] = []
        not_read: list[int] = []
        after: list[int] = []
        for batch_id, view in sorted(log.batches.items()):
            ranges = view.ranges()
            if any(
                topic in read_end and last >= read_end[topic].get(partition, -1)
                for topic, partition, _, last in ranges
            ):
                after.append(batch_id)
            elif any(topic not in self.topics_read for topic, _, _, _ in ranges):
                not_read.append(batch_id)
            else:
                expected, seen = view.expected_records(), self.counts.get(batch_id, 0)
                if expected != seen:
                    wrong.append({"batch": batch_id, "expected": expected, "seen": seen})
        return wrong, not_read, after
