"""The promises of `CommitLog` (kafka_txn_sink/commit_log/base.py), for every format and place.

`CommitLogContract` holds the tests; a test module runs them by subclassing it as `Test…` and
giving a `place` fixture: tests/unit/test_commit_log_contract.py on a local directory,
tests/integration/test_commit_log_contract_s3.py on the test bed's S3 server, each for the JSON
and the Delta format. What only one format does (its layout, hint, table, corrupt records) is
tested in that format's own tests.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import pytest

from kafka_txn_sink.commit_log import CommitLog, JsonCommitLog, LogFormat
from kafka_txn_sink.commit_log.delta_log import DeltaCommitLog
from kafka_txn_sink.errors import CommitLogConflictError, CommitLogError
from kafka_txn_sink.protocol.messages import (
    Abort,
    Completion,
    Decision,
    LostParticipant,
    Participant,
    Republish,
    Triple,
)
from kafka_txn_sink.protocol.run_records import SinkMeta
from kafka_txn_sink.storage import S3Settings, open_storage
from tests.commit_log_races import make_decision

LOST = LostParticipant(
    triple=Triple("orders-1", 4001, 3),
    partition=1,
    rows=10,
    offsets={"events_out": {1: (30, 39)}},
    reason="aborted",
)


@dataclass(frozen=True)
class LogPlace:
    """Where and in which format a contract test keeps its log."""

    fmt: LogFormat
    location: str  # as a user gives it
    uri: str  # as the log names itself
    s3: S3Settings | None = None

    def open(self, recent: int = 20) -> CommitLog:
        """A new log object on the place: what another process would open."""
        if self.fmt == "json":
            return JsonCommitLog(open_storage(self.location, self.s3), recent=recent)
        return DeltaCommitLog(self.location, self.s3, recent=recent)


def republish(round_: int, epoch: int, at_ms: int = 10) -> Republish:
    """Round `round_` of batch 3's republishing, by the transaction of epoch `epoch`."""
    return Republish(
        sink_id="orders",
        batch_id=3,
        round=round_,
        partitions=(0, 2),
        triple=Triple("orders-republish", 4002, epoch),
        references=4,
        offsets={"refs": {0: (5, 8)}},
        recorded_at_ms=at_ms,
    )


def completion(
    batch_id: int,
    at_ms: int = 10,
    lost: tuple[LostParticipant, ...] = (),
    republished: tuple[int, ...] = (),
) -> Completion:
    """Batch `batch_id` of sink `orders` is complete."""
    return Completion("orders", batch_id, at_ms, lost=lost, republished=republished)


def repair_record(batch_id: int, level: int, epoch: int, run: int = 1) -> Decision:
    """Repair `level` of batch `batch_id`: one transaction writes LOST's rows again."""
    participant = Participant(
        partition=4,
        attempt=0,
        triple=Triple("orders-1-4", 4003, epoch),
        rows=10,
        offsets={"events_out": {1: (60, 69)}},
        digest="10-00ff",
    )
    return replace(
        make_decision(batch_id),
        participants=(participant,),
        run=run,
        level=level,
        repaired=(LOST.triple,),
        refused=(replace(LOST, triple=Triple("orders-1-2", 4001, 3), reason="refused"),),
    )


def abort_record(batch_id: int, round_: int) -> Abort:
    """Round `round_` of batch `batch_id` of sink `orders` closed by run 0's abort()."""
    triples = (Triple("orders-0-0", 4000, batch_id),)
    return Abort("orders", batch_id, round_, triples, recorded_at_ms=5, run=0)


class CommitLogContract:
    """Tests of every promise of `CommitLog`; subclasses provide the `place` fixture."""

    @pytest.fixture
    def log(self, place: LogPlace) -> CommitLog:
        return place.open()

    def test_the_log_names_its_location(self, log: CommitLog, place: LogPlace) -> None:
        assert log.uri == place.uri

    def test_a_new_log_holds_nothing(self, log: CommitLog) -> None:
        assert log.sink_meta() is None
        assert (log.decision(0), log.completion(0), log.republish(0, 0)) == (None, None, None)
        assert not log.has_decision(0)
        assert log.decided_batches() == [] and log.latest_decision() is None
        assert log.incomplete_batches() == [] and log.max_partition_count() == 0

    # -- the claim -------------------------------------------------------------------------

    def test_create_claims_the_log_once(self, log: CommitLog, place: LogPlace) -> None:
        first = log.create(SinkMeta("orders", created_at_ms=1))
        again = place.open().create(SinkMeta("orders", created_at_ms=2))
        assert first == again == log.sink_meta() == SinkMeta("orders", created_at_ms=1)

    def test_create_refuses_a_log_of_another_sink(self, log: CommitLog, place: LogPlace) -> None:
        log.create(SinkMeta("orders", created_at_ms=1))
        with pytest.raises(CommitLogError) as info:
            place.open().create(SinkMeta("payments", created_at_ms=2))
        assert str(info.value) == f"commit log {place.uri} belongs to sink orders, not payments"
        assert log.sink_meta() == SinkMeta("orders", created_at_ms=1)

    # -- decisions ---------------------------------------------------------------------------

    def test_an_abort_closes_its_round_and_a_late_decision_there_is_refused(
        self, log: CommitLog, place: LogPlace
    ) -> None:
        aborted = abort_record(3, round_=0)
        assert log.put_abort(aborted) == aborted
        with pytest.raises(CommitLogConflictError, match="closed by an abort record"):
            place.open().put_decision(make_decision(3))  # the write that timed out, landing
        for reader in (log, place.open()):
            assert reader.decision(3) is None and not reader.has_decision(3)
            assert reader.settled(3) == (None, 1)
            assert reader.outcome(3, 0) == aborted
            assert reader.decided_batches() == [] and reader.latest_decision() is None
            assert reader.incomplete_batches() == []

    def test_a_batch_run_again_is_decided_at_the_next_round(
        self, log: CommitLog, place: LogPlace
    ) -> None:
        log.put_decision(make_decision(2))
        log.put_abort(abort_record(3, round_=0))
        again = replace(make_decision(3, query_id="query-1"), round=1)
        log.put_decision(again)
        for reader in (log, place.open()):
            assert reader.decision(3) == again and reader.settled(3) == (again, 1)
            assert reader.decided_batches() == [2, 3] and reader.latest_decision() == again
            assert [d.batch_id for d in reader.decisions(after=2)] == [3]
            assert reader.incomplete_batches() == [2, 3]

    def test_an_abort_after_the_decision_landed_returns_the_decision(
        self, log: CommitLog
    ) -> None:
        log.put_decision(make_decision(3))
        assert log.put_abort(abort_record(3, round_=0)) == make_decision(3)
        assert log.decision(3) == make_decision(3)

    def test_the_latest_decision_skips_a_batch_that_holds_only_aborts(
        self, log: CommitLog
    ) -> None:
        log.put_decision(make_decision(2))
        log.put_abort(abort_record(3, round_=0))
        log.put_abort(abort_record(3, round_=1))
        assert log.latest_decision() == make_decision(2) and log.settled(3) == (None, 2)

    def test_a_decision_is_read_back_by_any_opener(self, log: CommitLog, place: LogPlace) -> None:
        log.put_decision(make_decision(3))
        for reader in (log, place.open()):
            assert reader.has_decision(3) and reader.decision(3) == make_decision(3)
            assert not reader.has_decision(4) and reader.decision(4) is None

    def test_an_identical_decision_is_success_and_keeps_the_first(self, log: CommitLog) -> None:
        log.put_decision(make_decision(3, decided_at_ms=1_000))
        log.put_decision(make_decision(3, decided_at_ms=2_000))
        assert log.decision(3) == make_decision(3, decided_at_ms=1_000)
        assert log.decided_batches() == [3]

    def test_a_different_decision_is_a_conflict_and_changes_nothing(
        self, log: CommitLog, place: LogPlace
    ) -> None:
        log.put_decision(make_decision(3, query_id="query-1"))
        with pytest.raises(CommitLogConflictError) as info:
            place.open().put_decision(make_decision(3, query_id="query-2", partitions=(0, 1, 2)))
        message = str(info.value)
        assert f"batch 3 already has a different decision in {place.uri}" in message
        assert "query query-1 with 2 participant(s)" in message
        assert "query query-2 with 3 participant(s)" in message
        assert message.endswith("nothing was overwritten")
        assert log.decision(3) == make_decision(3, query_id="query-1")
        assert log.decided_batches() == [3]

    def test_a_decision_below_the_latest_is_still_put_if_absent(self, log: CommitLog) -> None:
        log.put_decision(make_decision(5))
        log.put_decision(make_decision(3))
        log.put_decision(make_decision(3, decided_at_ms=99))
        with pytest.raises(CommitLogConflictError):
            log.put_decision(make_decision(3, query_id="query-2"))
        assert log.decided_batches() == [3, 5]
        assert log.latest_decision() == make_decision(5)

    def test_negative_batch_ids_are_refused(self, log: CommitLog) -> None:
        with pytest.raises(CommitLogError, match="batch ids are not negative"):
            log.put_decision(make_decision(-1))
        log.put_decision(make_decision(0))
        with pytest.raises(CommitLogError, match="batch ids are not negative"):
            log.decision(-1)
        assert log.decided_batches() == [0]

    def test_decided_batches_after(self, log: CommitLog) -> None:
        for batch_id in [0, 1, 2, 10, 11]:
            log.put_decision(make_decision(batch_id))
        assert log.decided_batches() == [0, 1, 2, 10, 11]
        assert log.decided_batches(after=2) == [10, 11]
        assert log.decided_batches(after=5) == [10, 11]
        assert log.decided_batches(after=-1) == [0, 1, 2, 10, 11]
        assert log.decided_batches(after=11) == []

    def test_latest_decision_is_the_highest_batch(self, log: CommitLog) -> None:
        for batch_id in [0, 1, 2, 10, 11]:
            log.put_decision(make_decision(batch_id, decided_at_ms=batch_id))
        assert log.latest_decision() == make_decision(11, decided_at_ms=11)
        for batch_id in range(3):
            log.put_completion(completion(batch_id))
            log.write_hint(batch_id)
        assert log.latest_decision() == make_decision(11, decided_at_ms=11)

    # -- completions -------------------------------------------------------------------------

    def test_a_completion_is_written_once_and_the_stored_one_is_returned(
        self, log: CommitLog, place: LogPlace
    ) -> None:
        first, rival = completion(3, at_ms=10), completion(3, at_ms=20, lost=(LOST,))
        assert log.completion(3) is None
        assert log.put_completion(first) == first
        assert place.open().put_completion(rival) == first
        assert log.completion(3) == first

    def test_a_completion_with_losses_and_republished_partitions_round_trips(
        self, log: CommitLog, place: LogPlace
    ) -> None:
        done = completion(3, at_ms=20, lost=(LOST,), republished=(0, 2))
        assert log.put_completion(done) == done
        assert place.open().completion(3) == done

    def test_incomplete_batches_are_the_decided_ones_not_completed(self, log: CommitLog) -> None:
        for batch_id in range(5):
            log.put_decision(make_decision(batch_id))
        assert log.incomplete_batches() == [0, 1, 2, 3, 4]
        for batch_id in range(3):
            log.put_completion(completion(batch_id))
            log.write_hint(batch_id)
        assert log.incomplete_batches() == [3, 4]
        log.put_completion(completion(3, lost=(LOST,)))
        assert log.incomplete_batches() == [4]

    def test_write_hint_never_raises_and_hides_nothing(self, log: CommitLog) -> None:
        log.write_hint(7)
        assert log.incomplete_batches() == []
        log.put_decision(make_decision(8))
        log.write_hint(8)  # wrong: batch 8 has no completion
        assert log.incomplete_batches() == [8]

    # -- repairs (protocol/repair.py) --------------------------------------------------------

    def test_a_repair_level_is_written_once_and_the_first_wins(
        self, log: CommitLog, place: LogPlace
    ) -> None:
        log.put_decision(make_decision(3))
        first, rival = repair_record(3, 1, epoch=5), repair_record(3, 1, epoch=6, run=2)
        assert log.repair(3, 1) is None and log.repairs(3) == []
        assert log.put_repair(first) == first
        assert place.open().put_repair(rival) == first
        assert log.repair(3, 1) == first
        assert log.decision(3) == make_decision(3)  # a repair decides nothing new

    def test_repairs_are_read_by_level_and_their_completions_apart(
        self, log: CommitLog, place: LogPlace
    ) -> None:
        log.put_decision(make_decision(3))
        log.put_completion(completion(3, lost=(LOST,)))
        repairs = [repair_record(3, level, epoch=level) for level in (1, 2)]
        for repair in repairs:
            log.put_repair(repair)
        done = replace(completion(3, lost=(replace(LOST, digest="1-ab"),)), level=1)
        assert log.put_completion(done) == done
        reader = place.open()
        assert reader.repairs(3) == repairs
        assert reader.completion(3) == completion(3, lost=(LOST,))
        assert reader.completion(3, 1) == done
        assert reader.completion(3, 2) is None
        assert reader.incomplete_batches() == []

    def test_a_repair_needs_a_level(self, log: CommitLog) -> None:
        with pytest.raises(CommitLogError, match="level of 1 or more"):
            log.put_repair(replace(repair_record(3, 1, epoch=1), level=0))

    # -- republish rounds --------------------------------------------------------------------

    def test_republish_rounds_are_written_once_each(self, log: CommitLog, place: LogPlace) -> None:
        first, rival = republish(0, epoch=1), republish(0, epoch=2, at_ms=20)
        assert log.republish(3, 0) is None
        assert log.put_republish(first) == first
        assert place.open().put_republish(rival) == first
        assert log.republish(3, 0) == first
        later = republish(1, epoch=3)
        assert log.put_republish(later) == later
        assert log.republish(3, 1) == later
        assert log.republish(3, 2) is None and log.republish(4, 0) is None

    def test_a_republish_round_decides_nothing(self, log: CommitLog) -> None:
        log.put_republish(republish(0, epoch=1))
        assert not log.has_decision(3)
        assert log.decided_batches() == [] and log.incomplete_batches() == []

    def test_negative_republish_rounds_are_refused(self, log: CommitLog) -> None:
        with pytest.raises(CommitLogError, match="republish rounds are not negative"):
            log.put_republish(republish(-1, epoch=1))
        with pytest.raises(CommitLogError, match="republish rounds are not negative"):
            log.republish(3, -1)

    # -- the clean-up bound ------------------------------------------------------------------

    def test_max_partition_count_looks_at_recent_batches(self, place: LogPlace) -> None:
        log = place.open(recent=3)
        log.put_decision(make_decision(0, partitions=(0, 1, 2, 3, 4, 5, 6, 7, 8, 9)))
        log.put_decision(make_decision(1, partitions=(0, 5), tasks=3))
        log.put_decision(make_decision(2, partitions=(1,), tasks=4))
        log.put_decision(make_decision(3, partitions=(2,), tasks=3))
        # Batch 0 is older than the 3 most recent: largest of 5 + 1, 4 and 3 tasks.
        assert log.max_partition_count() == 6
