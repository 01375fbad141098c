"""The seeded fault schedule: which fault each trial injects, and where.

A trial restarts the query with one failpoint armed for a fresh batch (`point=block@batch`);
when the query reaches it, the fault strikes:

- `kill`: SIGKILL of the whole query (driver, JVM, Python workers). Its points are drawn
  evenly over every failpoint of the protocol that fires in its shape (`KILL_POINTS`): the
  points are dealt from a shuffled deck, so over n kills each of the k points is hit n/k
  times, give or take one. The republish points are reached only after the broker aborted a
  decided batch, so those trials first hold the batch after its decision, with a short
  transaction timeout, until the coordinator has aborted it: its records are then lost by
  design (the sink reports them; the bound of the README) and its file references are
  republished.
- `worker`: SIGKILL of the Python worker that runs the held task; Spark retries the task.
- `s3`: the S3 server is frozen (SIGSTOP) for `pause_s` seconds while the query goes on, so
  uploads or commit-log writes time out and are retried or fail.
- `broker`: the Kafka broker is killed and restarted while the query is held; once per run.
- `driver2`: while the query is held at a driver point of the fresh batch, a second driver of
  the same query (same checkpoint, sinkId and commit log; another Spark application) starts
  and is held at its own point; the two are released one after the other, in `order`.
- `freeze`: the query is released from its point, and `delay_s` later its whole process tree
  is frozen (SIGSTOP) for `pause_s` seconds while a second driver runs; then it is thawed
  (SIGCONT) and killed a few seconds later. It is also held at the end of its batch, so that it
  cannot finish and exit before the freeze strikes.
- `late`: while the query is held after its decision of the batch, a late task attempt of that
  batch starts in another Spark application; it must return `skipped` and change nothing.
- `coordinator`: on a bed of three Kafka nodes only, the node coordinating the sink's open
  transactions is killed and restarted while the query is held; once per run.
- `inflight`: the query talks to S3 through a proxy that holds the PUTs of the fresh batch's
  decision (round 0 of its outcome key) past the driver's deadlines, so `commit()` fails with
  `DecisionInDoubtError` and Spark calls `abort()`; once the query has ended, the held PUTs are
  delivered, in `order`: `decision-late` (only the decision is held: abort()'s record lands
  first, in its own time; JSON log only, a Delta commit does not tell the two apart),
  `decision-first` (abort()'s PUTs are held too; the decision's are delivered first) or
  `abort-first` (both held; abort()'s delivered first). The next start settles the batch.
- `gone`: held after the first EndTxn(commit), the batch is committed behind the driver's back,
  one participant's id is initialised again and its first records deleted; the restarted
  query's probe must find the commit from the records left (retention.py).
- `vacuum`: `kafka-txn-sink vacuum --execute`, its clock two days ahead, runs while the batch
  is in flight; none of the batch's files may go (retention.py).

The issue-14 kinds (`driver2`, `freeze`, `late`, `coordinator`) are drawn from a second random
stream seeded from the same seed, and `inflight` from a third: they replace the trial they land
on, and every other trial keeps the fault the seed gave it before (the deck of kill points
skips the points of replaced kills); `gone` and `vacuum` come from a fourth stream, likewise.
`filtered_schedule` draws only the kinds asked for.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from kafka_txn_sink.failpoints import (
    ACROSS_POINTS,
    ALL_POINTS,
    DRIVER_POINTS,
    REPUBLISH_POINTS,
    START_POINTS,
    TASK_POINTS,
)

# The bed's consumer group lives on the output cluster: the point of a group on another
# cluster (committed after the rows) never fires here, so it is not dealt; nor the start's
# point, which came after the seeds' schedules were fixed (the driver.* kills cover it).
KILL_POINTS = tuple(p for p in ALL_POINTS if p not in ACROSS_POINTS + START_POINTS)

KINDS = (
    "kill", "worker", "s3", "broker", "driver2", "freeze", "late", "coordinator", "inflight",
    "gone", "vacuum",
)  # fmt: skip
# Where the S3 server is frozen: during a task's uploads, the decision, the completion marker.
S3_POINTS = ("task.after_produce", "driver.before_decision", "driver.after_decision")
# Where the query is held while the broker restarts: prepared, decided, half committed.
BROKER_POINTS = (
    "driver.before_prepare_check",
    "driver.after_decision",
    "driver.after_first_endtxn",
)
WEIGHTS = {"kill": 0.7, "worker": 0.15, "s3": 0.15}
# The kinds of issue 14, each as likely as an S3 freeze; they replace the trial they land on.
CONCURRENT_WEIGHTS = {"driver2": 0.05, "freeze": 0.05, "late": 0.05}
# Where the first driver of `driver2` is held: prepared, about to decide, decided, half done.
DRIVER2_OLD_POINTS = (
    "driver.before_prepare_check",
    "driver.before_decision",
    "driver.after_decision",
    "driver.after_first_endtxn",
)
# Where the second driver is held: points it reaches while it re-runs the batch.
DRIVER2_NEW_POINTS = ("driver.before_prepare_check", "driver.before_decision")
ORDERS = ("old-first", "new-first")
FREEZE_POINTS = TASK_POINTS + DRIVER2_OLD_POINTS
FREEZE_S = (10.0, 30.0)
FREEZE_DELAY_S = (0.0, 1.5)  # from the release to the SIGSTOP: the random moment
LATE_POINT = "driver.after_decision"
# inflight (issue 24): a share of the trials; where the PUT is held; the orders of delivery.
IN_DOUBT_SHARE = 0.07
INFLIGHT_POINT = "decision_put"
INFLIGHT_ORDERS = {
    "json": ("decision-late", "decision-first", "abort-first"),
    "delta": ("decision-first", "abort-first"),
}
# gone, vacuum (issue 24): a share of the trials each; where they strike.
RETENTION_SHARE = 0.04
GONE_POINT = "driver.after_first_endtxn"
# A task has uploaded its files; every task has, before the check; before the decision.
VACUUM_POINTS = ("task.after_flush", "driver.before_prepare_check", "driver.before_decision")
NEW_IDS = (60, 160)  # ids produced before each trial, bounds included
PAUSE_S = (2.0, 9.0)


@dataclass(frozen=True)
class Fault:
    kind: str
    point: str
    new_ids: int
    pause_s: float = 0.0
    second_point: str = ""  # driver2: where the second driver is held
    order: str = ""  # driver2: which driver is released first
    delay_s: float = 0.0  # freeze: from the release to the SIGSTOP

    def label(self) -> str:
        if self.kind in ("s3", "freeze"):
            return f"{self.kind}@{self.point} {self.pause_s:.1f}s"
        if self.kind == "driver2":
            return f"{self.kind}@{self.point}+{self.second_point} {self.order}"
        if self.kind == "inflight":
            return f"{self.kind}@{self.point} {self.order}"
        return f"{self.kind}@{self.point}"

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def build_schedule(
    seed: int,
    trials: int,
    *,
    broker: bool = True,
    s3: bool = True,
    coordinator: bool = False,
    concurrent: bool = True,
    in_doubt: bool = True,
    retention: bool = True,
    log: str = "json",
) -> list[Fault]:
    """The faults of `trials` trials; the same for the same arguments, whatever the slices.

    `coordinator`: the bed has three Kafka nodes (one coordinator kill per run);
    `concurrent`: draw the second-driver, freeze and late-attempt kinds too;
    `in_doubt`: draw `inflight` too, with the orders the commit log `log` can tell apart;
    `retention`: draw `gone` and `vacuum` too."""
    rng = random.Random(seed)
    broker_at = rng.randrange(trials) if broker and trials else -1
    weights = {k: w for k, w in WEIGHTS.items() if s3 or k != "s3"}
    deck: list[str] = []
    faults = []
    for index in range(trials):
        kind = "broker" if index == broker_at else _draw(rng, weights)
        faults.append(make_fault(rng, kind, deck))
    faults = _with_concurrent_kinds(seed, faults, broker_at, coordinator, concurrent)
    faults = _with_in_doubt_kinds(seed, faults, log) if in_doubt else faults
    return _with_retention_kinds(seed, faults) if retention else faults


def _with_concurrent_kinds(
    seed: int, faults: list[Fault], broker_at: int, coordinator: bool, concurrent: bool
) -> list[Fault]:
    """`faults` with some trials replaced by the kinds of issue 14, from a stream of their own
    (so the other trials keep the faults older versions of the suite drew)."""
    rng = random.Random(f"{seed}/concurrent")
    trials = len(faults)
    coordinator_at = rng.randrange(trials) if coordinator and trials else -1
    share = sum(CONCURRENT_WEIGHTS.values())
    replaced = list(faults)
    for index in range(trials):
        drawn = rng.random() < share  # drawn for every trial: later trials stay put
        if index == coordinator_at:
            replaced[index] = make_fault(rng, "coordinator", [])
        elif concurrent and drawn and index != broker_at:
            replaced[index] = make_fault(rng, _draw(rng, CONCURRENT_WEIGHTS), [])
    return replaced


def _with_in_doubt_kinds(seed: int, faults: list[Fault], log: str) -> list[Fault]:
    """`faults` with some kill, worker and S3 trials replaced by `inflight`, from a stream of
    their own (so the other trials keep the faults older versions of the suite drew)."""
    rng, faults_rng = random.Random(f"{seed}/in-doubt"), random.Random(f"{seed}/in-doubt/faults")
    replaced = list(faults)
    orders: list[str] = []  # dealt like the kill points: each order as often as the others
    for index, fault in enumerate(faults):
        drawn = rng.random() < IN_DOUBT_SHARE  # drawn for every trial: later trials stay put
        if drawn and fault.kind in WEIGHTS:
            replaced[index] = make_fault(faults_rng, "inflight", orders, log)
    return replaced


def _with_retention_kinds(seed: int, faults: list[Fault]) -> list[Fault]:
    """`faults` with some kill, worker and S3 trials replaced by `gone` or `vacuum`, from a
    stream of their own (so the other trials keep the faults older versions drew)."""
    rng, faults_rng = random.Random(f"{seed}/retention"), random.Random(f"{seed}/retention/f")
    replaced = list(faults)
    for index, fault in enumerate(faults):
        drawn = rng.random()  # drawn for every trial: later trials stay put
        if drawn < 2 * RETENTION_SHARE and fault.kind in WEIGHTS:
            kind = "gone" if drawn < RETENTION_SHARE else "vacuum"
            replaced[index] = make_fault(faults_rng, kind, [])
    return replaced


def filtered_schedule(
    seed: int, trials: int, kinds: Sequence[str], log: str = "json"
) -> list[Fault]:
    """`trials` faults of the `kinds` only, each drawn as likely as the others (kill points
    dealt from the deck as in the full schedule): for a short run of chosen kinds."""
    unknown = sorted(set(kinds) - set(KINDS))
    if unknown or not kinds:
        raise ValueError(f"unknown fault kinds {unknown}; the kinds are {', '.join(KINDS)}")
    rng = random.Random(f"{seed}/kinds/{','.join(kinds)}")
    decks: dict[str, list[str]] = {kind: [] for kind in kinds}
    drawn = [rng.choice(list(kinds)) for _ in range(trials)]
    return [make_fault(rng, kind, decks[kind], log) for kind in drawn]


def short_schedule(seed: int, *, s3: bool = True) -> list[Fault]:
    """The CI run: a driver-point kill, a task-point kill, a worker kill (and an S3 pause)."""
    rng = random.Random(seed)
    new_ids = rng.randint(*NEW_IDS)
    faults = [
        Fault("kill", rng.choice(DRIVER_POINTS), new_ids),
        Fault("kill", rng.choice(TASK_POINTS), new_ids),
        Fault("worker", rng.choice(TASK_POINTS), new_ids),
    ]
    if s3:
        faults.append(Fault("s3", rng.choice(S3_POINTS), new_ids, round(rng.uniform(*PAUSE_S), 1)))
    rng.shuffle(faults)
    return faults


def make_fault(rng: random.Random, kind: str, deck: list[str], log: str = "json") -> Fault:
    """A fault of `kind`; kill points and inflight orders are dealt from `deck`."""
    new_ids = rng.randint(*NEW_IDS)
    if kind == "kill":
        if not deck:
            deck.extend(rng.sample(KILL_POINTS, len(KILL_POINTS)))
        return Fault(kind, deck.pop(), new_ids)
    if kind == "worker":
        return Fault(kind, rng.choice(TASK_POINTS), new_ids)
    if kind == "s3":
        return Fault(kind, rng.choice(S3_POINTS), new_ids, round(rng.uniform(*PAUSE_S), 1))
    if kind in ("broker", "coordinator"):
        return Fault(kind, rng.choice(BROKER_POINTS), new_ids)
    if kind == "driver2":
        old, new, order = (rng.choice(c) for c in (DRIVER2_OLD_POINTS, DRIVER2_NEW_POINTS, ORDERS))
        return Fault(kind, old, new_ids, second_point=new, order=order)
    if kind == "freeze":
        pause, delay = round(rng.uniform(*FREEZE_S), 1), round(rng.uniform(*FREEZE_DELAY_S), 1)
        return Fault(kind, rng.choice(FREEZE_POINTS), new_ids, pause, delay_s=delay)
    if kind == "late":
        return Fault(kind, LATE_POINT, new_ids)
    if kind == "inflight":
        if not deck:
            deck.extend(rng.sample(INFLIGHT_ORDERS[log], len(INFLIGHT_ORDERS[log])))
        return Fault(kind, INFLIGHT_POINT, new_ids, order=deck.pop())
    if kind == "gone":
        return Fault(kind, GONE_POINT, new_ids)
    if kind == "vacuum":
        return Fault(kind, rng.choice(VACUUM_POINTS), new_ids)
    raise ValueError(f"unknown fault kind {kind!r}")


HELD_FOR_TIMEOUT = "driver.after_decision"


def beyond_the_bound(fault: Fault) -> bool:
    """The trial lets the broker abort a decided batch (to reach a republish point)."""
    return fault.point in REPUBLISH_POINTS


# A frozen query is first released; it is also held here, so that it cannot finish the batch
# and exit before the freeze (then the freeze strikes it held at the end of its batch).
FREEZE_BACKSTOP = "driver.after_completion"


def failpoint_spec(fault: Fault, batch: int) -> str:
    """Hold the query at the fault's point in batch `batch` (a point that fires without a
    batch id: the first time it fires); first after the decision, when beyond the bound; and
    at the end of the batch too, for a freeze; none for `inflight`."""
    if fault.kind == "inflight":
        return ""  # the proxy holds the query, not a failpoint
    spec = f"{fault.point}=block@{batch}"
    if fault.kind == "freeze":
        return f"{spec};{FREEZE_BACKSTOP}=block@{batch}"
    return f"{HELD_FOR_TIMEOUT}=block@{batch};{spec}" if beyond_the_bound(fault) else spec


def _draw(rng: random.Random, weights: dict[str, float]) -> str:
    return rng.choices(list(weights), weights=list(weights.values()))[0]
