"""The throughput benchmark's input: the two row variants, made and loaded into a topic.

`100b`: a ~100-byte value with a short key. `log12`: a log-like JSON object of twelve fields,
which the benchmark's queries parse into twelve typed columns (LOG12_DDL).
"""

from __future__ import annotations

import json
import random
import time
from dataclasses import dataclass

from confluent_kafka import Producer

VARIANTS = ("100b", "log12")
LOG12_DDL = (
    "ts TIMESTAMP, user STRING, level STRING, service STRING, host STRING, message STRING, "
    "status INT, latency_ms DOUBLE, bytes BIGINT, trace_id STRING, path STRING, user_agent STRING"
)
LEVELS = ["DEBUG", "INFO", "INFO", "INFO", "WARN", "ERROR"]
SERVICES = ["api", "auth", "billing", "search"]
PARTITION_BY = ("service", "level")  # 4 services x 4 levels = 16 Hive partitions


@dataclass
class Data:
    """Rows of one variant, as the keys and values produced to the input topic."""

    variant: str
    keys: list[bytes]
    values: list[bytes]

    @property
    def bytes_per_row(self) -> float:
        """Mean key + value bytes of a row."""
        total = sum(len(k) + len(v) for k, v in zip(self.keys, self.values, strict=True))
        return total / len(self.keys)


def make_data(variant: str, rows: int, seed: int = 7) -> Data:
    """`rows` rows of `variant`, the same for the same seed."""
    keys = [str(i).encode() for i in range(rows)]
    if variant == "100b":
        values = [(f"{i:012d}-" + "v" * 100)[:100].encode() for i in range(rows)]
    else:
        rnd = random.Random(seed)
        values = [log12_value(i, rnd) for i in range(rows)]
    return Data(variant, keys, values)


def log12_value(i: int, rnd: random.Random) -> bytes:
    """Row `i` of the log-like variant as compact JSON."""
    body = {
        "ts": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(1_795_000_000 + i)),
        "user": f"user{rnd.randrange(1000):05d}",
        "level": rnd.choice(LEVELS),
        "service": rnd.choice(SERVICES),
        "host": f"host-{rnd.randrange(20):02d}.example.internal",
        "message": f"request {i} handled with result {rnd.randrange(1000)}",
        "status": rnd.choice([200, 200, 200, 201, 404, 500]),
        "latency_ms": round(rnd.uniform(0.1, 900.0), 3),
        "bytes": rnd.randrange(100, 100_000),
        "trace_id": f"{rnd.getrandbits(64):016x}",
        "path": f"/v1/items/{rnd.randrange(10_000)}",
        "user_agent": "Mozilla/5.0 (X11; Linux x86_64) bench/1.0",
    }
    return json.dumps(body, separators=(",", ":")).encode()


def produce_all(bootstrap: str, topic: str, data: Data, timeout_s: float = 300) -> float:
    """Produce every row of `data` to `topic` with confluent-kafka's defaults (idempotent,
    acks=all); the rows/s of produce + flush, i.e. a raw producer loop without Spark."""
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True})
    produce, poll = producer.produce, producer.poll
    started = time.perf_counter()
    for key, value in zip(data.keys, data.values, strict=True):
        while True:
            try:
                produce(topic, value, key)
                break
            except BufferError:
                if time.perf_counter() - started > timeout_s:
                    raise RuntimeError(f"{topic}: the producer's queue stayed full") from None
                poll(0.01)
    if producer.flush(timeout_s) != 0:
        raise RuntimeError(f"{topic}: not every input row was produced in {timeout_s} s")
    return len(data.keys) / (time.perf_counter() - started)
