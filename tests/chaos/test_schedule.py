"""The seeded schedule: the kinds of issue 14 are drawn, the other trials keep their faults."""

from __future__ import annotations

from collections import Counter

from tests.chaos.schedule import (
    FREEZE_BACKSTOP,
    GONE_POINT,
    INFLIGHT_ORDERS,
    VACUUM_POINTS,
    WEIGHTS,
    Fault,
    build_schedule,
    failpoint_spec,
    filtered_schedule,
)

SEED, TRIALS = 7, 200


def test_the_concurrent_kinds_replace_some_trials_and_leave_the_others_alone() -> None:
    before = build_schedule(SEED, TRIALS, concurrent=False, in_doubt=False, retention=False)
    after = build_schedule(SEED, TRIALS, in_doubt=False, retention=False)

    changed = [(old, new) for old, new in zip(before, after, strict=True) if old != new]

    assert changed, "no trial of the new kinds"
    assert {new.kind for _, new in changed} == {"driver2", "freeze", "late"}
    assert all(old.kind != "broker" for old, _ in changed)


def test_a_coordinator_kill_once_and_only_on_three_nodes() -> None:
    single = Counter(f.kind for f in build_schedule(SEED, TRIALS))
    cluster = Counter(f.kind for f in build_schedule(SEED, TRIALS, broker=False, coordinator=True))

    assert single["coordinator"] == 0
    assert cluster["coordinator"] == 1
    assert cluster["broker"] == 0


def test_the_same_seed_gives_the_same_schedule() -> None:
    assert build_schedule(SEED, TRIALS, coordinator=True) == build_schedule(
        SEED, TRIALS, coordinator=True
    )


def test_a_freeze_is_also_held_at_the_end_of_its_batch() -> None:
    freeze = Fault("freeze", "driver.before_prepare_check", 100, 15.0, delay_s=0.9)
    assert failpoint_spec(freeze, 7) == (
        f"driver.before_prepare_check=block@7;{FREEZE_BACKSTOP}=block@7"
    )
    assert failpoint_spec(Fault("kill", "task.after_init", 100), 7) == "task.after_init=block@7"


def test_inflight_replaces_some_kill_worker_and_s3_trials_and_leaves_the_others_alone() -> None:
    for log in ("json", "delta"):
        before = build_schedule(SEED, TRIALS, in_doubt=False, retention=False, log=log)
        after = build_schedule(SEED, TRIALS, retention=False, log=log)

        changed = [(old, new) for old, new in zip(before, after, strict=True) if old != new]

        assert {new.kind for _, new in changed} == {"inflight"}
        assert all(old.kind in WEIGHTS for old, _ in changed)
        assert {new.order for _, new in changed} == set(INFLIGHT_ORDERS[log])


def test_gone_and_vacuum_replace_some_kill_worker_and_s3_trials_only() -> None:
    before = build_schedule(SEED, TRIALS, retention=False)
    after = build_schedule(SEED, TRIALS)

    changed = [(old, new) for old, new in zip(before, after, strict=True) if old != new]

    assert {new.kind for _, new in changed} == {"gone", "vacuum"}
    assert all(old.kind in WEIGHTS for old, _ in changed)
    assert {f.point for _, f in changed if f.kind == "gone"} == {GONE_POINT}
    assert {f.point for _, f in changed if f.kind == "vacuum"} <= set(VACUUM_POINTS)


def test_kinds_filter_draws_only_the_kinds_asked_for() -> None:
    faults = filtered_schedule(SEED, 12, ("inflight", "kill"), "delta")

    assert {f.kind for f in faults} == {"inflight", "kill"}
    assert {f.order for f in faults if f.kind == "inflight"} <= set(INFLIGHT_ORDERS["delta"])
    assert failpoint_spec(next(f for f in faults if f.kind == "inflight"), 7) == ""
    assert filtered_schedule(SEED, 12, ("inflight", "kill"), "delta") == faults
