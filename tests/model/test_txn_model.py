"""The protocol model (model/txn_model): the coordinator's rules, the owned variant's log rules,
and bounded explorations: today's protocol loses a decided batch with two drivers, the owned
protocol keeps every rule on small configurations of every fault.
"""

from __future__ import annotations

import re
from dataclasses import replace
from typing import Any

import pytest

from model.txn_model import Config, StateCapExceeded, Variant, explore, repair
from model.txn_model import commit_log as cl
from model.txn_model.__main__ import main
from model.txn_model.commit_log import Entry, Kind, Participant
from model.txn_model.coordinator import (
    Coordinator,
    Outcome,
    Triple,
    TxnState,
    describe,
    end_txn,
    init_producer,
    produce,
    time_out,
    write_markers,
)

# --- the coordinator --------------------------------------------------------------------------


def _state(coordinator: Coordinator, txn_id: str = "s-0") -> TxnState:
    txn = describe(coordinator, txn_id)
    assert txn is not None
    return txn.state


def _open_txn(txn_id: str = "s-0") -> tuple[Coordinator, Triple]:
    coordinator, outcome, triple = init_producer((), txn_id)
    assert outcome is Outcome.OK and triple is not None
    coordinator, outcome = produce(coordinator, triple, ((0, 0, 0),))
    assert outcome is Outcome.OK
    return coordinator, triple


def test_init_fences_an_open_transaction_and_aborts_it() -> None:
    coordinator, first = _open_txn()

    coordinator, outcome, triple = init_producer(coordinator, "s-0")
    assert (outcome, triple) == (Outcome.CONCURRENT, None)  # retry once the markers are out
    assert _state(coordinator) is TxnState.PREPARE_ABORT
    assert end_txn(coordinator, first, commit=True)[1] is Outcome.FENCED
    coordinator, visible = write_markers(coordinator, "s-0")
    assert visible == ()

    coordinator, outcome, second = init_producer(coordinator, "s-0")
    assert outcome is Outcome.OK and second is not None
    assert second.producer_id == first.producer_id and second.epoch > first.epoch
    assert produce(coordinator, first, ((0, 0, 0),))[1] is Outcome.FENCED


def test_end_txn_checks_the_whole_triple() -> None:
    coordinator, triple = _open_txn()

    assert end_txn(coordinator, triple._replace(producer_id=99), True)[1] is (
        Outcome.UNKNOWN_PRODUCER
    )
    assert end_txn(coordinator, triple._replace(txn_id="s-9"), True)[1] is (
        Outcome.UNKNOWN_PRODUCER
    )
    assert end_txn(coordinator, triple._replace(epoch=triple.epoch - 1), True)[1] is (
        Outcome.FENCED
    )


def test_end_txn_commit_is_repeatable_and_makes_rows_visible_at_the_markers() -> None:
    coordinator, triple = _open_txn()

    coordinator, outcome = end_txn(coordinator, triple, commit=True)
    assert outcome is Outcome.OK
    assert _state(coordinator) is TxnState.PREPARE_COMMIT
    assert end_txn(coordinator, triple, commit=True)[1] is Outcome.CONCURRENT
    coordinator, visible = write_markers(coordinator, "s-0")
    assert visible == ((0, 0, 0),)
    assert end_txn(coordinator, triple, commit=True)[1] is Outcome.OK
    assert end_txn(coordinator, triple, commit=False)[1] is Outcome.INVALID_STATE


def test_coordinator_timeout_aborts_with_a_new_epoch() -> None:
    coordinator, triple = _open_txn()

    coordinator, aborted = time_out(coordinator, "s-0")
    assert aborted == triple
    txn = describe(coordinator, "s-0")
    assert txn is not None and txn.state is TxnState.PREPARE_ABORT and txn.epoch == triple.epoch + 1
    # The driver tells a timeout from a fence by this: its EndTxn is fenced either way, but the
    # coordinator's epoch moved by exactly one and the transaction is aborted.
    assert end_txn(coordinator, triple, commit=True)[1] is Outcome.FENCED
    assert write_markers(coordinator, "s-0")[1] == ()


# --- the owned log rules ----------------------------------------------------------------------


def _decision(run: int, batch: int) -> Entry:
    part = Participant(0, Triple(f"s-{run}-0", 1, 0))
    return Entry(Kind.DECISION, run, batch=batch, participants=(part,))


def test_a_decision_after_a_newer_owner_entry_does_not_count() -> None:
    log = (
        Entry(Kind.OWNER, 0, slot=0),
        _decision(0, 0),
        Entry(Kind.OWNER, 1, slot=1),
        _decision(0, 1),  # run 0 no longer owns the sink
        _decision(1, 1),
    )

    assert cl.decisions(log, Variant.OWNED) == {0: log[1], 1: log[4]}
    assert cl.superseded_by(log, 0) == 1
    assert cl.superseded_by(log, 1) is None


def test_a_new_run_takes_a_released_slot_else_the_longest_held() -> None:
    owners = (Entry(Kind.OWNER, 0, slot=0), Entry(Kind.OWNER, 1, slot=1))

    assert cl.choose_slot((), 2) == 0
    assert cl.choose_slot(owners[:1], 2) == 1
    assert cl.choose_slot((*owners, Entry(Kind.RELEASE, 1)), 2) == 1
    assert cl.choose_slot(owners, 2) == 0  # run 0 may still live: the residual README names
    assert cl.choose_slot(owners, 3) == 2


# --- explorations -----------------------------------------------------------------------------


def test_current_protocol_loses_a_decided_batch_to_a_second_driver() -> None:
    result = explore(Config(Variant.CURRENT, batches=1, partitions=2, drivers=2))

    assert result.violation is not None and result.violation.startswith("decided batch lost")
    trace = result.trace
    assert len(trace) <= 20
    # Issue 14's shape: the old run (0) passes its prepare check and decides; a task of the new
    # run (1) initialises the shared id and fences a decided participant.
    assert trace[0] == "run 1 starts on the checkpoint at batch 0 beside live run 0"
    checked = trace.index("run 0 b0: prepare check passes")
    decided = next(i for i, s in enumerate(trace) if s.startswith("run 0 b0: appends decision"))
    fenced = next(i for i, s in enumerate(trace) if "fences" in s)
    assert re.fullmatch(r"run 1 attempt b0p\d: init_transactions\(s-\d\) fences .*", trace[fenced])
    assert checked < decided and checked < fenced
    assert max(decided, fenced) == len(trace) - 1  # the loss shows as soon as both happened


def test_current_protocol_is_sound_with_one_driver_at_a_time() -> None:
    config = Config(
        Variant.CURRENT,
        batches=2,
        partitions=1,
        drivers=3,
        concurrent=False,
        crashes=2,
        late_attempts=1,
    )
    assert explore(config).ok


OWNED = Variant.OWNED
OWNED_CONFIGS = [
    pytest.param(Config(OWNED, drivers=2, batches=2, partitions=1), id="two-drivers-two-batches"),
    pytest.param(Config(OWNED, drivers=2, batches=1, partitions=2), id="two-drivers-two-parts"),
    pytest.param(
        Config(OWNED, drivers=2, batches=1, partitions=1, crashes=1), id="two-drivers-crash"
    ),
    pytest.param(
        Config(OWNED, drivers=3, batches=1, partitions=1, concurrent=False, crashes=2),
        id="restarts-after-crashes",
    ),
    pytest.param(Config(OWNED, drivers=2, batches=1, partitions=1, late_attempts=1), id="late"),
    pytest.param(Config(OWNED, drivers=2, batches=1, partitions=1, timeouts=1), id="timeout"),
    pytest.param(Config(OWNED, drivers=2, batches=1, partitions=1, retries=1), id="task-retry"),
    pytest.param(
        Config(
            OWNED,
            drivers=2,
            batches=1,
            partitions=1,
            concurrent=False,
            crashes=1,
            retries=1,
            late_attempts=1,
            timeouts=1,
        ),
        id="every-fault-one-driver-at-a-time",
    ),
    pytest.param(Config(OWNED, drivers=2, batches=1, partitions=2, crashes=1), id="crash-2-parts"),
    pytest.param(
        Config(OWNED, drivers=3, batches=1, partitions=2, concurrent=False, crashes=2),
        id="restarts-after-crashes-2-parts",
    ),
]


@pytest.mark.parametrize("config", OWNED_CONFIGS)
def test_owned_protocol_keeps_every_rule(config: Config) -> None:
    result = explore(config)

    assert result.ok, "\n".join([str(result.violation), *result.trace])
    assert result.stops.get("finished", 0) > 0


def test_owned_protocol_stops_the_superseded_driver() -> None:
    result = explore(Config(Variant.OWNED, drivers=2, batches=1, partitions=1))

    assert result.ok
    assert result.stops.get("superseded", 0) > 0


def test_owned_protocol_fails_if_runs_share_a_slot(monkeypatch: pytest.MonkeyPatch) -> None:
    """The model has teeth: break one owned rule and it finds the loss."""
    monkeypatch.setattr(cl, "choose_slot", lambda log, slots: 0)

    result = explore(Config(Variant.OWNED, drivers=2, batches=1, partitions=1))

    assert result.violation is not None and result.violation.startswith("decided batch lost")


def test_owned_clean_up_must_describe_before_it_reads_the_log() -> None:
    """Owned rule 8: read the log first, and a run about to be superseded aborts the newer
    run's decided transaction; describe first, and it cannot."""
    config = Config(Variant.OWNED, drivers=2, batches=2, partitions=1)

    wrong = explore(replace(config, cleanup_reads_log_first=True))

    assert wrong.violation is not None and wrong.violation.startswith("decided batch lost")
    assert "clean-up EndTxn(abort)" in " ".join(wrong.trace)
    assert explore(config).ok


# --- the keyed variant (what the product builds) ----------------------------------------------


def test_keyed_may_abort_another_slot_only_after_a_newer_runs_decision() -> None:
    log = (
        Entry(Kind.OWNER, 0, slot=0),
        Entry(Kind.OWNER, 1, slot=1),
        _decision(0, 0),  # run 0's decision, written after run 1's owner record: it counts
    )

    assert cl.decisions(log, Variant.KEYED) == {0: log[2]}
    assert cl.next_run(log) == 2
    assert cl.may_abort(log, slot=1, mine=1)  # its own slot
    assert not cl.may_abort(log, slot=0, mine=1)  # run 0 may still decide
    assert cl.may_abort((*log, _decision(1, 1)), slot=0, mine=1)  # run 0 can decide no more


KEYED = Variant.KEYED
KEYED_CONFIGS = [
    pytest.param(Config(KEYED, drivers=2, batches=1, partitions=1), id="two-drivers"),
    pytest.param(
        Config(KEYED, drivers=2, batches=1, partitions=1, crashes=1), id="two-drivers-crash"
    ),
    pytest.param(Config(KEYED, drivers=2, batches=1, partitions=1, late_attempts=1), id="late"),
    pytest.param(Config(KEYED, drivers=2, batches=1, partitions=1, timeouts=1), id="timeout"),
    pytest.param(Config(KEYED, drivers=2, batches=1, partitions=1, retries=1), id="task-retry"),
]


@pytest.mark.parametrize("config", KEYED_CONFIGS)
def test_keyed_protocol_keeps_every_safety_rule(config: Config) -> None:
    result = explore(config)

    assert result.ok, "\n".join([str(result.violation), *result.trace])
    assert result.stops.get("finished", 0) > 0
    assert result.stops.get("superseded", 0) > 0


def test_keyed_protocol_loses_a_decided_batch_when_a_slot_is_reused() -> None:
    """Like owned's residual 2: a third run reuses a frozen run's slot."""
    result = explore(Config(KEYED, drivers=3, batches=1, partitions=1, slots=2))

    assert result.violation is not None and result.violation.startswith("decided batch lost")
    assert "records owner(run 2, slot 0)" in " ".join(result.trace)


def test_keyed_superseded_drivers_abort_takes_the_sink_from_the_live_run() -> None:
    """What the product does today: commit() of a superseded run releases it and raises;
    the writer Spark makes for abort() finds no unreleased run of this driver and records a
    new one, which supersedes the live newer run: no driver finishes the query."""
    config = Config(KEYED, drivers=2, batches=1, partitions=1, progress=True)

    result = explore(config)

    assert result.violation is not None and result.violation.startswith("no run finished")
    trace = "\n".join(result.trace)
    assert "abort()'s streamWriter(): records owner(run 2" in trace
    assert result.trace[-1].endswith("run 2 is newer: streamWriter() raises")
    fixed = explore(replace(config, keyed_fixes=True))
    assert fixed.ok, "\n".join([str(fixed.violation), *fixed.trace])


def test_a_state_cap_stops_the_search_with_a_clear_error() -> None:
    with pytest.raises(StateCapExceeded, match="more than 100 states"):
        explore(Config(Variant.OWNED, drivers=2, max_states=100))


def test_cli_prints_the_shortest_trace(capsys: pytest.CaptureFixture[str]) -> None:
    status = main(["--variant", "current", "--drivers", "2", "--batches", "1"])

    out = capsys.readouterr().out
    assert status == 1
    assert "states: " in out and "VIOLATION: decided batch lost" in out
    assert " 1. run 1 starts on the checkpoint at batch 0 beside live run 0" in out


# --- one outcome per decision key (issue 24.1) ---------------------------------------------------


def test_an_abort_record_moves_the_batch_to_its_next_round() -> None:
    aborted = Entry(Kind.ABORT, 0, batch=0)
    late = _decision(run=0, batch=0)  # run 0's decision, arriving after its own abort record
    log, holder = cl.put_if_absent((aborted,), late)

    assert holder == aborted and log == (aborted,)  # refused: the key holds the abort
    assert cl.decisions(log, KEYED) == {}
    assert cl.next_round(log, 0) == 1
    replayed = _decision(run=1, batch=0)._replace(round=1)
    assert cl.decisions((*log, replayed), KEYED) == {0: replayed}


def test_abort_after_a_decision_write_in_doubt_loses_the_decided_batch() -> None:
    """The product before the outcome register: commit()'s decision write times out, Spark's
    abort() finds no decision and aborts the participants, then the write lands."""
    config = Config(KEYED, drivers=1, batches=1, partitions=1, keyed_fixes=True, late_writes=1)

    result = explore(config)

    assert result.violation is not None and result.violation.startswith("decided batch lost")
    assert len(result.trace) == 17
    assert "the request times out" in result.trace[12]
    assert result.trace[-1].startswith("the late write of decision(batch 0")


REGISTER_CONFIGS = [
    pytest.param(Config(KEYED, drivers=1, batches=1, partitions=1), id="one-driver"),
    pytest.param(Config(KEYED, drivers=2, batches=1, partitions=1), id="two-drivers"),
    pytest.param(Config(KEYED, drivers=2, batches=2, partitions=1, progress=True), id="progress"),
    pytest.param(Config(KEYED, drivers=2, batches=1, partitions=1, crashes=1), id="crash"),
    pytest.param(Config(KEYED, drivers=2, batches=1, partitions=1, late_attempts=1), id="late"),
    pytest.param(Config(KEYED, drivers=2, batches=1, partitions=1, timeouts=1), id="timeout"),
    pytest.param(Config(KEYED, drivers=2, batches=1, partitions=1, retries=1), id="task-retry"),
]


@pytest.mark.parametrize("config", REGISTER_CONFIGS)
def test_the_outcome_register_keeps_every_rule_with_writes_in_doubt(config: Config) -> None:
    config = replace(config, keyed_fixes=True, outcome_register=True, late_writes=1)

    result = explore(config)

    assert result.ok, "\n".join([str(result.violation), *result.trace])
    assert result.stops.get("finished", 0) > 0
    unfixed = explore(replace(config, outcome_register=False))
    assert unfixed.violation is not None and unfixed.violation.startswith("decided batch lost")


ZOMBIE = Config(
    KEYED, drivers=1, batches=2, partitions=1, zombies=1, keyed_fixes=True, outcome_register=True
)


def test_a_zombie_attempt_fences_a_decided_participant_of_its_own_batch_in_the_pool() -> None:
    """The product's ids (`s-{slot}-{p}`): the zombie checked the log before the decision and
    initialises the id the decided attempt holds."""
    result = explore(ZOMBIE)

    assert result.violation is not None
    assert result.violation.startswith("decided batch lost: batch 0 partition 0 (s-0-0,")
    assert "zombie attempt b0p0: init_transactions(s-0-0) fences" in result.trace[-1]


def test_ids_per_attempt_number_move_the_zombie_to_the_next_batch() -> None:
    """`s-{slot}-{p}-{attempt}`: the zombie (attempt 0) misses its own batch's used attempt (1)
    and fences the next batch's attempt 0, which holds the same id."""
    result = explore(replace(ZOMBIE, txn_ids="attempt"))

    assert result.violation is not None
    assert result.violation.startswith("decided batch lost: batch 1 partition 0 (s-0-0-0,")
    assert "zombie attempt b0p0: init_transactions(s-0-0-0) fences" in result.trace[-1]


@pytest.mark.parametrize(
    "faults",
    [
        pytest.param({}, id="zombie"),
        pytest.param({"zombies": 2}, id="two-zombies"),
        pytest.param({"retries": 1}, id="task-retry"),
        pytest.param({"crashes": 1}, id="crash"),
        pytest.param({"timeouts": 1, "progress": True}, id="timeout"),
    ],
)
def test_ids_no_other_attempt_shares_close_the_zombie_window(faults: dict[str, Any]) -> None:
    """`s-{slot}-{p}-{batch}-{attempt}`: every bound above is OK, and the same bounds with the
    pool lose a decided batch."""
    config = replace(ZOMBIE, **faults)

    assert explore(replace(config, txn_ids="unique")).ok
    pooled = explore(config)
    assert pooled.violation is not None and pooled.violation.startswith("decided batch lost")


REPAIR = Config(
    KEYED, drivers=2, batches=1, partitions=1, timeouts=1, keyed_fixes=True,
    outcome_register=True, repair=True,
)  # fmt: skip
REPAIR_CONFIGS = [
    pytest.param({}, id="timeout"),
    pytest.param({"timeouts": 2}, id="repair-times-out"),
    pytest.param({"crashes": 1}, id="crash"),
    pytest.param({"drivers": 3, "concurrent": False, "timeouts": 2, "crashes": 1}, id="restarts"),
    pytest.param({"batches": 2}, id="two-batches"),
    pytest.param({"late_attempts": 1}, id="late"),
    pytest.param({"late_writes": 1}, id="write-in-doubt"),
    pytest.param({"retries": 1}, id="task-retry"),
]


@pytest.mark.parametrize("faults", REPAIR_CONFIGS)
def test_repair_rounds_leave_nothing_lost_once_a_run_finishes(faults: dict[str, Any]) -> None:
    """With repairs no row is excused at the end: a run that finishes has every row once."""
    result = explore(replace(REPAIR, **faults))

    assert result.ok, "\n".join([str(result.violation), *result.trace])
    assert result.finished_after_repair > 0


def test_a_batch_recorded_once_no_loss_is_recorded_loses_rows() -> None:
    """The rejected check "no loss recorded": the original run records the batch while the
    replay's repair, itself timed out, is not settled yet."""
    result = explore(replace(REPAIR, timeouts=2, repair_flaw="loss-recorded"))

    assert result.violation == "query finished but rows of batch 0 partition 0 are missing"
    assert len(result.trace) == 41
    assert "Spark records the batch" in "\n".join(result.trace[-6:])


def test_a_participant_being_committed_taken_for_lost_is_repaired_twice() -> None:
    """The rejected probe that takes "not visible yet" for aborted: the EndTxn was accepted,
    the markers were not written yet, the replay repairs it, both commit."""
    result = explore(replace(REPAIR, repair_flaw="in-doubt"))

    assert result.violation == "duplicate: rows of batch 0 partition 0 visible 2 times"
    assert len(result.trace) == 32
    assert "completion(batch 0, lost p0)" in result.trace[15]


def test_a_replay_in_another_order_is_refused_by_an_ordered_digest() -> None:
    """Issue 39, the rejected digest that includes the records' order: the replay writes the
    lost partition's rows in another order, no lost participant has its digest, the repair
    refuses the rows, and the original run, seeing nothing waiting, records the batch."""
    config = replace(REPAIR, repair_flaw="ordered-digest", reorder=1)

    result = explore(config)

    assert result.violation == "query finished but rows of batch 0 partition 0 are missing"
    assert len(result.trace) == 40
    assert "produces its rows in another order" in result.trace[26]
    assert "puts repair(batch 0 level 1, run 1: nothing, refused p0)" in result.trace[33]
    assert result.trace[35] == "driver 0 b0: Spark records the batch; the query is done"
    assert explore(replace(config, reorder=0)).ok  # the same order every time: repaired


def test_rows_refused_once_stay_lost_after_a_restart() -> None:
    """The product's story with runs one after another: the original run fails on the loss,
    the first restart's repair refuses the reordered rows and raises once, the second restart
    finds nothing waiting and goes on."""
    config = replace(REPAIR, drivers=3, concurrent=False, reorder=1)

    flawed = explore(replace(config, repair_flaw="ordered-digest"))

    assert flawed.violation == "query finished but rows of batch 0 partition 0 are missing"
    assert len(flawed.trace) == 54
    assert "commit() raises once" in flawed.trace[39]
    assert explore(config).ok


@pytest.mark.parametrize(
    "faults",
    [
        pytest.param({"reorder": 1}, id="replay-reordered"),
        pytest.param(
            {"reorder": 1, "drivers": 3, "concurrent": False, "timeouts": 2, "crashes": 1},
            id="restarts",
        ),
    ],
)
def test_the_multiset_digest_repairs_a_replay_in_another_order(faults: dict[str, Any]) -> None:
    """The product's digest (count and sum of per-record hashes) ignores the order: a replay
    that writes the rows in another order repairs them, and a run that finishes has them."""
    result = explore(replace(REPAIR, **faults))

    assert result.ok, "\n".join([str(result.violation), *result.trace])
    assert result.finished_after_repair > 0


# Issue 39: rows that move between tasks on a replay (`--regroup`). Runs one after another keep
# these small: the union of replayed tasks needs both participants lost (two timeouts).
REGROUP = replace(REPAIR, partitions=2, concurrent=False, regroup=1)


def test_a_regrouped_replay_assigns_the_batchs_rows_to_tasks_otherwise() -> None:
    config = replace(REGROUP)
    first, renumbered, dealt, one = (
        [repair.rows_of(config, 0, p, group) for p in (0, 1)] for group in range(4)
    )

    assert first == [((0, 0, 0), (0, 0, 1)), ((0, 1, 0), (0, 1, 1))]
    assert renumbered == [first[1], first[0]]
    assert dealt == [((0, 0, 0), (0, 1, 0)), ((0, 0, 1), (0, 1, 1))]
    assert one == [(*first[0], *first[1]), ()]


@pytest.mark.parametrize(
    "faults",
    [
        pytest.param({"drivers": 2, "timeouts": 2}, id="both-lost"),
        pytest.param({"drivers": 3, "timeouts": 2}, id="both-lost-three-runs"),
    ],
)
def test_replayed_tasks_taken_together_repair_rows_that_moved(faults: dict[str, Any]) -> None:
    """Both participants lost, the replay's rows in other tasks: no replayed task has a lost
    participant's records, all of them together have all of theirs; the repair takes them
    together, and a run that finishes has every row once."""
    result = explore(replace(REGROUP, **faults))

    assert result.ok, "\n".join([str(result.violation), *result.trace])
    assert result.finished_after_union > 0


def test_a_partial_loss_whose_rows_moved_is_refused_not_written_twice() -> None:
    """One participant lost, the other committed, the replay's rows moved: every replayed
    task holds rows of the committed one too. The repair refuses the lost rows (no set of
    replayed transactions holds exactly lost rows: the oracle excuses them) and writes nothing
    twice; the flaw `union-partial`, taking the replayed tasks whose records include the lost
    ones', writes the committed participant's rows a second time."""
    config = replace(REGROUP, drivers=3, timeouts=1)

    result = explore(config)
    assert result.ok, "\n".join([str(result.violation), *result.trace])
    assert result.finished_with_refused > 0 and result.finished_after_union == 0

    flawed = explore(replace(config, drivers=2, repair_flaw="union-partial"))
    assert flawed.violation == "duplicate: row 0 of batch 0 partition 1 visible 2 times"
    assert len(flawed.trace) == 43
    assert "completion(batch 0, lost p0)" in flawed.trace[19]
    assert "rows dealt round-robin" in flawed.trace[28]
    assert "together for lost p0 (their records together include" in flawed.trace[39]


def test_matching_replayed_tasks_one_by_one_loses_rows_that_moved() -> None:
    """The matching before the union rule: no replayed task has a lost participant's records,
    so the repair refuses both, and the next run finds nothing waiting and finishes without
    them."""
    result = explore(replace(REGROUP, drivers=3, timeouts=2, repair_flaw="per-task-only"))

    assert result.violation == "query finished but row 0 of batch 0 partition 0 is missing"
    assert len(result.trace) == 63
    assert "puts repair(batch 0 level 1, run 1: nothing, refused p0, p1)" in result.trace[42]
    assert result.trace[-1] == "driver 2 b0: Spark records the batch; the query is done"


OFFSETS = replace(REPAIR, offsets="participant")
OFFSETS_CONFIGS = [
    pytest.param({}, id="timeout"),
    pytest.param({"drivers": 3, "concurrent": False, "timeouts": 2, "crashes": 1}, id="restarts"),
    pytest.param({"crashes": 1}, id="crash", marks=pytest.mark.full),  # 26 s
    pytest.param({"late_writes": 1}, id="write-in-doubt", marks=pytest.mark.full),
]


@pytest.mark.parametrize("faults", OFFSETS_CONFIGS)
def test_the_group_holds_the_last_batchs_offsets_never_ahead_never_back(
    faults: dict[str, Any],
) -> None:
    """The progress participant: the group never holds offsets of rows not all visible, never
    moves back, and holds the last batch's once a run finished; a timed-out progress
    transaction alone is repaired too."""
    result = explore(replace(OFFSETS, **faults))

    assert result.ok, "\n".join([str(result.violation), *result.trace])
    assert result.offsets_only_repairs > 0


def test_abort_that_leaves_the_progress_transaction_open_is_found() -> None:
    """Review N8, the product before it was fixed: Spark's abort() gets the tasks' messages only,
    so after a decision write in doubt it closed the round and returned with the progress
    transaction still open. The sound design runs the clean-up there (decide.py `abort`)."""
    config = replace(OFFSETS, drivers=1, timeouts=0, late_writes=1)
    flawed = explore(replace(config, abort_leaves_progress=True))

    assert flawed.violation == (
        "driver 0's abort() closed batch 0's round and returned, but its progress transaction "
        "s-0-g is still open"
    )
    assert len(flawed.trace) == 17
    assert "the request times out, outcome unknown" in flawed.trace[13]
    assert explore(config).ok


def test_a_plain_offset_commit_after_the_completion_moves_the_group_back() -> None:
    """Rejected: a plain OffsetCommit after the roll-forward. A second driver replaying batch 0
    commits batch 0's offsets after the first driver committed batch 1's."""
    result = explore(replace(OFFSETS, offsets="plain", timeouts=0, batches=2))

    assert result.violation == "group offsets moved back: batch 1's, then batch 0's"
    assert len(result.trace) == 50
    assert result.trace[-1] == "driver 1 b0: plain OffsetCommit of batch 0's end offsets"


FENCED_CONFIGS = [
    # The trace in which `plain` moves the group back: two drivers, two batches, no fault.
    pytest.param({"timeouts": 0, "batches": 2}, id="two-drivers-two-batches"),
    pytest.param({}, id="timeout"),
    pytest.param({"drivers": 3, "concurrent": False, "timeouts": 2, "crashes": 1}, id="restarts"),
    pytest.param({"batches": 2}, id="two-batches-timeout", marks=pytest.mark.full),  # 85 s
    pytest.param({"crashes": 1}, id="crash", marks=pytest.mark.full),
    pytest.param({"late_writes": 1}, id="write-in-doubt", marks=pytest.mark.full),
]


@pytest.mark.parametrize("faults", FENCED_CONFIGS)
def test_a_group_on_another_cluster_is_never_ahead_and_never_back(faults: dict[str, Any]) -> None:
    """The design for a group on another cluster than the output: after the completion, a
    transaction on one fenced id reads the group and commits the newer offsets. Not atomic
    with the rows, but never ahead of them, never back, and at the last batch once a run
    finished."""
    result = explore(replace(OFFSETS, offsets="fenced", **faults))

    assert result.ok, "\n".join([str(result.violation), *result.trace])


def test_the_fence_alone_does_not_keep_the_group_from_moving_back() -> None:
    """Rejected: the fenced transaction committing the batch's own offsets without reading the
    group. The older driver's replay of batch 0 is fenced by nobody, and commits."""
    result = explore(replace(OFFSETS, offsets="blind", timeouts=0, batches=2))

    assert result.violation == "group offsets moved back: batch 1's, then batch 0's"
    assert len(result.trace) == 62
    assert result.trace[-1].startswith("coordinator writes commit markers of (x-g")


def test_offsets_committed_before_the_rows_run_ahead_of_the_output() -> None:
    """Rejected: the progress participant ended first, like any participant."""
    result = explore(replace(OFFSETS, offsets="first", drivers=1, timeouts=0))

    assert result.violation is not None
    assert result.violation.startswith("group offsets ahead of the output")
    assert len(result.trace) == 16


@pytest.mark.parametrize(
    "config",
    [
        pytest.param(Config(KEYED, drivers=2, batches=2, partitions=1), id="two-batches"),
        pytest.param(Config(KEYED, drivers=2, batches=1, partitions=2), id="two-partitions"),
        pytest.param(Config(KEYED, drivers=2, batches=1, partitions=1, crashes=1), id="crash"),
        pytest.param(Config(KEYED, drivers=2, batches=1, partitions=1, timeouts=1), id="timeout"),
        pytest.param(Config(KEYED, drivers=2, batches=1, partitions=1, late_writes=1), id="late"),
    ],
)
def test_a_commit_without_a_start_of_its_own_keeps_every_rule(config: Config) -> None:
    """Issue 43 item 3: the commit worker's commit() with the planner's run, no roll forward
    and no current-run check before it (commit() checks before its decision). A superseded
    run's commit() then aborts its own prepared transactions itself; with the commit worker's
    own start, its streamWriter() raised first and left them to the brokers' timeout."""
    config = replace(config, keyed_fixes=True, outcome_register=True)

    changed = explore(replace(config, commit_without_start=True))

    assert changed.ok, "\n".join([str(changed.violation), *changed.trace])
    assert changed.stops.get("finished", 0) > 0
    if not config.crashes:
        before = explore(config)
        assert before.ok and before.final_with_open_txns > 0
        assert changed.final_with_open_txns == 0
