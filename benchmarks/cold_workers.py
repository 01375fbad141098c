"""The driver's work for a batch in cold Python workers, this tree against another, side by side.

    .venv/bin/python benchmarks/cold_workers.py --baseline a28474e            # 8 tasks, 10 rounds
    .venv/bin/python benchmarks/cold_workers.py --baseline a28474e --tasks 32 --rounds 20
    .venv/bin/python benchmarks/cold_workers.py --baseline a28474e --s3   # the log on S3 (moto)
    .venv/bin/python benchmarks/cold_workers.py --baseline HEAD --rounds 2 --profile /tmp/cold

PySpark runs a batch's planner `streamWriter()` and its `commit()` in Python workers forked
from daemons that have imported only PySpark, and keeps a worker only while it is used within
its idle timeout (a minute): a query whose trigger is longer starts both in new processes every
batch. Per round, for each tree in turn (the order alternates), this starts a new interpreter
as Spark's planner worker (`pyspark.sql.worker.write_into_data_source` imported) and times
unpickling the data source (its imports), `streamWriter()` and pickling the writer; then
prepares the batch's task transactions as tasks leave them (`commit_overhead.prepare_tasks`,
with the planner's run in their messages as tasks put it), and starts a new interpreter as the
commit worker, timing what Spark's commit runner does, in its order, from inside a function of
the runner's module name (as `commit_worker.building_for_commit` finds it): unpickle the data
source, `streamWriter()`, unpickle the messages, `commit()`. The trees share one sink, one
broker, one driver identity (Spark's block manager directory), and a local JSON commit log or,
with `--s3`, one on the test bed's S3 server (KTS_S3_ENDPOINT, else a moto server of its own on
loopback: every log read is then an HTTP request, as on S3). `--baseline REF` is checked out
with `git worktree` in a temporary directory; each worker imports its tree by PYTHONPATH, both
trees byte-compiled first, as pip compiles a wheel it installs.
Prints the p50 of each step, of each worker and of both per tree, and their ratio. With
`--profile DIR`, each worker's `streamWriter()` (planner) or `commit()` (commit worker) runs
under cProfile and its statistics go to DIR (`python -m pstats DIR/this_tree-commit-1.prof`).
"""

from __future__ import annotations

import argparse
import compileall
import json
import os
import pickle
import statistics
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

from pyspark import cloudpickle

from benchmarks.commit_overhead import SCHEMA, TXN_TIMEOUT_MS, new_topic, prepare_tasks
from kafka_txn_sink import testing
from kafka_txn_sink.datasource import KafkaTxnDataSource
from kafka_txn_sink.protocol.runs import SPARK_DIRS_ENV, RunRef
from kafka_txn_sink.testing import s3_server

PLANNER_STEPS = ("imports", "streamWriter", "pickle")
COMMIT_STEPS = ("imports", "streamWriter", "messages", "commit")
ROOT = Path(__file__).resolve().parent.parent

# Runs in the new interpreter, as the planner's worker (argv: "planner", the pickled data
# source's path, the schema's JSON) or the commit worker (argv: "commit", the same two, the
# pickled messages' path, the batch id). Prints the steps' ms, where the sink was imported from
# and the planner's run as JSON.
CHILD = '''
import json, os, pickle, sys, time
import pyspark.worker
import pyspark.sql.worker.python_streaming_sink_runner
import pyspark.sql.worker.write_into_data_source
from pyspark import cloudpickle
from pyspark.sql.types import _parse_datatype_json_string


def profiled(step, *args):
    """step(*args), under cProfile into COLD_WORKERS_PROFILE's path when the parent sets it."""
    path = os.environ.get("COLD_WORKERS_PROFILE")
    if not path:
        return step(*args)
    import cProfile
    profile = cProfile.Profile()
    try:
        return profile.runcall(step, *args)
    finally:
        profile.dump_stats(path)


def planner(source, schema):
    times = [time.perf_counter()]
    data_source = cloudpickle.loads(source)
    times.append(time.perf_counter())
    writer = profiled(data_source.streamWriter, schema, False)
    times.append(time.perf_counter())
    cloudpickle.dumps(writer)
    times.append(time.perf_counter())
    return times, {"run": writer.plan.run.run, "slot": writer.plan.run.slot}


RUNNER = """
def commit(source, schema, messages, batch_id):
    times = [time.perf_counter()]
    data_source = cloudpickle.loads(source)
    times.append(time.perf_counter())
    writer = data_source.streamWriter(schema, False)
    times.append(time.perf_counter())
    loaded = pickle.loads(messages)
    times.append(time.perf_counter())
    profiled(writer.commit, loaded, batch_id)
    times.append(time.perf_counter())
    return times, {}
"""
space = {"__name__": "pyspark.sql.worker.python_streaming_sink_runner", "time": time,
         "pickle": pickle, "cloudpickle": cloudpickle, "profiled": profiled}
exec(RUNNER, space)
source, schema = open(sys.argv[2], "rb").read(), _parse_datatype_json_string(sys.argv[3])
if sys.argv[1] == "planner":
    times, found = planner(source, schema)
else:
    messages = open(sys.argv[4], "rb").read()
    times, found = space["commit"](source, schema, messages, int(sys.argv[5]))
found["steps"] = [1000 * (b - a) for a, b in zip(times, times[1:])]
found["origin"] = sys.modules["kafka_txn_sink"].__file__
print(json.dumps(found))
'''


def cold_worker(
    tree: Path, work: Path, args: list[str], profile: Path | None = None
) -> dict[str, Any]:
    """What a new interpreter importing `tree`'s sink printed for CHILD's `args`; with
    `profile`, the cProfile statistics of its `streamWriter()` or `commit()` saved there."""
    env = {**os.environ, "PYTHONPATH": str(tree)}
    if profile is not None:
        env["COLD_WORKERS_PROFILE"] = str(profile)
    done = subprocess.run(
        [sys.executable, "-c", CHILD, *args],
        cwd=work,  # not this repository's root, which `-c` would put before PYTHONPATH
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    if done.returncode != 0:
        raise RuntimeError(f"the {args[0]} worker of {tree} failed:\n{done.stderr[-3000:]}")
    found: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    if not str(found["origin"]).startswith(str(tree)):
        raise RuntimeError(f"the worker of {tree} imported the sink from {found['origin']}")
    return found


@contextmanager
def s3_endpoint(work: Path, wanted: bool) -> Iterator[str | None]:
    """The S3 endpoint of the log: the test bed's, else a moto server of its own; None unless
    `wanted`."""
    if not wanted or os.environ.get("KTS_S3_ENDPOINT"):
        yield os.environ.get("KTS_S3_ENDPOINT") if wanted else None
        return
    server = s3_server.S3Server(work / "moto")
    server.start()
    try:
        yield server.endpoint
    finally:
        server.stop()


@contextmanager
def worktree(ref: str) -> Iterator[Path]:
    """`ref` checked out in a temporary directory."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "baseline"
        subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "-f", "--detach", str(path),
                        ref], check=True, capture_output=True)  # fmt: skip
        try:
            yield path
        finally:
            subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(path)],
                           check=False, capture_output=True)  # fmt: skip


def byte_compiled(tree: Path) -> None:
    """The tree's package compiled to bytecode, as pip compiles a wheel it installs: a user's
    workers read `.pyc` files, where an uncompiled tree (or PYTHONDONTWRITEBYTECODE) would make
    every new worker compile the sink's sources again."""
    if not compileall.compile_dir(tree / "kafka_txn_sink", quiet=1):
        raise SystemExit(f"could not byte-compile {tree / 'kafka_txn_sink'}")


def sink_options(bootstrap: str, work: Path, s3: str | None) -> dict[str, str]:
    """A new sink on a new topic; its log on S3 at endpoint `s3`, or local."""
    topic = f"cold_workers_{uuid.uuid4().hex[:8]}"
    new_topic(bootstrap, None, topic, 8)
    options = {
        "kafka.bootstrap.servers": bootstrap,
        "topic": topic,
        "sinkId": f"cold_workers_{uuid.uuid4().hex[:8]}",
        "commitLog": str(work / "log"),
        "transactionTimeoutMs": str(TXN_TIMEOUT_MS),
    }
    if s3 is not None:
        bucket = s3_server.create_bucket(s3)
        options.update(s3_server.sink_s3_options(s3), commitLog=f"s3://{bucket}/log")
    return options


def profile_path(profiles: Path | None, tree: str, worker: str, round_: int) -> Path | None:
    """Where a worker's cProfile statistics go (`<tree>-<worker>-<round>.prof`), if anywhere."""
    if profiles is None:
        return None
    return profiles / f"{tree.replace(' ', '_')}-{worker}-{round_}.prof"


def measure(
    bootstrap: str,
    work: Path,
    trees: dict[str, Path],
    tasks: int,
    rounds: int,
    s3: str | None,
    profiles: Path | None = None,
) -> dict[str, list[list[float]]]:
    """Per tree, the planner's and the commit worker's steps (ms) of each round; with
    `profiles`, each worker's cProfile statistics there (`<tree>-<worker>-<round>.prof`)."""
    options = sink_options(bootstrap, work, s3)
    (work / "source.pkl").write_bytes(cloudpickle.dumps(KafkaTxnDataSource(options)))
    source, schema = str(work / "source.pkl"), SCHEMA.json()
    times: dict[str, list[list[float]]] = {name: [] for name in trees}
    batch_id = 0
    with ThreadPoolExecutor(max_workers=8) as pool:
        for round_ in range(rounds + 1):  # round 0 warms the broker and the page cache
            names = list(trees) if round_ % 2 == 0 else list(reversed(trees))
            for name in names:
                planned = cold_worker(
                    trees[name],
                    work,
                    ["planner", source, schema],
                    profile_path(profiles, name, "planner", round_),
                )
                run = RunRef(planned["run"], planned["slot"])
                prepared = prepare_tasks(
                    bootstrap, options["topic"], options["sinkId"], run.slot, batch_id, tasks, pool
                )
                messages = [
                    replace(m, run=run, transaction_timeout_ms=TXN_TIMEOUT_MS) for m in prepared
                ]
                (work / "messages.pkl").write_bytes(pickle.dumps(messages))
                args = ["commit", source, schema, str(work / "messages.pkl"), str(batch_id)]
                profile = profile_path(profiles, name, "commit", round_)
                committed = cold_worker(trees[name], work, args, profile)
                if round_:
                    times[name].append(planned["steps"] + committed["steps"])
                batch_id += 1
    return times


def report(times: dict[str, list[list[float]]], tasks: int, log: str) -> str:
    """A markdown table: p50 of each step, each worker and both, per tree; the ratio of both
    to the first tree's."""
    rounds = len(next(iter(times.values())))
    planner = len(PLANNER_STEPS)
    parts: dict[str, Callable[[list[float]], float]] = {}
    for index, step in enumerate((*PLANNER_STEPS, *COMMIT_STEPS)):
        worker = "planner" if index < planner else "commit worker"
        parts[f"{worker}: {step}"] = lambda r, i=index: r[i]  # type: ignore[misc]
    parts["planner worker"] = lambda r: sum(r[:planner])
    parts["commit worker"] = lambda r: sum(r[planner:])
    parts["the batch's driver work"] = sum
    lines = [
        f"cold planner and commit workers, {tasks} tasks, commit log {log}, p50 ms of {rounds} "
        f"rounds each",
        "",
        "| step | " + " | ".join(times) + " |",
        "|---|" + "---:|" * len(times),
    ]
    for label, part in parts.items():
        cells = [statistics.median(part(r) for r in runs) for runs in times.values()]
        lines.append(f"| {label} | " + " | ".join(f"{c:.1f}" for c in cells) + " |")
    wholes = [statistics.median(sum(r) for r in runs) for runs in times.values()]
    ratios = " | ".join(f"{w / wholes[0]:.2f}" for w in wholes)
    lines.append(f"| ratio of the batch's driver work to the first | {ratios} |")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline", required=True, help="a git ref to compare this tree with")
    parser.add_argument("--tasks", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--s3", action="store_true", help="the commit log on S3 (moto)")
    parser.add_argument(
        "--profile",
        type=Path,
        help="a directory for each worker's cProfile statistics (its steps then take longer)",
    )
    args = parser.parse_args()
    if args.profile:
        args.profile.mkdir(parents=True, exist_ok=True)
    # One driver for every planner and commit worker (protocol/runs.py).
    os.environ[SPARK_DIRS_ENV] = f"/tmp/blockmgr-{uuid.uuid4()}"
    with (
        tempfile.TemporaryDirectory() as tmp,
        worktree(args.baseline) as baseline,
        testing.kafka_bootstrap(Path(tmp)) as bootstrap,
        s3_endpoint(Path(tmp), args.s3) as s3,
    ):
        trees = {"baseline": baseline, "this tree": ROOT}
        for tree in trees.values():
            byte_compiled(tree)
        times = measure(bootstrap, Path(tmp), trees, args.tasks, args.rounds, s3, args.profile)
    print(report(times, args.tasks, "S3 (moto)" if s3 else "local JSON"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
