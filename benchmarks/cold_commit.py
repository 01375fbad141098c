"""The driver's per-batch work in a cold commit worker, this tree against another, side by side.

    .venv/bin/python benchmarks/cold_commit.py --baseline a28474e            # 8 tasks, 10 rounds
    .venv/bin/python benchmarks/cold_commit.py --baseline a28474e --tasks 32 --rounds 20
    .venv/bin/python benchmarks/cold_commit.py --baseline a28474e --s3   # the log on S3 (moto)

PySpark runs a batch's `commit()` in a Python worker forked from its daemon, which keeps it
only while it is used within its idle timeout (a minute): a query whose trigger is longer
starts every commit in a worker that has imported only PySpark. Per round, for each tree in
turn (the order alternates), this prepares a batch's task transactions as tasks leave them
(`commit_overhead.prepare_tasks`, with the planner's run in their messages as tasks put it),
runs the planner's `streamWriter()` in this process, and then starts a new interpreter that
imports what the daemon's child has (`pyspark.worker`, the commit runner) and times what
Spark's commit runner does, in its order, from inside a function of the runner's module name
(as `commit_worker.building_for_commit` finds it): unpickle the data source (its imports),
`streamWriter()`, unpickle the messages, `commit()`. The trees share one sink, one broker and
one driver identity (Spark's block manager directory), and a local JSON commit log or, with
`--s3`, one on the test bed's S3 server (KTS_S3_ENDPOINT, else a moto server of its own on
loopback: every log read is then an HTTP request, as on S3); `--baseline REF` is checked out with
`git worktree` in a temporary directory and run with PYTHONPATH. Prints the p50 of each step
and of the whole per tree, and their ratio.
"""

from __future__ import annotations

import argparse
import json
import os
import pickle
import statistics
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

from pyspark import cloudpickle

from benchmarks.commit_overhead import SCHEMA, TXN_TIMEOUT_MS, new_topic, prepare_tasks
from kafka_txn_sink import testing
from kafka_txn_sink.datasource import KafkaTxnDataSource
from kafka_txn_sink.protocol.runs import SPARK_DIRS_ENV
from kafka_txn_sink.testing import s3_server

STEPS = ("imports", "streamWriter", "messages", "commit")
ROOT = Path(__file__).resolve().parent.parent

# Runs in the new interpreter: argv[1] the pickled data source, argv[2] the pickled messages,
# argv[3] the batch id, argv[4] the schema's JSON. Prints the steps' ms as JSON.
CHILD = """
import json, pickle, sys, time
import pyspark.worker
import pyspark.sql.worker.python_streaming_sink_runner
from pyspark import cloudpickle
from pyspark.sql.types import _parse_datatype_json_string

RUNNER = '''
def run(source, messages, batch_id, schema):
    times = [time.perf_counter()]
    data_source = cloudpickle.loads(source)
    times.append(time.perf_counter())
    writer = data_source.streamWriter(schema, False)
    times.append(time.perf_counter())
    loaded = pickle.loads(messages)
    times.append(time.perf_counter())
    writer.commit(loaded, batch_id)
    times.append(time.perf_counter())
    return [1000 * (b - a) for a, b in zip(times, times[1:])]
'''
space = {"__name__": "pyspark.sql.worker.python_streaming_sink_runner", "time": time,
         "pickle": pickle, "cloudpickle": cloudpickle}
exec(RUNNER, space)
source, messages = open(sys.argv[1], "rb").read(), open(sys.argv[2], "rb").read()
schema = _parse_datatype_json_string(sys.argv[4])
steps = space["run"](source, messages, int(sys.argv[3]), schema)
print(json.dumps({"steps": steps, "origin": sys.modules["kafka_txn_sink"].__file__}))
"""


def cold_commit(
    tree: Path, work: Path, source: bytes, messages: list[Any], batch_id: int
) -> list[float]:
    """The steps' ms of one batch's commit in a new interpreter that imports `tree`'s sink."""
    (work / "source.pkl").write_bytes(source)
    (work / "messages.pkl").write_bytes(pickle.dumps(messages))
    env = {**os.environ, "PYTHONPATH": str(tree)}
    args = [str(work / "source.pkl"), str(work / "messages.pkl"), str(batch_id), SCHEMA.json()]
    done = subprocess.run(
        [sys.executable, "-c", CHILD, *args],
        cwd=work,  # not this repository's root, which `-c` would put before PYTHONPATH
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    if done.returncode != 0:
        raise RuntimeError(f"the commit worker of {tree} failed:\n{done.stderr[-3000:]}")
    found = json.loads(done.stdout.strip().splitlines()[-1])
    if not found["origin"].startswith(str(tree)):
        raise RuntimeError(f"the commit worker of {tree} imported the sink from {found['origin']}")
    return [float(x) for x in found["steps"]]


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


def measure(
    bootstrap: str, work: Path, trees: dict[str, Path], tasks: int, rounds: int, s3: str | None
) -> dict[str, list[list[float]]]:
    """Per tree, the steps' ms of each round (`s3`: the S3 endpoint of the log, or None)."""
    topic = f"cold_commit_{uuid.uuid4().hex[:8]}"
    new_topic(bootstrap, None, topic, 8)
    options = {
        "kafka.bootstrap.servers": bootstrap,
        "topic": topic,
        "sinkId": f"cold_commit_{uuid.uuid4().hex[:8]}",
        "commitLog": str(work / "log"),
        "transactionTimeoutMs": str(TXN_TIMEOUT_MS),
    }
    if s3 is not None:
        bucket = s3_server.create_bucket(s3)
        options.update(s3_server.sink_s3_options(s3), commitLog=f"s3://{bucket}/log")
    source = KafkaTxnDataSource(options)
    pickled = cloudpickle.dumps(source)
    times: dict[str, list[list[float]]] = {name: [] for name in trees}
    batch_id = 0
    with ThreadPoolExecutor(max_workers=8) as pool:
        for round_ in range(rounds + 1):  # round 0 warms the broker and the page cache
            names = list(trees) if round_ % 2 == 0 else list(reversed(trees))
            for name in names:
                plan = source.streamWriter(SCHEMA, False).plan  # type: ignore[attr-defined]
                prepared = prepare_tasks(
                    bootstrap, topic, options["sinkId"], plan.run.slot, batch_id, tasks, pool
                )
                messages = [
                    replace(m, run=plan.run, transaction_timeout_ms=TXN_TIMEOUT_MS)
                    for m in prepared
                ]
                steps = cold_commit(trees[name], work, pickled, messages, batch_id)
                if round_:
                    times[name].append(steps)
                batch_id += 1
    return times


def report(times: dict[str, list[list[float]]], tasks: int, log: str) -> str:
    """p50 per step and of the whole, per tree, and each tree's whole against the first's."""
    lines = [f"cold commit worker, {tasks} tasks, commit log {log}, p50 ms over "
             f"{len(next(iter(times.values())))} rounds each"]  # fmt: skip
    lines.append(f"{'tree':<12}" + "".join(f"{s:>14}" for s in (*STEPS, "whole", "ratio")))
    first = None
    for name, rounds in times.items():
        steps = [statistics.median(r[i] for r in rounds) for i in range(len(STEPS))]
        whole = statistics.median(sum(r) for r in rounds)
        first = first or whole
        cells = "".join(f"{v:>14.1f}" for v in (*steps, whole))
        lines.append(f"{name:<12}{cells}{whole / first:>14.2f}")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline", required=True, help="a git ref to compare this tree with")
    parser.add_argument("--tasks", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--s3", action="store_true", help="the commit log on S3 (moto)")
    args = parser.parse_args()
    # One driver for the planner here and every commit worker (protocol/runs.py).
    os.environ[SPARK_DIRS_ENV] = f"/tmp/blockmgr-{uuid.uuid4()}"
    with (
        tempfile.TemporaryDirectory() as tmp,
        worktree(args.baseline) as baseline,
        testing.kafka_bootstrap(Path(tmp)) as bootstrap,
        s3_endpoint(Path(tmp), args.s3) as s3,
    ):
        trees = {"baseline": baseline, "this tree": ROOT}
        times = measure(bootstrap, Path(tmp), trees, args.tasks, args.rounds, s3)
    print(report(times, args.tasks, "S3 (moto)" if s3 else "local JSON"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
