"""A real query over a topic of many partitions on the 3-node test bed: a batch of 1,024 tasks.

    .venv/bin/python benchmarks/wide_query.py                          # 1,024 partitions
    .venv/bin/python benchmarks/wide_query.py --partitions 256 --rows 25600 --batches 2
    .venv/bin/python benchmarks/wide_query.py --batches 2 --commit-timeout-ms 120000 \
        --transaction-timeout-ms 3600000     # for a machine where a batch takes many minutes

Starts a 3-node cluster (every topic replicated to all three, as the test bed's cluster does; 50
transaction-state partitions, Kafka's default, so the transactions spread over the three
coordinators), writes `--rows` rows round-robin into an input topic of `--partitions` partitions,
and runs one kafka_txn records query over it (availableNow, `--batches` batches, each touching
every partition, so each batch has one task per partition and as many participants) into an output
topic of the same width. Prints, per batch, rows and Spark's `triggerExecution`; the sink's driver
phases from its failpoints (each set to `signal`); the peak memory of Spark's Python commit worker,
where the sink's driver side runs; the transactional ids the brokers hold for the sink afterwards,
by state; and what a read_committed consumer sees of the output (every row once, or the run fails).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter
from pathlib import Path

from commit_overhead import ids_held
from confluent_kafka import Producer
from latency import PHASE_POINTS, phases

from kafka_txn_sink import failpoints, testing
from kafka_txn_sink.testing.kafka_cluster import KafkaCluster
from kafka_txn_sink.testing.topics import read_topic

BENCHMARKS = Path(__file__).resolve().parent
COMMIT_WORKER = "python_streaming_sink_runner"  # the Python process of the sink's commit()


def fill(bootstrap: str, topic: str, partitions: int, rows: int) -> None:
    """`rows` rows of about 100 bytes, round-robin over the partitions, keyed by their number."""
    # Idempotent: on a loaded cluster requests time out and are sent again, and without it
    # those retries write rows twice into the input itself.
    producer = Producer(
        {"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 20, "enable.idempotence": True}
    )
    for row in range(rows):
        value = json.dumps({"row": row, "pad": "x" * 80}).encode()
        while True:
            try:
                producer.produce(topic, value, str(row).encode(), partition=row % partitions)
                break
            except BufferError:
                producer.poll(0.1)
    if producer.flush(120):
        raise RuntimeError("the input was not written in 120 s")


class PeakMemory:
    """The largest peak RSS (VmHWM) of the commit worker processes, sampled until stopped."""

    def __init__(self) -> None:
        self.peak_kb = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def __enter__(self) -> PeakMemory:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join()

    def _sample(self) -> None:
        while not self._stop.wait(0.5):
            for pid in os.listdir("/proc"):
                if pid.isdigit():
                    self.peak_kb = max(self.peak_kb, _hwm_kb(pid))


def _hwm_kb(pid: str) -> int:
    try:
        if COMMIT_WORKER not in Path(f"/proc/{pid}/cmdline").read_text():
            return 0
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def run_query(
    options: argparse.Namespace, bootstrap: str, work: Path, input_topic: str, output: str
) -> tuple[list[list[int]], str]:
    """The query in its own Spark application; its batches and its sink id."""
    python = str(Path(options.python).absolute())
    newest = python != str(Path(sys.executable).absolute())
    env = testing.spark_newest_package_env() if newest else {}
    sink_id = f"wide_{uuid.uuid4().hex[:8]}"
    query = {
        "name": "wide",
        "bootstrap": bootstrap,
        "input": input_topic,
        "per_batch": -(-options.rows // options.batches),
        "variant": "100b",
        "shape": "kafka",
        "format": "kafka_txn",
        "checkpoint": str(work / "checkpoint"),
        "options": {
            "kafka.bootstrap.servers": bootstrap,
            "topic": output,
            "sinkId": sink_id,
            "commitLog": str(work / "log"),
            "commitTimeoutMs": str(options.commit_timeout_ms),
            **(
                {"transactionTimeoutMs": str(options.transaction_timeout_ms)}
                if options.transaction_timeout_ms
                else {}
            ),
        },
        "timeout_s": options.timeout,
    }
    signals = work / "signals"
    signals.mkdir()
    full_env = {
        **os.environ,
        **env,
        **failpoints.environment(";".join(f"{p}=signal" for p in PHASE_POINTS), signals),
        "PYSPARK_PYTHON": python,
        "SPARK_LOCAL_IP": "127.0.0.1",
        "PYTHONPATH": str(BENCHMARKS),
    }
    jars = ",".join(testing.spark_jars_of(python, env))
    done = subprocess.run(
        [python, str(BENCHMARKS / "bench_job.py"), json.dumps({"jars": jars, "queries": [query]})],
        capture_output=True,
        text=True,
        env=full_env,
        timeout=options.timeout + 600,
        check=False,
    )
    found = [json.loads(x) for x in done.stdout.splitlines() if x.startswith("{")]
    if done.returncode != 0 or not found:
        first = max(0, done.stderr.find("Exception") - 500)  # the cause, not the plan after it
        raise RuntimeError(f"the query failed:\n{done.stderr[first : first + 6000]}")
    print(f"phases (mean ms a batch): {json.dumps(phases(signals))}")
    return found[0]["batches"], sink_id


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--python", default=sys.executable, help="the Spark line's interpreter")
    parser.add_argument("--partitions", type=int, default=1024)
    parser.add_argument("--rows", type=int, default=102_400)
    parser.add_argument("--batches", type=int, default=3)
    parser.add_argument("--timeout", type=int, default=1800, help="the query's, in seconds")
    parser.add_argument(
        "--commit-timeout-ms", type=int, default=30_000, help="the sink's commitTimeoutMs"
    )
    parser.add_argument(
        "--transaction-timeout-ms", type=int, default=0,
        help="the sink's transactionTimeoutMs and the brokers' transaction.max.timeout.ms "
        "(0: the brokers' default, 900 s)",
    )
    options = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="kts-wide-") as tmp:
        work = Path(tmp)
        extra = (
            {"transaction.max.timeout.ms": options.transaction_timeout_ms}
            if options.transaction_timeout_ms
            else {}
        )
        cluster = KafkaCluster(
            work / "kafka", nodes=3, transaction_state_partitions=50, extra_config=extra
        )
        bootstrap = cluster.start()
        try:
            name = uuid.uuid4().hex[:6]
            input_topic, output = f"wide_in_{name}", f"wide_out_{name}"
            for topic in (input_topic, output):
                cluster.create_topic(topic, options.partitions, timeout=300)
            fill(bootstrap, input_topic, options.partitions, options.rows)
            started = time.monotonic()
            with PeakMemory() as memory:
                batches, sink_id = run_query(options, bootstrap, work, input_topic, output)
            elapsed = time.monotonic() - started
            seen = [r.value for r in read_topic(bootstrap, output, timeout_s=300)]
            given = [r.value for r in read_topic(bootstrap, input_topic, timeout_s=300)]
            held = ids_held(bootstrap, sink_id)
        finally:
            cluster.stop()
    print(f"{options.partitions:,} partitions, 3 nodes, {options.rows:,} rows, {elapsed:.0f} s")
    print(f"batches [rows, triggerExecution ms]: {batches}")
    print(f"triggerExecution median: {statistics.median(b[1] for b in batches):,.0f} ms")
    print(f"commit worker peak RSS: {memory.peak_kb / 1024:,.0f} MiB")
    print(f"transactional ids held for the sink, by state: {held}")
    print(f"input: {len(given):,} records, {len(set(given)):,} distinct")
    print(f"read_committed: {len(seen):,} records, {len(set(seen)):,} distinct")
    if Counter(seen) != Counter(given) or len(set(seen)) != options.rows:
        print("NOT every row exactly once", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
