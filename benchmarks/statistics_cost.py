"""What librdkafka's statistics cost a task's producer, by the output topic's partition count.

    set -a; . /tmp/kts/bed/env; set +a
    .venv/bin/python benchmarks/statistics_cost.py                     # 8 and 1,024 partitions
    .venv/bin/python benchmarks/statistics_cost.py --partitions 1024 --rounds 9

A task reads its producer id and epoch from a statistics sample (kafka/producer.py), so every
task's producer emits one each `STATS_INTERVAL_MS`, and a sample lists every partition of every
topic the producer writes to. For each partition count, side by side in one run:

- `idle CPU`: this process's CPU per second while a producer with an open transaction waits,
  with the sink's statistics interval and with statistics off;
- `parse`: one sample read whole with `json.loads` and through `eos_of` (its last object alone);
- `prepare`: `TaskTransaction.prepare()` of a transaction holding one record per partition,
  reading the samples whole (as before 2026-11-27) and through `eos_of`, rounds alternated.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import time
import uuid
from collections.abc import Callable
from typing import Any

from confluent_kafka import Producer

from kafka_txn_sink.kafka import deliveries as deliveries_module
from kafka_txn_sink.kafka.producer import TaskTransaction
from kafka_txn_sink.kafka.producer_settings import STATS_INTERVAL_MS, producer_config
from kafka_txn_sink.testing.kafka_broker import create_topic

TIMEOUT_S = 60.0
TXN_TIMEOUT_MS = 600_000


def cpu_s() -> float:
    """This process's CPU time, user and system, in seconds."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def config(bootstrap: str) -> dict[str, Any]:
    """The sink's producer settings for a fresh transactional id."""
    return producer_config(bootstrap, {}, f"stats-bench-{uuid.uuid4().hex}", TXN_TIMEOUT_MS)


def touching_every_partition(settings: dict[str, Any], topic: str, partitions: int) -> Producer:
    """A producer whose open transaction holds one flushed record in each partition of `topic`."""
    producer = Producer(settings)
    producer.init_transactions(TIMEOUT_S)
    producer.begin_transaction()
    for partition in range(partitions):
        producer.produce(topic, b"x", partition=partition)
    producer.flush(TIMEOUT_S)
    return producer


def idle_cpu_ms_per_s(bootstrap: str, topic: str, partitions: int, stats: bool) -> float:
    """CPU per second of a producer whose open transaction touched every partition."""
    settings = config(bootstrap)
    if stats:
        settings["stats_cb"] = lambda raw: None  # the sink's callback while rows are produced
    else:
        settings["statistics.interval.ms"] = 0
    producer = touching_every_partition(settings, topic, partitions)
    before, start = cpu_s(), time.monotonic()
    while time.monotonic() - start < 2.0:
        producer.poll(0.05)
    used = (cpu_s() - before) / (time.monotonic() - start)
    producer.abort_transaction(TIMEOUT_S)
    return used * 1000


def one_sample(bootstrap: str, topic: str, partitions: int) -> str:
    """A statistics sample of a producer that wrote to every partition of `topic`."""
    samples: list[str] = []
    settings = {**config(bootstrap), "stats_cb": samples.append}
    producer = touching_every_partition(settings, topic, partitions)
    samples.clear()
    while not samples:
        producer.poll(STATS_INTERVAL_MS / 1000)
    producer.abort_transaction(TIMEOUT_S)
    return samples[-1]


def parse_ms(parse: Callable[[str], Any], raw: str, times: int = 20) -> float:
    """Median milliseconds of one parse of `raw`."""
    took = []
    for _ in range(times):
        start = time.perf_counter()
        parse(raw)
        took.append(time.perf_counter() - start)
    return statistics.median(took) * 1000


def prepare_ms(bootstrap: str, topic: str, partitions: int) -> float:
    """Milliseconds of `prepare()` of a transaction with one record in every partition."""
    txn = TaskTransaction(config(bootstrap), TIMEOUT_S)
    txn.init()
    for partition in range(partitions):
        txn.send(topic, b"x", partition=partition)
    start = time.perf_counter()
    txn.prepare()
    took = time.perf_counter() - start
    txn.abort()
    return took * 1000


def whole(raw: str) -> dict[str, Any]:
    """The sample's eos object, parsing the whole sample (the former way)."""
    found: dict[str, Any] = json.loads(raw).get("eos", {})
    return found


def prepare_side_by_side(
    bootstrap: str, topic: str, partitions: int, rounds: int
) -> tuple[float, float]:
    """Median prepare() ms reading samples whole, and through `eos_of`; rounds alternated."""
    new_way = deliveries_module.eos_of
    times: dict[bool, list[float]] = {False: [], True: []}
    try:
        for round_no in range(rounds):
            for use_new in (round_no % 2 == 0, round_no % 2 == 1):
                deliveries_module.eos_of = new_way if use_new else whole
                times[use_new].append(prepare_ms(bootstrap, topic, partitions))
    finally:
        deliveries_module.eos_of = new_way
    return statistics.median(times[False]), statistics.median(times[True])


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--partitions", type=int, nargs="+", default=[8, 1024])
    parser.add_argument("--rounds", type=int, default=7)
    options = parser.parse_args()
    bootstrap = os.environ["KTS_KAFKA_BOOTSTRAP"]
    print(f"statistics.interval.ms={STATS_INTERVAL_MS}")
    print(
        "| partitions | sample | idle CPU, statistics off / on | parse whole / eos_of "
        "| prepare(), whole / eos_of |"
    )
    print("|---|---|---|---|---|")
    for partitions in options.partitions:
        topic = f"stats-bench-{partitions}-{uuid.uuid4().hex[:8]}"
        create_topic(bootstrap, topic, partitions)
        prepare_ms(bootstrap, topic, partitions)  # warm-up: metadata, connections
        off = idle_cpu_ms_per_s(bootstrap, topic, partitions, stats=False)
        on = idle_cpu_ms_per_s(bootstrap, topic, partitions, stats=True)
        raw = one_sample(bootstrap, topic, partitions)
        old_parse = parse_ms(whole, raw)
        new_parse = parse_ms(deliveries_module.eos_of, raw)
        old_prepare, new_prepare = prepare_side_by_side(
            bootstrap, topic, partitions, options.rounds
        )
        print(
            f"| {partitions:,} | {len(raw) / 1000:,.0f} KB | {off:.1f} / {on:.1f} ms/s "
            f"| {old_parse:.3f} / {new_parse:.3f} ms ({old_parse / new_parse:,.0f}x) "
            f"| {old_prepare:.1f} / {new_prepare:.1f} ms ({new_prepare / old_prepare:.2f}x) |",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
