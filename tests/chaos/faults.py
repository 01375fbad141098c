"""The fault runners: how each kind of fault strikes a query held at its point, and how the
query ended afterwards."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from typing import Any

from kafka_txn_sink.kafka.txn_admin import ONGOING, TxnAdmin
from kafka_txn_sink.testing import KafkaBroker
from tests.chaos import procs, query
from tests.chaos.inflight import strike_inflight, through_proxy
from tests.chaos.late import late_attempt
from tests.chaos.oracle import commit_log_of
from tests.chaos.query import REACH_S, FaultNotFired, QuerySpec, Running, finish
from tests.chaos.retention import strike_gone, strike_vacuum
from tests.chaos.schedule import HELD_FOR_TIMEOUT, Fault, beyond_the_bound
from tests.chaos.state import Context
from tests.e2e.harness import describe, open_transactions

ABORT_WAIT_S = 120.0
THAWED_S = 3.0  # a frozen driver runs this long after SIGCONT before it is killed
NODE_RESTART_S = 180.0
# Beyond the bound: transactions the coordinator aborts within a minute, and a commit margin the
# batch still passes (33.3 s: 9 commit-log requests of 3 s, their 2.3 s of backoff and 2 EndTxn
# rounds of 2 s, margin.py), leaving the batch 15 s as before.
TIMEOUT_OPTIONS = {
    # 4 s above the 48.5 s it was before consumerGroup grew the margin by 2 x commitTimeoutMs.
    "transactionTimeoutMs": "52500",
    "commitTimeoutMs": "2000",
    "commitLogTimeoutMs": "3000",
    "clockSkewMs": "0",
}


def spec_for(context: Context, fault: Fault) -> QuerySpec:
    if not beyond_the_bound(fault):
        return context.spec
    return replace(context.spec, options={**context.spec.options, **TIMEOUT_OPTIONS})


def strike_kill(context: Context, running: Running, fault: Fault, batch: int) -> dict[str, Any]:
    """SIGKILL the whole query while it is held at the point."""
    if beyond_the_bound(fault):
        hold_until_aborted(context, running, batch)
    hit = running.wait_reached(fault.point, REACH_S)
    killed = running.kill()
    if not killed:
        raise FaultNotFired(f"the query had ended before the kill at {fault.point}")
    return {"hit": hit, "killed_processes": len(killed), "outcome": "killed"}


def hold_until_aborted(context: Context, running: Running, batch: int) -> None:
    """Hold batch `batch` after its decision until the coordinator's timeout aborted all of
    its transactions, then let the driver go on (to find them lost and republish)."""
    started = time.monotonic()
    running.wait_reached(HELD_FOR_TIMEOUT, REACH_S)
    commit_log = commit_log_of(context.bed, context.sink)
    decision = commit_log.decision(batch)
    if decision is None or not decision.participants:
        raise FaultNotFired(f"batch {batch} was held after its decision, but has no participants")
    txn_ids = [p.transactional_id for p in decision.participants]
    deadline = time.monotonic() + ABORT_WAIT_S
    with TxnAdmin(context.bed.bootstrap, {}) as txn_admin:
        while any(s.state == ONGOING for s in txn_admin.describe(txn_ids).values()):
            if time.monotonic() > deadline:
                raise FaultNotFired(f"the coordinator did not abort batch {batch} in time")
            time.sleep(0.5)
    running.notes["held_until_aborted_s"] = round(time.monotonic() - started, 1)
    running.release(HELD_FOR_TIMEOUT)


def strike_worker(context: Context, running: Running, fault: Fault, batch: int) -> dict[str, Any]:
    """SIGKILL the Python worker that runs the held task; Spark retries the task."""
    hit = running.wait_reached(fault.point, REACH_S)
    workers = procs.task_workers(running.process.pid)
    if hit["pid"] not in workers:
        raise FaultNotFired(
            f"the task held at {fault.point} runs in pid {hit['pid']}, which is not one of "
            f"the query's Python workers {workers}"
        )
    procs.kill_worker(hit["pid"])
    running.release(fault.point)
    ended = finish(running)
    retried = task_retried(context, batch)
    return {"hit": hit, "killed_worker": hit["pid"], "task_retried": retried, **ended}


def strike_s3(context: Context, running: Running, fault: Fault, batch: int) -> dict[str, Any]:
    """Freeze the S3 server for `pause_s` while the query goes on from the point."""
    hit = running.wait_reached(fault.point, REACH_S)
    context.bed.s3.pause()
    try:
        running.release(fault.point)
        time.sleep(fault.pause_s)
    finally:
        context.bed.s3.resume()
    ended = finish(running)
    return {"hit": hit, **ended, "task_retried": task_retried(context, batch)}


def strike_broker(context: Context, running: Running, fault: Fault, batch: int) -> dict[str, Any]:
    """Kill the broker and start it again (same data) while the query is held."""
    hit = running.wait_reached(fault.point, REACH_S)
    broker = context.bed.broker
    assert isinstance(broker, KafkaBroker)
    began = time.monotonic()
    broker.restart(timeout=180, graceful=False)
    down_s = round(time.monotonic() - began, 1)
    running.release(fault.point)
    return {"hit": hit, "broker_down_s": down_s, **finish(running)}


def strike_driver2(context: Context, running: Running, fault: Fault, batch: int) -> dict[str, Any]:
    """Hold a second driver of the same query at its own point while the first is held, then
    release them one after the other; either may end with an error (superseded, or Spark's
    checkpoint refusing a second run): the end state is what the oracle checks."""
    hit = running.wait_reached(fault.point, REACH_S)
    second = start_second_driver(context, running, f"{fault.second_point}=block@{batch}")
    try:
        second_hit = reached_or_ended(second, fault.second_point)
        drivers = {"old": (running, fault.point), "new": (second, fault.second_point)}
        first = fault.order.split("-")[0]
        ended = {}
        for name in (first, "new" if first == "old" else "old"):
            process, point = drivers[name]
            process.release(point)
            ended[name] = finish(process)["outcome"]
    finally:
        second.kill()
    return {
        "hit": hit,
        "second_hit": second_hit,
        "outcome": f"old {ended['old']}; new {ended['new']}",
    }


def strike_freeze(context: Context, running: Running, fault: Fault, batch: int) -> dict[str, Any]:
    """Release the query, freeze it `delay_s` later for `pause_s` while a second driver runs,
    thaw it, and kill it a few seconds later."""
    hit = running.wait_reached(fault.point, REACH_S)
    running.release(fault.point)
    time.sleep(fault.delay_s)
    frozen = procs.freeze_tree(running.process.pid) if running.process.poll() is None else []
    if not frozen:
        raise FaultNotFired(f"the query had ended {fault.delay_s} s after {fault.point}")
    second = start_second_driver(context, running)
    try:
        time.sleep(fault.pause_s)
        procs.thaw(frozen)
        time.sleep(THAWED_S)
        old_ended = "killed" if running.kill() else finish(running)["outcome"]
        new_ended = finish(second)["outcome"]
    finally:
        procs.thaw(frozen)
        second.kill()
    return {"hit": hit, "frozen_processes": len(frozen), "outcome": f"old {old_ended}; "
            f"new {new_ended}"}  # fmt: skip


def strike_late(context: Context, running: Running, fault: Fault, batch: int) -> dict[str, Any]:
    """While batch `batch` is held after its decision, a task attempt of it starts in another
    Spark application: it must answer `skipped` and leave the decided transactions alone."""
    hit = running.wait_reached(fault.point, REACH_S)
    decision = commit_log_of(context.bed, context.sink).decision(batch)
    if decision is None or not decision.participants:
        raise FaultNotFired(f"batch {batch} was held after its decision, but has no participants")
    txn_ids = [p.transactional_id for p in decision.participants]
    before = {i: s.triple for i, s in describe(context.bed.bootstrap, txn_ids).items()}
    status = late_attempt(context.spec, batch, decision.participants[0].partition)
    after = {i: s.triple for i, s in describe(context.bed.bootstrap, txn_ids).items()}
    running.release(fault.point)
    changed = sorted(i for i in txn_ids if before.get(i) != after.get(i))
    return {"hit": hit, "late_status": status, "late_changed": changed, **finish(running)}


def strike_coordinator(
    context: Context, running: Running, fault: Fault, batch: int
) -> dict[str, Any]:
    """Kill the node coordinating the sink's open transactions while the query is held,
    restart it, then release the query."""
    hit = running.wait_reached(fault.point, REACH_S)
    cluster = context.bed.cluster
    assert cluster is not None, "coordinator trials need a bed of three Kafka nodes"
    held = open_transactions(cluster.bootstrap, context.sink.sink_id)
    open_ids = [s.transactional_id for s in held]
    if not open_ids:
        raise FaultNotFired(f"batch {batch} has no open transaction at {fault.point}")
    nodes = sorted(cluster.coordinators(open_ids))
    began = time.monotonic()
    for node in nodes:
        cluster.kill(node)
    for node in nodes:
        cluster.launch(node)
    cluster.wait_healthy(NODE_RESTART_S)
    down_s = round(time.monotonic() - began, 1)
    running.release(fault.point)
    return {"hit": hit, "killed_nodes": nodes, "nodes_down_s": down_s, **finish(running)}


def start_second_driver(context: Context, first: Running, failpoint_spec: str = "") -> Running:
    """Another Spark application running the same query (checkpoint, sinkId, log) with its
    own failpoint directory."""
    return query.start(context.spec, first.directory / "driver2", failpoint_spec)


def reached_or_ended(running: Running, point: str) -> dict[str, Any] | str:
    """The first hit of `point`, or how the query ended without reaching it (a second driver
    may find the batch done, or be refused by Spark's checkpoint)."""
    try:
        return running.wait_reached(point, REACH_S)
    except FaultNotFired as exc:
        if running.process.poll() is None:
            raise
        return f"ended before {point}: {str(exc)[:200]}"


def late_anomalies(results: Iterable[dict[str, Any]]) -> list[str]:
    """Late attempts that did not answer `skipped`, or changed a decided transaction."""
    return [
        f"trial {r['index']} batch {r['batch']}: {r['late_status']}, changed {r['late_changed']}"
        for r in results
        if "late_status" in r and (r["late_status"] != "skipped" or r["late_changed"])
    ]


def task_retried(context: Context, batch: int) -> bool | None:
    """Whether batch `batch` was decided with a task's second (or later) attempt; None when it
    is not decided (yet)."""
    commit_log = commit_log_of(context.bed, context.sink)
    decision = commit_log.decision(batch)
    return None if decision is None else any(p.attempt > 0 for p in decision.participants)


STRIKES: dict[str, Callable[[Context, Running, Fault, int], dict[str, Any]]] = {
    "kill": strike_kill,
    "worker": strike_worker,
    "s3": strike_s3,
    "broker": strike_broker,
    "driver2": strike_driver2,
    "freeze": strike_freeze,
    "late": strike_late,
    "coordinator": strike_coordinator,
    "inflight": strike_inflight,
    "gone": strike_gone,
    "vacuum": strike_vacuum,
}


@contextmanager
def trial_spec(context: Context, fault: Fault, batch: int) -> Iterator[QuerySpec]:
    """The query a trial starts: through an S3 proxy for `inflight` (while the block runs),
    with short transaction timeouts beyond the bound, else the suite's own."""
    spec = spec_for(context, fault)
    if fault.kind != "inflight":
        yield spec
        return
    with through_proxy(context, spec, fault, batch) as proxied:
        yield proxied
