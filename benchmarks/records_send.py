"""Records mode's send path on a real broker: rows/s of a task's transaction, old path vs new.

    set -a; . /tmp/kts/bed/env; set +a
    .venv/bin/python benchmarks/records_send.py                  # 200k rows, 3 rounds
    .venv/bin/python benchmarks/records_send.py --rows 50000 --rounds 5

Each round, alternately, one transaction per path sends the same rows (100-byte values,
string-id keys, or no keys with --no-keys) to one topic of --partitions partitions, flushes and
is aborted (nothing is ever committed):

- `per-record callback`: what the Arrow path did before: produce() per record, librdkafka
  partitions, and a Python delivery callback per record collecting offsets (`Deliveries`);
- `send_many`: `TaskTransaction.send_many` as the Arrow path calls it now: partitions computed
  for the batch, produce() with an explicit partition, delivery reports kept by a C callback;
- `send_many, every record reported`: the same with a delivery report on every record, as
  before 2026-11-28 (since then only a task's first `REPORTED_RECORDS` are, and the others are
  proven by their partitions' acknowledged counts);
- `send_many, pure Python`: the same with the records past the reported ones produced through
  confluent-kafka's produce() instead of the C loop (kafka/quiet.py), as before 2026-12-01;
- `send_many + digest`: the same through the digest of the records that records mode keeps for
  a repair (records/digest.py): what the digest costs a row;
- `produce, no reports` and `produce_batch, no reports`: the floors, with no offsets and no
  delivery errors at all (what the protocol cannot do without), for comparison.

Prints the median rows/s (wall time: produce and flush) and the sending thread's CPU per row
(time.thread_time: the per-record Python work, less disturbed by other load on the machine).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
import uuid
from collections.abc import Callable
from typing import Any

from confluent_kafka import Producer

from kafka_txn_sink.kafka import producer as producer_module
from kafka_txn_sink.kafka.deliveries import Deliveries
from kafka_txn_sink.kafka.producer import POLL_EVERY, REPORTED_RECORDS, Prepared, TaskTransaction
from kafka_txn_sink.kafka.producer_settings import producer_config
from kafka_txn_sink.kafka.quiet import quiet_produce
from kafka_txn_sink.records.digest import DigestingTransaction
from kafka_txn_sink.testing.kafka_broker import create_topic

ARROW_BATCH = 10_000  # rows per Arrow batch: PySpark's default maxRecordsPerBatch
TIMEOUT_S = 60.0

Rows = tuple[list[bytes | None], list[bytes | None] | None]


def per_record_callback(producer: Producer, topic: str, rows: Rows) -> None:
    """The former Arrow path: one produce() per record (and the producer's on_delivery)."""
    values, keys = rows
    produce = producer.produce
    for sent, (value, key) in enumerate(zip(values, keys or [None] * len(values), strict=True), 1):
        while True:
            try:
                produce(topic, value, key)
                break
            except BufferError:
                producer.poll(0.05)
        if sent % POLL_EVERY == 0:
            producer.poll(0)


def produce_batch(producer: Producer, topic: str, rows: Rows) -> None:
    """confluent-kafka's produce_batch, one call per Arrow batch, without delivery reports."""
    values, keys = rows
    for start in range(0, len(values), ARROW_BATCH):
        end = start + ARROW_BATCH
        batch_keys = keys[start:end] if keys is not None else [None] * (end - start)
        pairs = zip(values[start:end], batch_keys, strict=True)
        messages = [{"value": v, "key": k} for v, k in pairs]
        while messages:
            producer.produce_batch(topic, messages)
            # Refused ones (queue full) carry an `_error`: those again, without it.
            messages = [m for m in messages if m.pop("_error", None) is not None]
            if messages:
                producer.poll(0.05)


def send_many(txn: TaskTransaction | DigestingTransaction, topic: str, rows: Rows) -> None:
    """The Arrow path now: `TaskTransaction.send_many` per Arrow batch."""
    values, keys = rows
    for start in range(0, len(values), ARROW_BATCH):
        end = start + ARROW_BATCH
        txn.send_many(topic, values[start:end], keys[start:end] if keys is not None else None)


def timed(send: Callable[[], None], flush: Callable[[], None], rows: int) -> tuple[float, float]:
    """(rows/s, sending thread's CPU us per row) of `send` then `flush`."""
    started, cpu = time.perf_counter(), time.thread_time()
    send()
    flush()
    elapsed, cpu = time.perf_counter() - started, time.thread_time() - cpu
    return rows / elapsed, cpu / rows * 1e6


def run_send_many(
    bootstrap: str,
    topic: str,
    rows: Rows,
    digest: bool = False,
    reported: bool = False,
    pure_python: bool = False,
) -> tuple[float, float]:
    """One transaction through `TaskTransaction`: send_many, then prepare (flush, offsets);
    with `digest`, through the records' digest as records mode sends (records/digest.py); with
    `reported`, every record with a delivery report (as before 2026-11-28: no record is proven
    by its partition's acknowledged count); with `pure_python`, the records without reports
    through produce() instead of the C loop (kafka/quiet.py)."""
    producer_module.REPORTED_RECORDS = sys.maxsize if reported else REPORTED_RECORDS
    producer_module.quiet_produce = (lambda _: None) if pure_python else quiet_produce
    txn = TaskTransaction(producer_config(bootstrap, {}, _txn_id(), 120_000), TIMEOUT_S)
    txn.init()
    prepared: list[Prepared | None] = []
    sender: Any = DigestingTransaction(txn) if digest else txn
    result = timed(
        lambda: send_many(sender, topic, rows),
        lambda: prepared.append(txn.prepare()),
        len(rows[0]),
    )
    assert prepared[0] is not None and prepared[0].rows == len(rows[0])
    txn.abort()
    return result


def run_raw(
    bootstrap: str,
    topic: str,
    rows: Rows,
    send: Callable[[Producer, str, Rows], None],
    reports: bool,
) -> tuple[float, float]:
    """One transaction of a bare transactional producer, with the per-record Python delivery
    callback or without delivery reports."""
    deliveries = Deliveries()
    config: dict[str, Any] = producer_config(bootstrap, {}, _txn_id(), 120_000)
    if reports:
        config["on_delivery"] = deliveries.on_delivery
    producer = Producer(config)
    producer.init_transactions(TIMEOUT_S)
    producer.begin_transaction()
    result = timed(
        lambda: send(producer, topic, rows),
        lambda: _flushed(producer),
        len(rows[0]),
    )
    if reports:
        assert deliveries.delivered == len(rows[0]) and deliveries.error is None
    producer.abort_transaction(TIMEOUT_S)
    return result


def _flushed(producer: Producer) -> None:
    remaining = producer.flush(TIMEOUT_S)
    assert remaining == 0, f"{remaining} records not delivered"


def _txn_id() -> str:
    return f"bench-send-{uuid.uuid4().hex[:8]}"


PATHS: dict[str, Callable[[str, str, Rows], tuple[float, float]]] = {
    "per-record callback": lambda b, t, r: run_raw(b, t, r, per_record_callback, True),
    "send_many": run_send_many,
    "send_many + digest": lambda b, t, r: run_send_many(b, t, r, digest=True),
    "send_many, every record reported": lambda b, t, r: run_send_many(b, t, r, reported=True),
    "send_many, pure Python": lambda b, t, r: run_send_many(b, t, r, pure_python=True),
    "produce, no reports": lambda b, t, r: run_raw(b, t, r, per_record_callback, False),
    "produce_batch, no reports": lambda b, t, r: run_raw(b, t, r, produce_batch, False),
}


def main() -> None:
    """Run the rounds and print the table."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--partitions", type=int, default=8)
    parser.add_argument("--no-keys", action="store_true")
    args = parser.parse_args()
    bootstrap = os.environ["KTS_KAFKA_BOOTSTRAP"]
    topic = f"bench_send_{uuid.uuid4().hex[:8]}"
    create_topic(bootstrap, topic, partitions=args.partitions)
    values: list[bytes | None] = [f"{i:0100d}".encode() for i in range(args.rows)]
    keys: list[bytes | None] | None = (
        None if args.no_keys else [str(i).encode() for i in range(args.rows)]
    )
    results: dict[str, list[tuple[float, float]]] = {name: [] for name in PATHS}
    for run in PATHS.values():  # warm-up: connections, metadata, the broker's JIT
        run(bootstrap, topic, (values[:20_000], keys[:20_000] if keys is not None else None))
    for _ in range(args.rounds):
        for name, run in PATHS.items():
            results[name].append(run(bootstrap, topic, (values, keys)))
    print(
        f"{args.rows} rows of 100-byte values, {'no keys' if args.no_keys else 'string keys'}, "
        f"{args.partitions} partitions, median of {args.rounds} rounds"
    )
    base = statistics.median(r for r, _ in results["per-record callback"])
    for name, runs in results.items():
        rate = statistics.median(r for r, _ in runs)
        cpu = statistics.median(c for _, c in runs)
        print(f"{name:28s} {rate:10,.0f} rows/s  x{rate / base:4.2f}  {cpu:5.2f} us/row CPU")


if __name__ == "__main__":
    main()
