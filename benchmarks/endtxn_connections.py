"""EndTxn for many transactions over one connection or several, on one broker or a cluster.

    .venv/bin/python benchmarks/endtxn_connections.py --tasks 1024 --rounds 3 --connections 1 4 8
    .venv/bin/python benchmarks/endtxn_connections.py --nodes 3     # 3 coordinators, replicated

A broker handles one request of a connection at a time (it mutes the connection until the
answer is out), so the EndTxns the driver pipelines on its one connection to a coordinator are
served one after another. Per round, `--tasks` transactions are prepared as tasks prepare them
(one record each), then committed with `TxnAdmin.end_transactions` split over N clients (each
its own connection, in threads); rounds alternate the values of N. Prints the EndTxn time's
median per N and its ratio to one connection. Each round's ids are new, so it measures their
coordinator look-ups too; a sink's commit reuses its ids, and there more clients in threads
gained nothing (docs/performance.md).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from commit_overhead import brokers, new_topic, prepare_tasks

from kafka_txn_sink.kafka.txn_admin import TxnAdmin
from kafka_txn_sink.protocol.messages import Triple


def prepare(
    bootstrap: str, topic: str, sink_id: str, tasks: int, pool: ThreadPoolExecutor
) -> list[Triple]:
    """`tasks` transactions prepared as tasks prepare them (commit_overhead.py's), open."""
    commits = prepare_tasks(bootstrap, topic, sink_id, 0, 0, tasks, pool)
    return [c.prepared_triple for c in commits]


def end_all(admins: list[TxnAdmin], triples: list[Triple]) -> float:
    """Seconds to commit `triples`, split evenly over `admins`, one thread each."""
    parts = [triples[i :: len(admins)] for i in range(len(admins))]
    started = time.perf_counter()
    with ThreadPoolExecutor(max_workers=len(admins)) as pool:
        results = list(pool.map(lambda a, p: a.end_transactions(p, True, 60), admins, parts))
    elapsed = time.perf_counter() - started
    failed = [r for part in results for r in part if not r.ok]
    assert not failed, failed[:3]
    return elapsed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=1024)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--connections", type=int, nargs="*", default=[1, 4, 8])
    parser.add_argument("--nodes", type=int, default=1, help="as commit_overhead.py's")
    options = parser.parse_args()
    times: dict[int, list[float]] = {n: [] for n in options.connections}
    with tempfile.TemporaryDirectory() as tmp, brokers(Path(tmp), options.nodes) as found:
        bootstrap, cluster = found
        topic = f"endtxn_{uuid.uuid4().hex[:8]}"
        new_topic(bootstrap, cluster, topic, 8)
        admins = {n: [TxnAdmin(bootstrap, {}) for _ in range(n)] for n in options.connections}
        with ThreadPoolExecutor(max_workers=16) as pool:
            for round_ in range(options.rounds + 1):  # the first warms every client up
                for n in options.connections:
                    sink_id = f"endtxn_{n}_{uuid.uuid4().hex[:6]}"
                    triples = prepare(bootstrap, topic, sink_id, options.tasks, pool)
                    elapsed = end_all(admins[n], triples)
                    if round_:
                        times[n].append(elapsed)
        for clients in admins.values():
            for admin in clients:
                admin.close()
    base = statistics.median(times[options.connections[0]])
    print(f"EndTxn(commit) of {options.tasks} transactions, {options.nodes} node(s), "
          f"{options.rounds} rounds")  # fmt: skip
    print("| connections | median ms | min-max ms | / first |")
    print("|---|---|---|---|")
    for n, values in times.items():
        median = statistics.median(values)
        print(f"| {n} | {median * 1000:.0f} | {min(values) * 1000:.0f}-{max(values) * 1000:.0f} "
              f"| {median / base:.2f} |")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
