"""Wall time and peak memory of `kafka-txn-sink verify` over N ids.

    .venv/bin/python benchmarks/verify_scale.py --ids 1000000
    .venv/bin/python benchmarks/verify_scale.py --ids 10000000

Preloads an input topic and an output topic with the same N ids (32-character hex keys, one-byte
values, a raw batching producer), except that the output misses one id and has another twice:
the verifier must report exactly that (exit 1, one lost, one duplicated). Then it runs
`python -m kafka_txn_sink --json verify` as a subprocess and prints its wall time and its own
peak resident memory (ru_maxrss from wait4). Runs on a broker of its own (loopback, removed at
the end) unless KTS_KAFKA_BOOTSTRAP names one.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from confluent_kafka import Producer

from kafka_txn_sink import testing
from tests.e2e.harness import create_topics

ROOT = Path(__file__).resolve().parents[1]

PRODUCER_SETTINGS = {
    "linger.ms": 50,
    "batch.size": 1_000_000,
    "batch.num.messages": 100_000,
    "compression.type": "lz4",
    "queue.buffering.max.messages": 1_000_000,
    "acks": "1",
}
VERIFY_TIMEOUT_S = 3600


def ident(n: int) -> bytes:
    return f"{n:032x}".encode()


def preload(bootstrap: str, topic: str, ids: range, lose: int | None, double: int | None) -> float:
    """Produce every id of `ids` as a key (but `lose`; `double` twice); returns seconds."""
    producer = Producer({"bootstrap.servers": bootstrap, **PRODUCER_SETTINGS})
    started = time.perf_counter()
    for n in ids:
        if n == lose:
            continue
        for _ in range(2 if n == double else 1):
            while True:
                try:
                    producer.produce(topic, key=ident(n), value=b"v")
                    break
                except BufferError:
                    producer.poll(0.05)
        if n % 100_000 == 0:
            producer.poll(0)
    if producer.flush(600) != 0:
        raise RuntimeError(f"{topic}: not every record was delivered")
    return time.perf_counter() - started


def run_verify(bootstrap: str, source: str, sink: str, work: Path) -> dict[str, Any]:
    """One verify run as a child process: its exit code, wall time, peak RSS and report."""
    out_path = work / f"verify-{uuid.uuid4().hex[:6]}.json"
    command = [sys.executable, "-m", "kafka_txn_sink", "--json", "verify", "--bootstrap"]
    command += [bootstrap, "--input-topic", source, "--output-topic", sink]
    started = time.perf_counter()
    with open(out_path, "w") as out, open(work / "verify.err", "w") as err:
        child = subprocess.Popen(command, stdout=out, stderr=err, cwd=ROOT)
        deadline = time.monotonic() + VERIFY_TIMEOUT_S
        while True:
            pid, status, usage = os.wait4(child.pid, os.WNOHANG)
            if pid:
                break
            if time.monotonic() > deadline:
                child.kill()
                raise RuntimeError(f"verify did not finish in {VERIFY_TIMEOUT_S} s")
            time.sleep(0.2)
    wall = time.perf_counter() - started
    child.returncode = os.waitstatus_to_exitcode(status)
    report = json.loads(out_path.read_text()) if out_path.stat().st_size else {}
    return {
        "exit": child.returncode,
        "wall_s": wall,
        "max_rss_mib": usage.ru_maxrss / 1024,  # Linux: KiB
        "report": report,
        "stderr": (work / "verify.err").read_text()[-2000:],
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ids", type=int, default=1_000_000)
    parser.add_argument("--partitions", type=int, default=3)
    parser.add_argument("--runs", type=int, default=1, help="verify runs after one preload")
    options = parser.parse_args()
    if options.ids < 10 or not 1 <= options.runs <= 10:
        parser.error("--ids must be at least 10 and --runs between 1 and 10")
    with (
        tempfile.TemporaryDirectory(prefix="verify-scale-") as work,
        testing.kafka_bootstrap(Path(work)) as bootstrap,
    ):
        return bench(bootstrap, Path(work), options.ids, options.partitions, options.runs)


def bench(bootstrap: str, work: Path, count: int, partitions: int, runs: int) -> int:
    name = uuid.uuid4().hex[:8]
    source, sink = f"verify_in_{name}", f"verify_out_{name}"
    create_topics(bootstrap, partitions, source, sink)
    lose, double = 3, 7
    load_in = preload(bootstrap, source, range(count), None, None)
    load_out = preload(bootstrap, sink, range(count), lose, double)
    print(
        f"preloaded {count:,} ids x 2 topics ({partitions} partitions) in "
        f"{load_in:.0f} s + {load_out:.0f} s"
    )
    failures = 0
    for _ in range(runs):
        found = run_verify(bootstrap, source, sink, work)
        records = found["report"].get("records") or {}
        right = (
            found["exit"] == 1
            and records.get("lost") == [ident(lose).decode()]
            and records.get("duplicated") == {ident(double).decode(): 2}
            and records.get("unexpected") == []
        )
        failures += not right
        rate = 2 * count / found["wall_s"]
        print(
            f"verify {count:,} ids: {found['wall_s']:.1f} s wall ({rate:,.0f} records/s read), "
            f"peak RSS {found['max_rss_mib']:,.0f} MiB, exit {found['exit']}, "
            f"report {'as planted (1 lost, 1 duplicated)' if right else 'WRONG'}"
        )
        if not right:
            print(found["stderr"], file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
