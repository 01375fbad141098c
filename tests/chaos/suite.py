"""The randomized crash suite: one streaming query, a seeded schedule of faults, one oracle.

    .venv/bin/python -m tests.chaos.suite --trials 200 --seed 7 --state DIR [--slice A:B] \
        [--log json|delta] [--kinds inflight,kill,...]

It starts its own Kafka broker and S3 server (the test bed; or uses `KTS_KAFKA_BOOTSTRAP` /
`KTS_S3_ENDPOINT`), produces input ids, and runs ONE streaming query (examples/pipeline.py,
availableNow, same checkpoint and sink every time) that writes every row as a Kafka record and
into a partitioned Avro file on S3 with one reference message per file; the commit log is on S3
too. Each trial produces more ids, restarts the query with one fault from the schedule
(schedule.py) and checks that the fault struck. At the end of every run the query drains
without faults and the oracle compares, id by id, the input topic with what read_committed
consumers see in the records topic and in the referenced files.

Trial results are saved in DIR/state.json after each trial: a rerun with the same DIR skips the
trials done, and `--slice A:B` runs trials A..B-1 only. `--log delta` runs the sink with
commitLogFormat=delta (the oracle reads that log); `--kinds` draws only the kinds named. Exit
status 0 when every fault struck and the oracle found nothing.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import sys
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console

from kafka_txn_sink.commit_log import LOG_FORMATS, LogFormat
from kafka_txn_sink.testing import spark_jars
from tests.chaos import query
from tests.chaos.bed import Bed, Sink, load_bucket, own_bed, save_bucket
from tests.chaos.faults import STRIKES, late_anomalies, trial_spec
from tests.chaos.group import group_anomalies, group_anomaly
from tests.chaos.inflight import inflight_anomalies
from tests.chaos.oracle import OracleReport, oracle, verify_command
from tests.chaos.query import FaultNotFired, finish
from tests.chaos.report import print_report
from tests.chaos.retention import retention_anomalies
from tests.chaos.schedule import KINDS, Fault, build_schedule, failpoint_spec, filtered_schedule
from tests.chaos.state import Context, State
from tests.e2e.harness import produce_events

INITIAL_IDS = 400
USERS = 3
DRAIN_RUNS = 3  # the final drain may meet a loss the sink raises once
START_ATTEMPTS = 2  # a query may fail once after a crash (a loss is raised once): recorded


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
    group: str = ""  # the sink's consumer group (option consumerGroup)

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
    log: LogFormat = "json",
) -> Outcome:
    """Run the trials of `indices` not done yet, drain the query, and run the oracle (`log`:
    the format of the sink's commit log)."""
    console = console or Console(highlight=False)
    started = time.monotonic()
    directory.mkdir(parents=True, exist_ok=True)
    state = State.open(directory, seed, schedule, log)
    sink = Sink(state.body["name"], directory, log)
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
        report.inflight_not_as_delivered = inflight_anomalies(state.results)
        report.retention_faults_failed = retention_anomalies(state.results)
        final = group_anomaly(bed, sink, final=True)
        report.group_not_at_a_batch_end = [
            *group_anomalies(state.results), *([f"after the drain: {final}"] if final else [])
        ]
        verified = verify_command(bed, sink)
        state.body["checks"].append(
            {"at": time.time(), "drain": drained, **report.counts(), "verify": verified}
        )
        state.save()
    finally:
        stop_everything(context)
    return Outcome(
        seed, schedule, ran, state.results, drained, report, time.monotonic() - started, verified,
        sink.group,
    )  # fmt: skip


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
        with trial_spec(context, fault, batch) as spec:
            running = query.start(spec, directory, failpoint_spec(fault, batch))
            try:
                result.update(STRIKES[fault.kind](context, running, fault, batch), fired=True)
                result.pop("error", None)  # of a first start that failed (in failed_starts)
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
    result["group"] = checked_group(context)
    result["seconds"] = round(time.monotonic() - started, 1)
    return result


def checked_group(context: Context) -> str:
    """Why the group is not where the log says after this trial (group.py), or "ok"."""
    try:
        return group_anomaly(context.bed, context.sink) or "ok"
    except Exception as exc:  # the check itself failed: reported, as an anomaly
        return f"the check failed: {exc!r}"[:600]


def held_batches(results: Iterable[dict[str, Any]]) -> set[int]:
    """Batches a trial held until the broker aborted them: beyond the bound on purpose."""
    return {int(r["batch"]) for r in results if "held_until_aborted_s" in r}


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
    parser.add_argument(
        "--log", choices=LOG_FORMATS, default="json",
        help="the sink's commitLogFormat (default json); the oracle reads the log in it",
    )  # fmt: skip
    parser.add_argument(
        "--kinds", default="",
        help=f"comma-separated fault kinds: only these are drawn ({', '.join(KINDS)})",
    )  # fmt: skip
    args = parser.parse_args(argv)
    if args.trials < 1:
        parser.error("--trials must be positive")
    args.kinds = tuple(k.strip() for k in args.kinds.split(",") if k.strip())
    if set(args.kinds) - set(KINDS):
        parser.error(f"--kinds: unknown {sorted(set(args.kinds) - set(KINDS))}")
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


def schedule_for(args: argparse.Namespace, bed: Bed) -> list[Fault]:
    """The run's faults: every kind the bed allows, or only `--kinds`."""
    available = {"broker": bed.can_restart_broker, "s3": bed.can_pause_s3,
                 "coordinator": bed.cluster is not None}  # fmt: skip
    if not args.kinds:
        return build_schedule(
            args.seed, args.trials, broker=available["broker"], s3=available["s3"],
            coordinator=available["coordinator"], log=args.log,
        )  # fmt: skip
    missing = [kind for kind in args.kinds if not available.get(kind, True)]
    if missing:
        raise SystemExit(f"--kinds {','.join(missing)}: this bed cannot inject them (an "
                         "external broker or S3 server, or --nodes 1 for coordinator)")  # fmt: skip
    return filtered_schedule(args.seed, args.trials, args.kinds, args.log)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    interrupt_on_sigterm()
    console = Console(highlight=False, width=None if sys.stdout.isatty() else 140)
    indices = slice_indices(args.slice, args.trials)
    args.state.mkdir(parents=True, exist_ok=True)
    try:
        with own_bed(args.state, args.nodes) as bed:
            schedule = schedule_for(args, bed)
            console.print(
                f"crash suite: seed {args.seed}, trials {indices.start}..{indices.stop - 1} "
                f"of {args.trials}, {args.log} log, state {args.state}, Kafka {bed.bootstrap}, "
                f"S3 {bed.endpoint}" + (f", kinds {','.join(args.kinds)}" if args.kinds else "")
            )
            outcome = run_suite(bed, args.state, args.seed, schedule, indices, console, args.log)
    except KeyboardInterrupt:
        console.print(f"interrupted; finished trials are in {args.state / 'state.json'}; "
                      "run the same command again to resume")  # fmt: skip
        return 130
    print_report(outcome, console)
    return 0 if outcome.ok else 1


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
