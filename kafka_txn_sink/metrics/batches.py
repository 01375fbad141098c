"""The batches a commit log records, read as they arrive: what the sink's counters add up.

`LogReader.read()` returns what is new since its last call: each batch whose decision appeared
(`Decided`), each batch whose completion appeared (`Completed`), repairs recorded since, and
abort records (a failed attempt of a batch, with its cause) of the decided batches and of the
batch after the newest. It keeps the newest decision, the batches still incomplete and what the
newest two batches had, so a scrape reads the log's new records, not all of it, and a vacuum
that removes old records takes nothing back from a total already counted. Its first read is a
baseline: counters count from the exporter's start, as Prometheus expects of a counter after a
restart (`history` makes them start that many batches earlier, for a first look at a log; an
exporter restarted with it counts those batches again).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from kafka_txn_sink.commit_log import CommitLog
from kafka_txn_sink.protocol.messages import Abort, Completion, Decision
from kafka_txn_sink.protocol.repair import batch_levels


@dataclass(frozen=True)
class Decided:
    """A batch whose decision the reader saw for the first time."""

    decision: Decision

    @property
    def files(self) -> int:
        """The files its participants wrote (files mode)."""
        return sum(len(p.files) for p in self.decision.participants)

    @property
    def file_bytes(self) -> int:
        """The bytes of those files."""
        return sum(f.bytes for p in self.decision.participants for f in p.files)

    @property
    def dead_lettered(self) -> int:
        """Its rows written to the dead-letter topic (option badRows=deadLetter)."""
        return sum(p.dead_lettered for p in self.decision.participants)

    @property
    def transactions(self) -> int:
        """Its participants: the transactions it commits."""
        return len(self.decision.participants)


@dataclass(frozen=True)
class Completed:
    """A batch whose completion marker the reader saw for the first time."""

    decision: Decision
    completion: Completion

    @property
    def seconds(self) -> float:
        """From the decision to the completion marker: how long the batch's rows waited, once
        decided, to be visible (a driver down in between counts)."""
        return max(0, self.completion.completed_at_ms - self.decision.decided_at_ms) / 1000

    @property
    def lost_rows(self) -> int:
        """Rows of transactions the brokers aborted before their commit."""
        return sum(x.rows for x in self.completion.lost)


@dataclass(frozen=True)
class Repaired:
    """Repairs of a batch recorded since the reader last looked: how many levels, and the rows
    they wrote again."""

    batch_id: int
    levels: int
    rows: int


@dataclass(frozen=True)
class News:
    """What one `read()` found."""

    decided: tuple[Decided, ...] = ()
    completed: tuple[Completed, ...] = ()
    repaired: tuple[Repaired, ...] = ()
    aborted: tuple[Abort, ...] = ()
    latest: Decision | None = None  # the newest decision known, counted or not


@dataclass
class LogReader:
    """Reads a commit log's new batches, one `read()` at a time (not thread-safe).

    The first read is a baseline: it counts the `history` batches before the newest (none by
    default) and only notes what the log holds beyond them (the newest decision, its repairs,
    the aborts of the batch after it), so an exporter that starts again does not count again
    what it counted before.
    """

    commit_log: CommitLog
    history: int = 0
    _started: bool = False
    _floor: int | None = None  # decisions above this batch are new (None: all)
    _latest: Decision | None = None  # the newest decision seen
    _incomplete: dict[int, Decision] = field(default_factory=dict)
    _repairs: dict[int, int] = field(default_factory=dict)  # batch -> repair levels seen
    _aborts: dict[int, int] = field(default_factory=dict)  # batch -> abort rounds seen

    def read(self) -> News:
        """What the log records since the last call (the baseline's window, the first time).

        Raises:
            CommitLogError: the log cannot be read; the next call reads the same again.
        """
        floor, latest = self._floor, self._latest
        if not self._started:
            latest = self.commit_log.latest_decision()
            floor = None if latest is None else latest.batch_id - max(0, self.history)
        fresh = self.commit_log.decisions(after=floor)
        latest = fresh[-1] if fresh else latest
        completed = self._completions(list(self._incomplete.values()) + fresh)
        repaired = self._repaired(fresh, latest)
        aborted = self._aborted(fresh, latest)
        # Only now, when every read succeeded: a failed call changes nothing.
        done = {c.decision.batch_id for c in completed}
        for decision in fresh:
            if decision.batch_id not in done:
                self._incomplete[decision.batch_id] = decision
        for batch_id in done:
            self._incomplete.pop(batch_id, None)
        for repair in repaired:
            self._repairs[repair.batch_id] = self._repairs.get(repair.batch_id, 0) + repair.levels
        for abort in aborted:
            self._aborts[abort.batch_id] = max(self._aborts.get(abort.batch_id, 0), abort.round + 1)
        self._floor = latest.batch_id if latest is not None else floor
        self._latest = latest
        if not self._started:
            self._started = True
            counted = {d.batch_id for d in fresh}  # the baseline notes the others, uncounted
            repaired = [r for r in repaired if r.batch_id in counted]
            aborted = [a for a in aborted if a.batch_id in counted]
        self._forget_before(latest)
        decided = tuple(Decided(d) for d in fresh)
        return News(decided, tuple(completed), tuple(repaired), tuple(aborted), latest)

    @property
    def latest(self) -> Decision | None:
        """The newest decision the last successful read knew."""
        return self._latest

    @property
    def incomplete(self) -> list[int]:
        """The decided batches seen without a completion marker yet."""
        return sorted(self._incomplete)

    def _forget_before(self, latest: Decision | None) -> None:
        """Drop what only older batches need: repairs and aborts come to the newest and the
        next batch only."""
        if latest is None:
            return
        for seen in (self._repairs, self._aborts):
            for batch_id in [b for b in seen if b < latest.batch_id]:
                del seen[batch_id]

    def _completions(self, decisions: list[Decision]) -> list[Completed]:
        found = []
        for decision in decisions:
            completion = self.commit_log.completion(decision.batch_id)
            if completion is not None:
                found.append(Completed(decision, completion))
        return found

    def _repaired(self, fresh: list[Decision], latest: Decision | None) -> list[Repaired]:
        """Repairs of the new batches and of the newest one: a replay repairs only the batch
        it replays, the newest, before the next is decided."""
        found = []
        wanted = {d.batch_id: d for d in fresh}
        if latest is not None:
            wanted.setdefault(latest.batch_id, latest)
        for batch_id, decision in sorted(wanted.items()):
            levels = batch_levels(self.commit_log, decision).levels[1:]
            seen = self._repairs.get(batch_id, 0)
            if len(levels) > seen:
                new = levels[seen:]
                found.append(Repaired(batch_id, len(new), sum(d.rows for d in new)))
        return found

    def _aborted(self, fresh: list[Decision], latest: Decision | None) -> list[Abort]:
        """Abort records not seen before: the rounds a new decision's batch closed before it,
        and those of the batch after the newest decided one (failing now, perhaps again)."""
        rounds = [(d.batch_id, d.round) for d in fresh]
        following = 0 if latest is None else latest.batch_id + 1
        rounds.append((following, self.commit_log.settled(following)[1]))
        found = []
        for batch_id, closed in rounds:
            for round_ in range(self._aborts.get(batch_id, 0), closed):
                record = self.commit_log.outcome(batch_id, round_)
                if isinstance(record, Abort):
                    found.append(record)
        return found
