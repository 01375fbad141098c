"""Runs of a sink (protocol/runs.py): who owns the sink, slots, and who may abort what."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from kafka_txn_sink.commit_log import CommitLog, open_commit_log
from kafka_txn_sink.errors import ConfigError, SupersededError
from kafka_txn_sink.kafka.admin_api import ONGOING, TxnState
from kafka_txn_sink.protocol import runs
from kafka_txn_sink.protocol.messages import Decision, now_ms
from kafka_txn_sink.protocol.recover import judge
from kafka_txn_sink.protocol.run_records import Owner, Release
from kafka_txn_sink.protocol.runs import (
    RunRef,
    check_current,
    check_decided_by,
    choose_slot,
    may_abort,
    standing,
    take_over,
)
from kafka_txn_sink.protocol.txn_ids import SLOTS

SINK = "orders"
FRESH_MS = 60_000


@pytest.fixture(params=["json", "delta"])
def commit_log(request: pytest.FixtureRequest, tmp_path: Path) -> CommitLog:
    return open_commit_log(str(tmp_path / "log"), None, request.param)


def as_driver(monkeypatch: pytest.MonkeyPatch, name: str) -> None:
    monkeypatch.setattr(runs, "driver_identity", lambda: name)


def owner(run: int, slot: int, driver: str = "d", age_ms: int = 0) -> Owner:
    return Owner(SINK, run, slot, driver, now_ms() - age_ms)


def decision(batch_id: int, run: int | None) -> Decision:
    return Decision(SINK, "q", batch_id, (), 0, 0, now_ms(), run=run)


def test_a_driver_keeps_its_run_from_batch_to_batch(
    commit_log: CommitLog, monkeypatch: pytest.MonkeyPatch
) -> None:
    as_driver(monkeypatch, "host:1@5")
    first = take_over(SINK, commit_log, FRESH_MS)
    again = take_over(SINK, commit_log, FRESH_MS)
    assert (first.run, first.slot) == (0, 0)
    assert again == first
    assert [o.run for o in commit_log.owners()] == [0]


def test_a_new_driver_records_a_newer_run_in_another_slot(
    commit_log: CommitLog, monkeypatch: pytest.MonkeyPatch
) -> None:
    as_driver(monkeypatch, "old")
    old = take_over(SINK, commit_log, FRESH_MS)
    as_driver(monkeypatch, "new")
    new = take_over(SINK, commit_log, FRESH_MS)
    assert (new.run, new.slot) == (1, 1)
    assert commit_log.latest_run() == 1
    with pytest.raises(SupersededError) as caught:
        check_current(SINK, commit_log, RunRef(old.run, old.slot))
    assert "run 0 (driver old" in str(caught.value)
    assert "superseded by run 1 (driver new, slot 1" in str(caught.value)
    check_current(SINK, commit_log, RunRef(new.run, new.slot))


def test_a_superseded_driver_is_refused_while_the_newer_run_is_fresh(
    commit_log: CommitLog, monkeypatch: pytest.MonkeyPatch
) -> None:
    as_driver(monkeypatch, "old")
    take_over(SINK, commit_log, FRESH_MS)
    as_driver(monkeypatch, "new")
    take_over(SINK, commit_log, FRESH_MS)
    as_driver(monkeypatch, "old")
    with pytest.raises(SupersededError, match="superseded by run 1"):
        take_over(SINK, commit_log, FRESH_MS)
    # Once the newer run is older than the transaction timeout, the old driver starts anew.
    again = take_over(SINK, commit_log, fresh_ms=0)
    assert (again.run, again.driver) == (2, "old")


def test_a_released_run_is_not_resumed_and_frees_its_slot(
    commit_log: CommitLog, monkeypatch: pytest.MonkeyPatch
) -> None:
    as_driver(monkeypatch, "writer")
    first = take_over(SINK, commit_log, FRESH_MS)
    runs.release(SINK, commit_log, RunRef(first.run, first.slot))
    second = take_over(SINK, commit_log, FRESH_MS)
    assert (second.run, second.slot) == (1, 0)
    assert commit_log.released_runs() == {0}


def test_slots_are_reused_oldest_first_and_never_the_current_owners() -> None:
    held = [owner(r, r) for r in range(SLOTS)]
    assert choose_slot(held, released=set()) == 0
    assert choose_slot(held, released={2}) == 2
    rotated = [*held, owner(SLOTS, 0)]  # run 4 took slot 0 back; slot 1 is now held longest
    assert choose_slot(rotated, released=set()) == 1
    only_current = [owner(0, 0), owner(1, 1), owner(2, 2), owner(3, 3), owner(4, 1)]
    assert choose_slot(only_current, released=set()) == 0


def test_the_ids_a_sink_uses_stay_bounded_over_many_restarts() -> None:
    owners: list[Owner] = []
    for run in range(100):
        owners.append(owner(run, choose_slot(owners, released=set())))
    assert {o.slot for o in owners} == set(range(SLOTS))


def test_a_batch_decided_by_a_newer_run_supersedes_this_one(commit_log: CommitLog) -> None:
    commit_log.put_owner(owner(0, 0, "old"))
    commit_log.put_owner(owner(1, 1, "new"))
    check_decided_by(decision(3, run=0), RunRef(1, 1), commit_log)  # an older run's: roll it
    check_decided_by(decision(3, run=None), RunRef(1, 1), commit_log)
    with pytest.raises(SupersededError, match=r"decided batch 3"):
        check_decided_by(decision(3, run=1), RunRef(0, 0), commit_log)


@pytest.mark.parametrize(
    ("slot", "latest_run", "expected"),
    [
        (1, None, True),  # its own slot
        (0, None, False),  # the older run may still decide: nothing of a newer run decided
        (0, 0, False),  # the older run decided the latest batch: it may go on
        (0, 1, True),  # a newer run decided: the older run's commit of that batch fails
        (None, 1, True),  # ids from before slots: the oldest run's
        (None, None, False),
    ],
)
def test_another_runs_transactions_are_aborted_only_once_it_cannot_decide_them(
    slot: int | None, latest_run: int | None, expected: bool
) -> None:
    owners = [owner(0, 0), owner(1, 1)]
    latest = decision(5, latest_run) if latest_run is not None else None
    assert may_abort(slot, RunRef(1, 1), owners, latest) is expected


def test_the_cli_without_a_run_may_abort_anything_undecided() -> None:
    assert may_abort(0, None, [owner(0, 0)], None)


@pytest.mark.parametrize(
    ("slot", "released", "latest_run", "decidable", "why"),
    [
        (1, set(), None, True, "run 1 (driver d, slot 1, started"),  # the latest, unreleased
        (1, {1}, None, False, "released its slot"),
        (0, set(), None, True, "no newer run has decided a batch since"),  # run 1 decided nothing
        (0, set(), 1, False, "superseded: run 1 decided batch 5 since"),
        (0, {0}, 0, False, "run 0 (driver d, slot 0, started"),
        (2, set(), None, True, "no recorded run holds its slot 2"),  # unknown: cannot tell
        (2, set(), 1, False, "slot 2, counted as the oldest run's, superseded: run 1 decided"),
        (None, set(), None, True, "its id has no slot"),
        (None, set(), 0, False, "superseded: run 0 decided batch 5"),
    ],
)
def test_the_cli_judges_another_runs_transaction_by_the_owner_records(
    slot: int | None, released: set[int], latest_run: int | None, decidable: bool, why: str
) -> None:
    owners = [owner(0, 0), owner(1, 1)]
    latest = decision(5, latest_run) if latest_run is not None else None

    found = standing(slot, owners, released, latest)

    assert found[0] is decidable
    assert why in found[1]


def test_owner_and_release_records_read_back_alike_in_both_formats(commit_log: CommitLog) -> None:
    first = owner(0, 2, "h:1@2")
    assert commit_log.put_owner(first) == first
    assert commit_log.put_owner(owner(0, 3, "other")) == first  # put-if-absent: the first wins
    release = Release(SINK, 0, now_ms())
    assert commit_log.put_release(release) == release
    assert commit_log.owners() == [first]
    assert commit_log.released_runs() == {0}
    assert commit_log.latest_run() == 0


def test_a_decision_keeps_its_run(commit_log: CommitLog) -> None:
    commit_log.put_decision(decision(0, run=4))
    found = commit_log.decision(0)
    assert found is not None and found.run == 4


def test_a_newer_run_that_decides_stays_fresh_however_old_its_owner_record(
    commit_log: CommitLog, monkeypatch: pytest.MonkeyPatch
) -> None:
    commit_log.put_owner(owner(0, 0, "old", age_ms=10 * FRESH_MS))
    commit_log.put_owner(owner(1, 1, "new", age_ms=5 * FRESH_MS))
    commit_log.put_decision(decision(7, run=1))
    as_driver(monkeypatch, "old")
    with pytest.raises(SupersededError, match="superseded by run 1"):
        take_over(SINK, commit_log, FRESH_MS)


def test_a_superseded_run_that_released_its_slot_is_still_refused(
    commit_log: CommitLog, monkeypatch: pytest.MonkeyPatch
) -> None:
    as_driver(monkeypatch, "old")
    old = take_over(SINK, commit_log, FRESH_MS)
    as_driver(monkeypatch, "new")
    take_over(SINK, commit_log, FRESH_MS)
    runs.release(SINK, commit_log, RunRef(old.run, old.slot))  # what a superseded commit does
    as_driver(monkeypatch, "old")  # Spark's abort() calls streamWriter() once more
    with pytest.raises(SupersededError, match="superseded by run 1"):
        take_over(SINK, commit_log, FRESH_MS)


def test_a_driver_takes_over_from_a_run_that_released(
    commit_log: CommitLog, monkeypatch: pytest.MonkeyPatch
) -> None:
    as_driver(monkeypatch, "a")
    first = take_over(SINK, commit_log, FRESH_MS)
    as_driver(monkeypatch, "b")
    second = take_over(SINK, commit_log, FRESH_MS)
    runs.release(SINK, commit_log, RunRef(second.run, second.slot))  # b's batch write is done
    as_driver(monkeypatch, "a")
    assert take_over(SINK, commit_log, FRESH_MS).run == 2
    assert first.run == 0


# What Spark's driver gives each Python worker it starts for a driver step (PythonPlannerRunner:
# the planner's `streamWriter()`, the commit worker's `commit()`/`abort()`): its block manager
# directories, the same in every worker of one driver, a new UUID in each driver (seen in
# PySpark 4.0, 4.2 and 4.3). Each step below is its own process with no `java` ancestor, as on macOS
# (no /proc), in a sandbox, or with a daemon-forked worker.
SPARK_WORKER_ENV = {
    "PYTHON_WORKER_FACTORY_PORT": "40123",
    "PYTHON_WORKER_FACTORY_SECRET": "not-a-secret",
    "SPARK_BUFFER_SIZE": "65536",
    "SPARK_AUTH_SOCKET_TIMEOUT": "15",
    "SPARK_LOCAL_DIRS": "/tmp/blockmgr-62913dff-6c07-41ad-b272-0c06f0e58361",
}
DRIVER_STEP = """
import sys
from kafka_txn_sink.commit_log import open_commit_log
from kafka_txn_sink.protocol.runs import take_over
owner = take_over("orders", open_commit_log(sys.argv[1], None, "json"), 60_000)
print(owner.run, owner.slot)
"""


def driver_step(log_dir: Path, env: dict[str, str]) -> str:
    """One driver step (`take_over`) in a worker process of its own; its run and slot."""
    root = str(Path(__file__).resolve().parents[2])
    done = subprocess.run(
        [sys.executable, "-c", DRIVER_STEP, str(log_dir)],
        env={**env, "PYTHONPATH": root, "PATH": os.environ.get("PATH", "")},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_every_worker_of_one_spark_driver_finds_the_same_run(tmp_path: Path) -> None:
    steps = ["planner 0", "commit 0", "planner 1", "commit 1"]
    found = [driver_step(tmp_path / "log", SPARK_WORKER_ENV) for _ in steps]
    assert found == ["0 0"] * len(steps)
    other_driver = {**SPARK_WORKER_ENV, "SPARK_LOCAL_DIRS": "/x/blockmgr-" + str(uuid.uuid4())}
    assert driver_step(tmp_path / "log", other_driver) == "1 1"


def test_a_spark_worker_without_the_drivers_directories_is_refused() -> None:
    env = {**SPARK_WORKER_ENV, "SPARK_LOCAL_DIRS": "/mnt/spark"}  # no block manager directory
    with pytest.raises(ConfigError, match="SPARK_LOCAL_DIRS") as caught:
        runs.driver_identity(env)
    assert "/mnt/spark" in str(caught.value)


def test_a_process_with_a_spark_context_is_not_taken_for_a_worker() -> None:
    """PySpark's SparkContext sets these two in its own process (the user's driver, a test
    session): steps called there are that process, not a worker missing its directories."""
    context_env = {"SPARK_BUFFER_SIZE": "65536", "SPARK_AUTH_SOCKET_TIMEOUT": "15"}
    assert runs.driver_identity(context_env) == runs.driver_identity({})


def test_outside_spark_the_driver_is_this_process() -> None:
    assert runs.driver_identity({}) == runs.driver_identity({})
    assert runs.driver_identity({}) != runs.driver_identity(SPARK_WORKER_ENV)


def test_the_cli_counts_a_transactions_own_timeout_past_the_clock_skew(
    commit_log: CommitLog,
) -> None:
    commit_log.put_owner(owner(0, 0))  # the latest run, not released: it may still decide
    now = now_ms()

    def state(partition: int, started_ago_ms: int) -> TxnState:
        txn_id = f"{SINK}-0-{partition}"
        return TxnState(txn_id, ONGOING, 7, 0, 60_000, now - started_ago_ms)

    within, skewed, past = state(0, 59_000), state(1, 64_000), state(2, 66_000)
    judged = judge(SINK, commit_log, (within, skewed, past), now, clock_skew_ms=5_000)

    assert judged[within.triple][0] is False
    assert "latest owner and not released; 1.0 s of its own 60000 ms" in judged[within.triple][1]
    assert judged[skewed.triple][0] is False  # within the allowance for the brokers' clocks
    assert judged[past.triple] == (True, "its own timeout of 60000 ms passed 6.0 s ago")
