"""The driver's commit overhead per batch, on a real broker with the local JSON commit log.

    .venv/bin/python benchmarks/commit_overhead.py                    # 8, 32 and 128 tasks
    .venv/bin/python benchmarks/commit_overhead.py --tasks 32 --rounds 50
    .venv/bin/python benchmarks/commit_overhead.py --tasks 32 --consumer-group  # its cost beside
    .venv/bin/python benchmarks/commit_overhead.py --tasks 128 --touched 1 8 64  # markers per task
    .venv/bin/python benchmarks/commit_overhead.py --tasks 1024 --rounds 3 --nodes 3  # 3 nodes
    .venv/bin/python benchmarks/commit_overhead.py --tasks 1024 --nodes 3 --endtxn-clients 1 8

Per round, N task transactions are prepared exactly as tasks prepare them
(`kafka_txn_sink.kafka.producer.TaskTransaction`: init, one record to each of `--touched`
partitions, flush, triple read from the statistics, dropped without closing), their `TaskCommit`
messages are built, and then what Spark's commit worker does for a batch is timed in this one
process, as in Spark's reused commit worker: `streamWriter()` (options, cluster facts, claim and
roll forward of the log), then `commit()` (query id, prepare check, decision, EndTxn for every
participant, completion, clean-up). Prints p50 and p99 of `commit()` alone and of both together,
and the p50 of the next round's preparation (its `init_transactions` waits for the markers the last
commit left the brokers to write, one per partition a transaction touched), the peak of Python
memory one more `commit()` allocates (tracemalloc, not timed) and the sink's transactional ids the
brokers hold afterwards, by state; the first round of each
size (cold clients) is reported apart, and it and the next WARMUP_ROUNDS are left out of the
percentiles: a broker that has just started runs its transaction coordinator several times slower
(128 tasks: p50 109-125 ms in its first minute, 31-50 ms once warm), and a production broker is
warm.
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import statistics
import sys
import tempfile
import time
import tracemalloc
import uuid
from collections import Counter
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pyspark.sql.types import BinaryType, StructField, StructType

from kafka_txn_sink import testing
from kafka_txn_sink.datasource import KafkaTxnDataSource
from kafka_txn_sink.kafka import txn_admin
from kafka_txn_sink.kafka.producer import TaskTransaction
from kafka_txn_sink.kafka.producer_settings import producer_config
from kafka_txn_sink.kafka.txn_admin import TxnAdmin
from kafka_txn_sink.protocol.recover import known_ids
from kafka_txn_sink.protocol.task_commit import TaskCommit
from kafka_txn_sink.protocol.txn_ids import transactional_id
from kafka_txn_sink.testing.kafka_cluster import KafkaCluster
from tests.e2e.harness import create_topics

SCHEMA = StructType([StructField("key", BinaryType()), StructField("value", BinaryType())])
QUERY_ID = "bench-query"
DEFAULT_ROUNDS = {8: 40, 32: 30, 128: 12}
WARMUP_ROUNDS = 10
# The tasks' transactions and the sink's option alike: above the default commit margin (337 s,
# margin.py), which the prepare check asks of the transactions it finds.
TXN_TIMEOUT_MS = 600_000
PARTITIONS = 8  # of the output topic, or --touched when more


def prepare_tasks(
    bootstrap: str,
    topic: str,
    sink_id: str,
    slot: int,
    batch_id: int,
    tasks: int,
    pool: ThreadPoolExecutor,
    touched: int = 1,
    first_partition: int = 0,
) -> list[TaskCommit]:
    """The messages of `tasks` transactions prepared as the tasks of Spark partitions
    `first_partition` onwards leave them."""

    def one(partition: int) -> TaskCommit:
        txn_id = transactional_id(sink_id, partition, slot=slot)
        config = producer_config(bootstrap, {}, txn_id, TXN_TIMEOUT_MS)
        txn = TaskTransaction(config, timeout_s=30)
        txn.init()
        for step in range(touched):
            where = (partition + step) % max(PARTITIONS, touched)
            txn.send(topic, value=b"v" * 100, key=str(partition).encode(), partition=where)
        prepared = txn.prepare()
        txn.detach()
        assert prepared is not None
        return TaskCommit(
            QUERY_ID,
            batch_id,
            partition,
            0,
            "prepared",
            rows=prepared.rows,
            triple=prepared.triple,
            offsets=prepared.offsets,
            prepared_at_ms=prepared.prepared_at_ms,
        )

    return list(pool.map(one, range(first_partition, first_partition + tasks)))


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))
    return ordered[index]


@dataclass
class Sink:
    """One sink of a run: its data source, slot, checkpoint and the times measured."""

    name: str
    source: KafkaTxnDataSource
    sink_id: str
    checkpoint: Path | None
    slot: int = 0
    profile: cProfile.Profile | None = None  # commit() of the measured rounds, with --profile
    touched: int = 1
    endtxn_clients: int = txn_admin.MAX_END_TXN_CLIENTS  # the most EndTxn clients it may use
    commit_ms: list[float] = field(default_factory=list)
    prepare_ms: list[float] = field(default_factory=list)
    peak_mib: float = 0.0  # Python memory one more commit() allocated at its peak
    both_ms: list[float] = field(default_factory=list)
    cold: tuple[float, float] | None = None


def new_sink(bootstrap: str, work: Path, topic: str, tasks: int, group: bool) -> Sink:
    name = uuid.uuid4().hex[:8]
    sink_id = f"commit_bench_{tasks}_{name}"
    options = {
        "kafka.bootstrap.servers": bootstrap,
        "topic": topic,
        "sinkId": sink_id,
        "commitLog": str(work / f"log_{tasks}_{name}"),
        "transactionTimeoutMs": str(TXN_TIMEOUT_MS),
    }
    checkpoint = work / f"checkpoint_{name}" if group else None
    if checkpoint is not None:  # option consumerGroup reads the batch's offsets from here
        (checkpoint / "offsets").mkdir(parents=True)
        options.update(checkpointLocation=str(checkpoint), consumerGroup=f"bench_{name}")
    return Sink("consumerGroup" if group else "plain", KafkaTxnDataSource(options), sink_id,
                checkpoint)  # fmt: skip


def measure(
    bootstrap: str, work: Path, tasks: int, rounds: int, group: bool = False,
    profile: bool = False,
    touched: int = 1,
    cluster: KafkaCluster | None = None,
    endtxn_clients: Sequence[int] = (),
) -> list[dict[str, Any]]:
    """Per size, the plain sink (and with `group` a consumerGroup sink beside it, their
    batches alternated): commit() and streamWriter() + commit() in ms; each task's transaction
    writes to `touched` partitions; `cluster`: the nodes behind `bootstrap`, when several;
    `endtxn_clients`: one plain sink per value, each allowed that many EndTxn clients."""
    topic = f"commit_bench_{uuid.uuid4().hex[:8]}"
    new_topic(bootstrap, cluster, topic, max(PARTITIONS, touched))
    sinks = [new_sink(bootstrap, work, topic, tasks, False)]
    if group:
        sinks.append(new_sink(bootstrap, work, topic, tasks, True))
    if endtxn_clients:
        sinks = [new_sink(bootstrap, work, topic, tasks, False) for _ in endtxn_clients]
        for sink, clients in zip(sinks, endtxn_clients, strict=True):
            sink.name, sink.endtxn_clients = f"plain, {clients} EndTxn client(s)", clients
    for sink in sinks:  # the query's start: claims the new log and records this run's slot
        sink.touched = touched
        sink.profile = cProfile.Profile() if profile else None
        if sink.checkpoint is not None:
            _write_offsets(sink.checkpoint, 0, topic)
        sink.slot = sink.source.streamWriter(SCHEMA, False).plan.run.slot  # type: ignore[attr-defined]
    with ThreadPoolExecutor(max_workers=16) as pool:
        for batch_id in range(rounds + 1 + WARMUP_ROUNDS):
            for sink in sinks:
                one_batch(bootstrap, topic, sink, batch_id, tasks, pool)
        for sink in sinks:
            sink.peak_mib = traced_commit(bootstrap, topic, sink, rounds + 1 + WARMUP_ROUNDS,
                                          tasks, pool)  # fmt: skip
    for sink in sinks:
        if sink.profile is not None:
            print(f"commit() of {sink.name} at {tasks} tasks, {rounds} rounds, by cumulative time:")
            pstats.Stats(sink.profile).sort_stats("cumulative").print_stats(35)
    return [summary(sink, tasks, rounds, ids_held(bootstrap, sink.sink_id)) for sink in sinks]


def traced_commit(
    bootstrap: str, topic: str, sink: Sink, batch_id: int, tasks: int, pool: ThreadPoolExecutor
) -> float:
    """One more batch, its commit() under tracemalloc: the peak it allocated, MiB."""
    messages = prepare_tasks(
        bootstrap, topic, sink.sink_id, sink.slot, batch_id, tasks, pool, sink.touched
    )
    if sink.checkpoint is not None:
        _write_offsets(sink.checkpoint, batch_id, topic)
    writer = sink.source.streamWriter(SCHEMA, False)
    txn_admin.MAX_END_TXN_CLIENTS = sink.endtxn_clients
    tracemalloc.start()
    try:
        writer.commit(list(messages), batch_id)
        return tracemalloc.get_traced_memory()[1] / 2**20
    finally:
        tracemalloc.stop()


def ids_held(bootstrap: str, sink_id: str) -> dict[str, int]:
    """How many of the sink's transactional ids the brokers hold, by state."""
    with TxnAdmin(bootstrap, {}) as admin:
        states = admin.describe(known_ids(sink_id, admin))
    return dict(Counter(state.state for state in states.values()))


def one_batch(
    bootstrap: str, topic: str, sink: Sink, batch_id: int, tasks: int, pool: ThreadPoolExecutor
) -> None:
    began = time.perf_counter()
    messages = prepare_tasks(
        bootstrap, topic, sink.sink_id, sink.slot, batch_id, tasks, pool, sink.touched
    )
    if sink.checkpoint is not None:
        _write_offsets(sink.checkpoint, batch_id, topic)
    started = time.perf_counter()
    writer = sink.source.streamWriter(SCHEMA, False)
    txn_admin.MAX_END_TXN_CLIENTS = sink.endtxn_clients  # set again before every commit()
    planned = time.perf_counter()
    profiled = sink.profile is not None and batch_id > WARMUP_ROUNDS
    if profiled:
        assert sink.profile is not None
        sink.profile.enable()
    writer.commit(list(messages), batch_id)
    done = time.perf_counter()
    if profiled:
        assert sink.profile is not None
        sink.profile.disable()
    if sink.cold is None:
        sink.cold = ((done - planned) * 1000, (done - started) * 1000)
    if batch_id > WARMUP_ROUNDS:
        sink.commit_ms.append((done - planned) * 1000)
        sink.both_ms.append((done - started) * 1000)
        sink.prepare_ms.append((started - began) * 1000)


def _write_offsets(checkpoint: Path, batch_id: int, topic: str) -> None:
    """Spark's offset log line for the batch: offset 0 of partition 0 (never beyond its end)."""
    meta = '{"batchWatermarkMs":0,"batchTimestampMs":0,"conf":{}}'
    (checkpoint / "offsets" / str(batch_id)).write_text(f'v1\n{meta}\n{{"{topic}":{{"0":0}}}}')


def summary(sink: Sink, tasks: int, rounds: int, held: dict[str, int]) -> dict[str, Any]:
    assert sink.cold is not None
    return {
        "sink": sink.name,
        "tasks": tasks,
        "touched": sink.touched,
        "rounds": rounds,
        "prepare_p50": statistics.median(sink.prepare_ms),
        "commit_p50": statistics.median(sink.commit_ms),
        "commit_p99": percentile(sink.commit_ms, 0.99),
        "both_p50": statistics.median(sink.both_ms),
        "both_p99": percentile(sink.both_ms, 0.99),
        "cold_commit": sink.cold[0],
        "cold_both": sink.cold[1],
        "peak_mib": sink.peak_mib,
        "held": held,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, nargs="*", default=[8, 32, 128])
    parser.add_argument("--rounds", type=int, default=0, help="per size; 0: 40, 30, 12")
    parser.add_argument(
        "--consumer-group",
        action="store_true",
        help="also a sink with option consumerGroup, its batches alternated with the plain one's",
    )
    parser.add_argument(
        "--touched", type=int, nargs="*", default=[1],
        help="partitions each task's transaction writes to (one marker each at the commit)",
    )
    parser.add_argument(
        "--nodes", type=int, default=1,
        help="1: the test bed's broker or one of ours; more: a cluster of that many nodes, "
        "50 transaction-state partitions (Kafka's default) spread over them",
    )
    parser.add_argument(
        "--endtxn-clients", type=int, nargs="*", default=[],
        help="sinks side by side, batches alternated, each allowed that many EndTxn clients",
    )
    parser.add_argument(
        "--profile", action="store_true", help="print where commit() spends its time (cProfile)"
    )
    options = parser.parse_args()
    if options.endtxn_clients and options.consumer_group:
        parser.error("--endtxn-clients and --consumer-group each pick the sinks: give one")
    with tempfile.TemporaryDirectory() as tmp, brokers(Path(tmp), options.nodes) as found:
        bootstrap, cluster = found
        results = [
            result
            for n in options.tasks
            for touched in options.touched
            for result in measure(
                bootstrap, Path(tmp), n, options.rounds or DEFAULT_ROUNDS.get(n, 20),
                options.consumer_group, options.profile, touched, cluster,
                options.endtxn_clients,
            )
        ]  # fmt: skip
    print(report(results))
    return 0


@contextmanager
def brokers(work: Path, nodes: int) -> Iterator[tuple[str, KafkaCluster | None]]:
    """One broker (`testing.kafka_bootstrap`) or a cluster of `nodes`: bootstrap, cluster."""
    if nodes == 1:
        with testing.kafka_bootstrap(work) as bootstrap:
            yield bootstrap, None
        return
    cluster = KafkaCluster(work / "cluster", nodes, transaction_state_partitions=50)
    try:
        yield cluster.start(), cluster
    finally:
        cluster.stop()


def new_topic(bootstrap: str, cluster: KafkaCluster | None, topic: str, partitions: int) -> None:
    """`topic` on the broker, or replicated to every node of `cluster`."""
    if cluster is not None:
        cluster.create_topic(topic, partitions, timeout=300)
    else:
        create_topics(bootstrap, partitions, topic)


def report(results: list[dict[str, Any]]) -> str:
    lines = [
        f"driver commit overhead per batch, local JSON commit log (ms; first round apart, "
        f"{WARMUP_ROUNDS} more rounds of warm-up left out)",
        "| sink | tasks | partitions a task | rounds | commit() p50 | commit() p99 "
        "| streamWriter()+commit() p50 | p99 | first round commit() / both "
        "| the tasks' prepare p50 | one commit()'s Python peak | ids held |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        lines.append(
            f"| {r['sink']} | {r['tasks']} | {r['touched']} | {r['rounds']} "
            f"| {r['commit_p50']:.1f} "
            f"| {r['commit_p99']:.1f} "
            f"| {r['both_p50']:.1f} | {r['both_p99']:.1f} "
            f"| {r['cold_commit']:.0f} / {r['cold_both']:.0f} | {r['prepare_p50']:.0f} "
            f"| {r['peak_mib']:.2f} MiB | {r['held']} |"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
