"""The batches a commit log records, read as they arrive: what the sink's counters add up.

`LogReader.read()` returns what is new since its last call: each batch whose decision appeared
(`Decided`), each batch whose completion appeared (`Completed`), repairs recorded since, and
abort records (a failed attempt of a batch, with its cause) of the decided batches and of the
batch after the newest. It
remembers only the newest batch it has seen and the batches still incomplete, so a scrape reads
the log's new records, not all of it, and a vacuum that removes old records takes nothing back
from a total already counted. Its first read starts `history` batches before the newest (a log
of a long-running query holds a record or two per batch it ever wrote): a counter counts from
there, as Prometheus' counters count from their exporter's start.
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


@dataclass
class LogReader:
    """Reads a commit log's new batches, one `read()` at a time (not thread-safe)."""

    commit_log: CommitLog
    history: int = 100
    _started: bool = False
    _newest: int | None = None  # the newest batch whose decision was seen
    _incomplete: dict[int, Decision] = field(default_factory=dict)
    _repairs: dict[int, int] = field(default_factory=dict)  # batch -> repair levels seen
    _aborts: dict[int, int] = field(default_factory=dict)  # batch -> abort records seen

    def read(self) -> News:
        """What the log records since the last call (everything, the first time).

        Raises:
            CommitLogError: the log cannot be read; the next call reads the same again.
        """
        fresh = self.commit_log.decisions(after=self._after())
        completed = self._completions(list(self._incomplete.values()) + fresh)
        repaired = self._repaired(fresh)
        aborted = self._aborted(fresh)
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
        if fresh:
            self._newest = fresh[-1].batch_id
        self._started = True
        decided = tuple(Decided(d) for d in fresh)
        return News(decided, tuple(completed), tuple(repaired), tuple(aborted))

    @property
    def newest(self) -> int | None:
        """The newest decided batch seen, or None."""
        return self._newest

    @property
    def incomplete(self) -> list[int]:
        """The decided batches seen without a completion marker yet."""
        return sorted(self._incomplete)

    def _after(self) -> int | None:
        """Read decisions above this batch (None: all)."""
        if self._started:
            return self._newest
        latest = self.commit_log.latest_decision()
        return None if latest is None else latest.batch_id - self.history

    def _completions(self, decisions: list[Decision]) -> list[Completed]:
        found = []
        for decision in decisions:
            completion = self.commit_log.completion(decision.batch_id)
            if completion is not None:
                found.append(Completed(decision, completion))
        return found

    def _repaired(self, fresh: list[Decision]) -> list[Repaired]:
        """Repairs of the new batches and of the newest one seen before: a replay repairs only
        the batch it replays, the newest, before the next is decided."""
        found = []
        before = self._newest_decision() if self._started else None
        for decision in ([before] if before is not None else []) + fresh:
            levels = batch_levels(self.commit_log, decision).levels[1:]
            seen = self._repairs.get(decision.batch_id, 0)
            if len(levels) > seen:
                new = levels[seen:]
                found.append(Repaired(decision.batch_id, len(new), sum(d.rows for d in new)))
        return found

    def _aborted(self, fresh: list[Decision]) -> list[Abort]:
        """Abort records not seen before: the rounds a new decision's batch closed before it,
        and those of the batch after the newest decided one (failing now, perhaps again)."""
        rounds = [(d.batch_id, d.round) for d in fresh]
        newest = fresh[-1].batch_id if fresh else self._newest
        following = 0 if newest is None else newest + 1
        rounds.append((following, self.commit_log.settled(following)[1]))
        found = []
        for batch_id, closed in rounds:
            for round_ in range(self._aborts.get(batch_id, 0), closed):
                record = self.commit_log.outcome(batch_id, round_)
                if isinstance(record, Abort):
                    found.append(record)
        return found

    def _newest_decision(self) -> Decision | None:
        if self._newest is None:
            return None
        return self.commit_log.decision(self._newest)
