"""The seeded schedule: the kinds of issue 14 are drawn, the other trials keep their faults."""

from __future__ import annotations

from collections import Counter

from tests.chaos.schedule import FREEZE_BACKSTOP, Fault, build_schedule, failpoint_spec

SEED, TRIALS = 7, 200


def test_the_concurrent_kinds_replace_some_trials_and_leave_the_others_alone() -> None:
    before = build_schedule(SEED, TRIALS, concurrent=False)
    after = build_schedule(SEED, TRIALS)

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
