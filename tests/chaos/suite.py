"""The randomized crash suite: one streaming query, a seeded schedule of faults, one oracle.

    .venv/bin/python -m tests.chaos.suite --trials 200 --seed 7 --state DIR [--slice A:B]

It starts its own Kafka broker and S3 server (the test bed; or uses `KTS_KAFKA_BOOTSTRAP` /
`KTS_S3_ENDPOINT`), produces input ids, and runs ONE streaming query (examples/pipeline.py,
availableNow, same checkpoint and sink every time) that writes every row as a Kafka record and
into a partitioned Avro file on S3 with one reference message per file; the commit log is on S3
too. Each trial produces more ids, restarts the query with one fault from the schedule
(schedule.py) and checks that the fault struck. At the end of every run the query drains
without faults and the oracle compares, id by id, the input topic with what read_committed
consumers see in the records topic and in the referenced files.

Trial results are saved in DIR/state.json after each trial: a rerun with the same DIR skips the
trials done, and `--slice A:B` runs trials A..B-1 only. Exit status 0 when every fault struck
and the oracle found nothing.
"""

from __future__ import annotations

import argparse
import bisect
import io
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from collections import Counter, defaultdict
from collections.abc import Callable, Collection, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import fastavro
from rich.console import Console

from kafka_txn_sink.commit_log import CommitLog, open_commit_log
from kafka_txn_sink.files.references import parse_reference
from kafka_txn_sink.kafka.txn_admin import ONGOING, TxnAdmin
from kafka_txn_sink.storage import S3Settings
from kafka_txn_sink.testing import KafkaBroker, spark_jars
from kafka_txn_sink.testing.topics import IdReport, compare_ids, read_topic
from tests.chaos import procs, query
from tests.chaos.bed import Bed, Sink, load_bucket, own_bed, save_bucket, write_json
from tests.chaos.late import late_attempt
from tests.chaos.query import FaultNotFired, QuerySpec, Running
from tests.chaos.report import print_report
from tests.chaos.schedule import (
    HELD_FOR_TIMEOUT,
    Fault,
    beyond_the_bound,
    build_schedule,
    failpoint_spec,
)
from tests.e2e.harness import describe, open_transactions, produce_events

STATE_VERSION = 2  # 2: the kinds of issue 14 (second driver, freeze, late attempt, coordinator)
INITIAL_IDS = 400
USERS = 3
REACH_S = 300.0  # a restart, a re-run batch and the fresh one, on a busy 2-core machine
EXIT_S = 420.0  # the query drains its backlog after a fault it survives
DRAIN_RUNS = 3  # the final drain may meet a loss the sink raises once
START_ATTEMPTS = 2  # a query may fail once after a crash (a loss is raised once): recorded
ABORT_WAIT_S = 120.0
THAWED_S = 3.0  # a frozen driver runs this long after SIGCONT before it is killed
NODE_RESTART_S = 180.0
# Beyond the bound: transactions the coordinator aborts within a minute, and a commit margin the
# batch still passes (33.3 s: 9 commit-log requests of 3 s, their 2.3 s of backoff and 2 EndTxn
# rounds of 2 s, margin.py), leaving the batch 15 s as before.
TIMEOUT_OPTIONS = {
    "transactionTimeoutMs": "48500",
    "commitTimeoutMs": "2000",
    "commitLogTimeoutMs": "3000",
    "clockSkewMs": "0",
}


# -- state -------------------------------------------------------------------------------------


@dataclass
class State:
    """DIR/state.json: the run's seed, schedule and sink, and every finished trial."""

    directory: Path
    body: dict[str, Any]

    @classmethod
    def open(cls, directory: Path, seed: int, schedule: Sequence[Fault]) -> State:
        path = directory / "state.json"
        planned = [f.to_json() for f in schedule]
        if not path.exists():
            body = {
                "version": STATE_VERSION,
                "seed": seed,
                "schedule": planned,
                "name": uuid.uuid4().hex[:10],
                "results": {},
                "checks": [],
                "created": False,
                "s3_saved": True,
            }
            state = cls(directory, body)
            state.save()
            return state
        body = json.loads(path.read_text())
        if body.get("seed") != seed or body.get("schedule") != planned:
            raise SystemExit(
                f"{path} was made with seed {body.get('seed')} and "
                f"{len(body.get('schedule', []))} trials; use the same --seed and --trials "
                f"to resume, or another --state directory"
            )
        return cls(directory, body)

    def save(self) -> None:
        write_json(self.directory / "state.json", self.body)

    def done(self, index: int) -> bool:
        return str(index) in self.body["results"]

    def record(self, result: dict[str, Any]) -> None:
        self.body["results"][str(result["index"])] = result
        self.save()

    def set(self, key: str, value: Any) -> None:
        self.body[key] = value
        self.save()

    @property
    def results(self) -> list[dict[str, Any]]:
        return [self.body["results"][k] for k in sorted(self.body["results"], key=int)]


@dataclass
class Context:
    bed: Bed
    sink: Sink
    spec: QuerySpec
    state: State
    console: Console
    ready: bool = False  # the bucket holds the run's objects: safe to mirror

    @property
    def directory(self) -> Path:
        return self.state.directory


# -- the run -----------------------------------------------------------------------------------


@dataclass
class Outcome:
    """What one run of the suite did: its trials, the drain, and the oracle's findings."""

    seed: int
    schedule: list[Fault]
    ran: list[dict[str, Any]]
    all_results: list[dict[str, Any]]
    drain: dict[str, Any]
    report: OracleReport
    seconds: float
    # `kafka-txn-sink verify` on the same sink: exit code and the kinds of anomaly it found.
    verified: dict[str, Any] = field(default_factory=dict)

    @property
    def faults_struck(self) -> bool:
        return all(r["fired"] for r in self.ran)

    @property
    def ok(self) -> bool:
        return self.faults_struck and self.drain["ok"] and self.report.exact


def run_suite(
    bed: Bed,
    directory: Path,
    seed: int,
    schedule: list[Fault],
    indices: Iterable[int],
    console: Console | None = None,
) -> Outcome:
    """Run the trials of `indices` not done yet, drain the query, and run the oracle."""
    console = console or Console(highlight=False)
    started = time.monotonic()
    directory.mkdir(parents=True, exist_ok=True)
    state = State.open(directory, seed, schedule)
    sink = Sink(state.body["name"], directory)
    jars = ",".join(str(jar) for jar in spark_jars())
    context = Context(bed, sink, sink.query(bed, jars), state, console)
    ran = []
    try:
        prepare(context)
        for index in indices:
            if not state.done(index):
                ran.append(run_and_record(context, index, schedule[index]))
        drained = drain(context)
        report = oracle(bed, sink, held_batches(state.results))
        report.late_attempts_not_skipped = late_anomalies(state.results)
        verified = verify_command(bed, sink)
        state.body["checks"].append(
            {"at": time.time(), "drain": drained, **report.counts(), "verify": verified}
        )
        state.save()
    finally:
        stop_everything(context)
    return Outcome(
        seed, schedule, ran, state.results, drained, report, time.monotonic() - started, verified
    )


def prepare(context: Context) -> None:
    """First run: topics, bucket and the first ids; later runs: the mirrored bucket back."""
    bed, sink, state = context.bed, context.sink, context.state
    if not state.body["created"]:
        sink.create(bed)
        produce_events(bed.bootstrap, sink.input, INITIAL_IDS, users=USERS)
        state.set("created", True)
    elif bed.mirror_s3:
        if not state.body["s3_saved"]:
            raise SystemExit(
                f"{state.directory} cannot be resumed: the suite was killed before it saved "
                f"the S3 server's objects (moto keeps them in memory). Use a new --state."
            )
        count = load_bucket(bed.s3_client(), sink.bucket, state.directory / "s3mirror")
        context.console.print(f"loaded {count} objects of the last run into the S3 server")
    context.ready = True


def run_and_record(context: Context, index: int, fault: Fault) -> dict[str, Any]:
    context.state.set("s3_saved", False)
    result = run_trial(context, index, fault)
    save_s3(context)
    context.state.record(result)
    mark = "struck" if result["fired"] else "[red]DID NOT STRIKE[/red]"
    context.console.print(
        f"trial {index:4d} {fault.label():45s} batch {result['batch']:4d} {mark}: "
        f"{result.get('outcome', result.get('error', ''))[:90]} ({result['seconds']:.0f} s)"
    )
    return result


def save_s3(context: Context) -> None:
    if context.bed.mirror_s3:
        save_bucket(context.bed.s3_client(), context.sink.bucket, context.directory / "s3mirror")
    context.state.set("s3_saved", True)


def stop_everything(context: Context) -> None:
    """No query left running, S3 thawed, and the bucket saved for the next run."""
    query.kill_all()
    if context.bed.can_pause_s3:
        context.bed.s3.resume()
    if context.ready:
        save_s3(context)


# -- one trial ---------------------------------------------------------------------------------


def run_trial(context: Context, index: int, fault: Fault) -> dict[str, Any]:
    """Produce more ids, restart the query held at the fault's point, and strike."""
    started = time.monotonic()
    produce_events(context.bed.bootstrap, context.sink.input, fault.new_ids, users=USERS)
    batch = query.fresh_batch(context.sink.checkpoint)
    result: dict[str, Any] = {"index": index, **fault.to_json(), "batch": batch}
    failed_starts: list[str] = []
    for attempt in range(START_ATTEMPTS):
        directory = context.directory / "trials" / f"{index:04d}" / str(attempt)
        shutil.rmtree(directory, ignore_errors=True)
        running = query.start(spec_for(context, fault), directory, failpoint_spec(fault, batch))
        try:
            result.update(STRIKES[fault.kind](context, running, fault, batch), fired=True)
            result.pop("error", None)  # of a first start that failed (kept in failed_starts)
            break
        except FaultNotFired as exc:
            result.update(fired=False, error=str(exc)[:600])
            if running.process.poll() is None:
                break  # not reached in time: no second chance
            failed_starts.append(running.error())
        finally:
            running.kill()
            result.update(running.notes)
    result["failed_starts"] = failed_starts
    result["seconds"] = round(time.monotonic() - started, 1)
    return result


def held_batches(results: Iterable[dict[str, Any]]) -> set[int]:
    """Batches a trial held until the broker aborted them: beyond the bound on purpose."""
    return {int(r["batch"]) for r in results if "held_until_aborted_s" in r}


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
    commit_log = open_commit_log(context.sink.commit_log, s3_settings(context.bed), "json")
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
    decision = open_commit_log(context.sink.commit_log, s3_settings(context.bed)).decision(batch)
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
    commit_log = open_commit_log(context.sink.commit_log, s3_settings(context.bed), "json")
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
}


def finish(running: Running, timeout_s: float = EXIT_S) -> dict[str, Any]:
    """How the query ended after a fault it may survive."""
    code = running.wait_exit(timeout_s)
    if code is None:
        return {"outcome": f"hung: killed after {timeout_s:.0f} s"}
    if code == 0:
        return {"outcome": "drained"}
    return {"outcome": f"failed: {running.error()}"}


def drain(context: Context) -> dict[str, Any]:
    """Run the query without faults until it ends well (at most DRAIN_RUNS times)."""
    runs = []
    for attempt in range(DRAIN_RUNS):
        running = query.start(context.spec, context.directory / "drain" / str(attempt))
        outcome = finish(running)
        runs.append(outcome["outcome"])
        if outcome["outcome"] == "drained":
            return {"ok": True, "runs": runs}
    return {"ok": False, "runs": runs}


# -- the oracle --------------------------------------------------------------------------------


@dataclass
class OracleReport:
    """Every anomaly, id by id: nothing is summed so that a loss and a duplicate cancel out."""

    input_ids: int
    records: IdReport
    files: IdReport
    excused_ids: list[str] = field(default_factory=list)  # lost beyond the bound, reported
    aborted_reads: list[str] = field(default_factory=list)  # "partition:offset" in no decision
    duplicate_references: list[str] = field(default_factory=list)
    missing_files: list[str] = field(default_factory=list)
    unreferenced_files: list[str] = field(default_factory=list)  # decided, never referenced
    unlogged_references: list[str] = field(default_factory=list)  # referenced, in no decision
    lost_batches: list[int] = field(default_factory=list)  # the sink's own loss reports
    excused_batches: list[int] = field(default_factory=list)  # held beyond the bound on purpose
    open_transactions: list[str] = field(default_factory=list)
    late_attempts_not_skipped: list[str] = field(default_factory=list)  # from the trials
    decided_batches: int = 0
    orphan_files: int = 0  # uploaded by failed attempts, in no decision: expected, not anomalies

    def anomalies(self) -> dict[str, list[str]]:
        return {
            "records: lost ids": sorted(set(self.records.missing) - set(self.excused_ids)),
            "records: duplicated ids": sorted(self.records.duplicated),
            "records: unexpected ids": self.records.unexpected,
            "records: aborted reads": self.aborted_reads,
            "files: lost ids": self.files.missing,
            "files: duplicated ids": sorted(self.files.duplicated),
            "files: unexpected ids": self.files.unexpected,
            "files: referenced twice": self.duplicate_references,
            "files: referenced but missing": self.missing_files,
            "files: decided, not referenced": self.unreferenced_files,
            "files: referenced, not decided": self.unlogged_references,
            "batches the sink reports lost": [str(b) for b in self.lost_batches],
            "transactions left open": self.open_transactions,
            "late attempts not skipped": self.late_attempts_not_skipped,
        }

    @property
    def exact(self) -> bool:
        return not any(self.anomalies().values())

    def counts(self) -> dict[str, Any]:
        return {
            "input_ids": self.input_ids,
            "decided_batches": self.decided_batches,
            "orphan_files": self.orphan_files,
            "excused_ids": len(self.excused_ids),
            "excused_batches": self.excused_batches,
            "anomalies": {k: len(v) for k, v in self.anomalies().items()},
            "examples": {k: v[:20] for k, v in self.anomalies().items() if v},
        }


def oracle(bed: Bed, sink: Sink, beyond_bound: Collection[int] = ()) -> OracleReport:
    """Compare the input topic, id by id, with what read_committed consumers see: the records
    topic, and the ids inside the files the references name; check both against the log.
    Batches in `beyond_bound` were held on purpose until the broker aborted them: the records
    the sink reports lost there are expected (README: the bound), nowhere else.

    The one place to switch to `kafka-txn-sink verify` once it exists."""
    expected = [key_of(r.key) for r in read_topic(bed.bootstrap, sink.input, timeout_s=120)]
    commit_log = open_commit_log(sink.commit_log, s3_settings(bed), "json")
    decided = decisions(commit_log)
    losses = reported_losses(commit_log, decided)
    seen = read_topic(bed.bootstrap, sink.output, timeout_s=120)
    refs = [parse_reference(r.value or b"") for r in read_topic(bed.bootstrap, sink.references)]
    named = Counter(ref.location for ref in refs)
    contents = read_files(bed, sorted(named))
    file_ids = [i for location, n in named.items() for i in contents.get(location, []) * n]
    logged = {f.location for d in decided.values() for p in d.participants for f in p.files}
    excused = written_by(bed, sink, [x for b in beyond_bound for x in losses.get(b, [])])
    records = compare_ids(expected, [key_of(r.key) for r in seen])
    return OracleReport(
        input_ids=len(expected),
        records=records,
        files=compare_ids(expected, file_ids),
        excused_ids=sorted(set(records.missing) & excused),
        aborted_reads=outside_decisions(seen, decided, sink.output),
        duplicate_references=sorted(loc for loc, n in named.items() if n > 1),
        missing_files=sorted(loc for loc in named if loc not in contents),
        unreferenced_files=sorted(logged - set(named)),
        unlogged_references=sorted(set(named) - logged),
        lost_batches=sorted(b for b in losses if b not in beyond_bound),
        excused_batches=sorted(b for b in losses if b in beyond_bound),
        open_transactions=[str(t.triple) for t in open_transactions(bed.bootstrap, sink.sink_id)],
        decided_batches=len(decided),
        orphan_files=len(list_files(bed, sink) - logged),
    )


def verify_command(bed: Bed, sink: Sink) -> dict[str, Any]:
    """The product's own check, run as a user runs it: exit 0 when exact, 1 on any anomaly.

    Records lost beyond the bound on purpose (held trials) make it exit 1 as well: it reports
    every lost id; the suite's oracle is the one that excuses them."""
    command = [sys.executable, "-m", "kafka_txn_sink", "--json", "verify"]
    command += ["--bootstrap", bed.bootstrap, "--input-topic", sink.input]
    command += ["--checkpoint", str(sink.checkpoint), "--output-topic", sink.output]
    command += ["--log", sink.commit_log, "--references-topic", sink.references]
    command += ["--path", sink.files, "--s3-endpoint", bed.endpoint, "--s3-region", "us-east-1"]
    env = {**os.environ, "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing"}
    done = subprocess.run(command, capture_output=True, text=True, timeout=900, env=env)
    try:
        body = json.loads(done.stdout)
    except ValueError:
        body = {}
    found = {kind: n for kind, n in body.get("anomalies", {}).items() if n}
    return {"exit": done.returncode, "anomalies": found, "error": done.stderr[-2000:]}


def reported_losses(commit_log: CommitLog, decided: dict[int, Any]) -> dict[int, list[Any]]:
    """Per batch, the participants its completion marker reports lost."""
    found = {}
    for batch in decided:
        completion = commit_log.completion(batch)
        if completion is not None and completion.lost:
            found[batch] = list(completion.lost)
    return found


def written_by(bed: Bed, sink: Sink, lost: Sequence[Any]) -> set[str]:
    """Ids of the records the `lost` participants wrote (read_uncommitted still shows them)."""
    spans = [
        (int(partition), first, last)
        for participant in lost
        for partition, (first, last) in participant.offsets.get(sink.output, {}).items()
    ]
    if not spans:
        return set()
    records = read_topic(bed.bootstrap, sink.output, "read_uncommitted", timeout_s=120)
    return {
        key_of(r.key)
        for r in records
        if any(r.partition == p and first <= r.offset <= last for p, first, last in spans)
    }


def key_of(key: bytes | None) -> str:
    return (key or b"").decode()


def s3_settings(bed: Bed) -> S3Settings:
    return S3Settings(
        endpoint_url=bed.endpoint,
        region="us-east-1",
        access_key_id="testing",
        secret_access_key="testing",
    )


def decisions(commit_log: CommitLog) -> dict[int, Any]:
    found = {}
    for batch in commit_log.decided_batches():
        decision = commit_log.decision(batch)
        if decision is not None:
            found[batch] = decision
    return found


def outside_decisions(seen: Sequence[Any], decided: dict[int, Any], topic: str) -> list[str]:
    """Visible records that no decided participant's offsets cover: rows of an undecided batch.

    Participants of one batch write to the same partitions at once, so their offset ranges
    overlap; they are merged per partition. (A consumer does not see which transaction wrote a
    record, so a record inside a decided range is taken as decided.)"""
    spans: dict[int, list[tuple[int, int]]] = defaultdict(list)
    for decision in decided.values():
        for participant in decision.participants:
            for partition, span in participant.offsets.get(topic, {}).items():
                spans[int(partition)].append(span)
    merged = {partition: merge(found) for partition, found in spans.items()}
    return [
        f"{r.partition}:{r.offset}"
        for r in seen
        if not within(merged.get(r.partition, []), r.offset)
    ]


def merge(spans: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Inclusive ranges, sorted and without overlaps: [(1, 5), (3, 9)] -> [(1, 9)]."""
    merged: list[tuple[int, int]] = []
    for first, last in sorted(spans):
        if merged and first <= merged[-1][1] + 1:
            merged[-1] = (merged[-1][0], max(merged[-1][1], last))
        else:
            merged.append((first, last))
    return merged


def within(merged: list[tuple[int, int]], offset: int) -> bool:
    index = bisect.bisect_right(merged, (offset, sys.maxsize)) - 1
    return index >= 0 and merged[index][0] <= offset <= merged[index][1]


def read_files(bed: Bed, locations: list[str]) -> dict[str, list[str]]:
    """The ids in each Avro object (absent: the object does not exist)."""
    client = bed.s3_client()

    def read(location: str) -> tuple[str, list[str] | None]:
        parsed = urlparse(location)
        try:
            body = client.get_object(Bucket=parsed.netloc, Key=parsed.path.lstrip("/"))
        except client.exceptions.NoSuchKey:
            return location, None
        records = fastavro.reader(io.BytesIO(body["Body"].read()))
        return location, [str(r["id"]) for r in records]  # type: ignore[call-overload,index]

    with ThreadPoolExecutor(8) as pool:
        return {loc: ids for loc, ids in pool.map(read, locations) if ids is not None}


def list_files(bed: Bed, sink: Sink) -> set[str]:
    """Every Avro object under the sink's path (the schemas beside them left out)."""
    parsed = urlparse(sink.files)
    prefix = parsed.path.lstrip("/") + "/"
    pages = (
        bed.s3_client()
        .get_paginator("list_objects_v2")
        .paginate(Bucket=parsed.netloc, Prefix=prefix)
    )
    return {
        f"s3://{parsed.netloc}/{item['Key']}"
        for page in pages
        for item in page.get("Contents", [])
        if item["Key"].endswith(".avro") and "/_schemas/" not in item["Key"]
    }


# -- command line ------------------------------------------------------------------------------


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m tests.chaos.suite", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--trials", type=int, default=200)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--state", type=Path, required=True, help="state directory (resumable)")
    parser.add_argument("--slice", default="", help="A:B runs trials A..B-1 only")
    parser.add_argument(
        "--nodes", type=int, choices=(1, 3), default=1,
        help="Kafka nodes of the bed; 3 adds a coordinator kill to the schedule",
    )  # fmt: skip
    args = parser.parse_args(argv)
    if args.trials < 1:
        parser.error("--trials must be positive")
    return args


def slice_indices(text: str, trials: int) -> range:
    if not text:
        return range(trials)
    first, _, last = text.partition(":")
    start, stop = int(first or 0), min(int(last or trials), trials)
    if not 0 <= start < stop:
        raise SystemExit(f"--slice {text}: need 0 <= A < B <= {trials}")
    return range(start, stop)


def interrupt_on_sigterm() -> None:
    def handler(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, handler)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    interrupt_on_sigterm()
    console = Console(highlight=False, width=None if sys.stdout.isatty() else 140)
    indices = slice_indices(args.slice, args.trials)
    args.state.mkdir(parents=True, exist_ok=True)
    try:
        with own_bed(args.state, args.nodes) as bed:
            schedule = build_schedule(
                args.seed,
                args.trials,
                broker=bed.can_restart_broker,
                s3=bed.can_pause_s3,
                coordinator=bed.cluster is not None,
            )
            console.print(
                f"crash suite: seed {args.seed}, trials {indices.start}..{indices.stop - 1} "
                f"of {args.trials}, state {args.state}, Kafka {bed.bootstrap}, S3 {bed.endpoint}"
            )
            outcome = run_suite(bed, args.state, args.seed, schedule, indices, console)
    except KeyboardInterrupt:
        console.print(f"interrupted; finished trials are in {args.state / 'state.json'}; "
                      "run the same command again to resume")  # fmt: skip
        return 130
    print_report(outcome, console)
    return 0 if outcome.ok else 1


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
