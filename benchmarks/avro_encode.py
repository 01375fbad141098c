"""Avro from Arrow batches, old path against new, side by side in one run (no Spark, bounded).

    .venv/bin/python benchmarks/avro_encode.py --rows 300000 --codec snappy

The rows are the twelve log-like fields of `files_throughput.py`, in Arrow batches of 10,000
rows as PySpark 4.1+ hands them to the Arrow writer. For each partitioning (none; `user` with 8
values and `date=yyyy-MM-dd/hour=HH` over one day) both paths write through one task's
`FileSet` into a local directory:

- rows: every batch turned into PySpark's rows (`spark_rows.arrow_rows`), written with fastavro;
- native: the batch split with Arrow compute and encoded by arrow-avro (`FileSet.add_batch`).

Payload mode the same way, on the same rows as one JSON object each (`payload`, beside `user`
and `ts` for the partitioning): rows parse each payload with `json.loads`, aggregate its schema
and write with fastavro; native spools the payloads as text and reads each file with Arrow's
JSON reader, then encodes natively (`payload_arrow`).

Also `polars_avro.write_avro` of the whole table as one file (the encoder alone, no split, no
sink). Rounds alternate the paths; the median rows/s of each is printed with its ratio.
"""

from __future__ import annotations

import argparse
import io
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import polars as pl
import polars_avro
import pyarrow as pa
from pyspark.sql.types import StringType, StructField, StructType, TimestampType

sys.path.insert(0, str(Path(__file__).parent))
from files_throughput import SCHEMA, make_rows

from kafka_txn_sink.files.naming import FileNaming
from kafka_txn_sink.files.plan import FilePlan, plan_files
from kafka_txn_sink.files.spark_rows import arrow_rows
from kafka_txn_sink.files.writer import FileSet
from kafka_txn_sink.storage.files import LocalFileSink

BATCH_ROWS = 10_000


def make_batches(rows: int, users: int) -> list[pa.RecordBatch]:
    """The rows as Arrow batches of the types PySpark gives the Arrow writer."""
    table = pa.Table.from_pylist(
        [dict(zip(SCHEMA.names, row, strict=True)) for row in make_rows(rows, users)],
        schema=pa.schema(
            [
                ("ts", pa.timestamp("us", "UTC")),
                ("user", pa.string()),
                ("level", pa.string()),
                ("service", pa.string()),
                ("host", pa.string()),
                ("message", pa.string()),
                ("status", pa.int32()),
                ("latency_ms", pa.float64()),
                ("bytes", pa.int64()),
                ("trace_id", pa.string()),
                ("path", pa.string()),
                ("user_agent", pa.string()),
            ]
        ),
    )
    return table.to_batches(max_chunksize=BATCH_ROWS)


def make_payload_batches(batches: list[pa.RecordBatch]) -> list[pa.RecordBatch]:
    """The same rows with every field in one JSON object (`payload`), `user` and `ts` kept."""
    out = []
    for batch in batches:
        rows = batch.to_pylist()
        payloads = [json.dumps({**r, "ts": r["ts"].isoformat()}) for r in rows]
        out.append(
            pa.record_batch(
                [batch.column("user"), batch.column("ts"), pa.array(payloads, pa.string())],
                names=["user", "ts", "payload"],
            )
        )
    return out


def write_rows(plan: FilePlan, batches: list[pa.RecordBatch], root: Path) -> int:
    """The old path: rows from each batch, fastavro."""
    rows_of = arrow_rows(plan.schema)
    with FileSet(plan, LocalFileSink(root, durable=False), FileNaming(0, 0, 0)) as files:
        for batch in batches:
            for row in rows_of(batch):
                files.add(row)
        return len(files.close())


def write_native(plan: FilePlan, batches: list[pa.RecordBatch], root: Path) -> int:
    """The new path: split with Arrow compute, encoded natively."""
    with FileSet(plan, LocalFileSink(root, durable=False), FileNaming(0, 0, 0)) as files:
        for batch in batches:
            assert files.accepts(batch.schema), "the native path refused the schema"
            files.add_batch(batch)
        return len(files.close())


def write_polars(batches: list[pa.RecordBatch], codec: str) -> int:
    """polars-avro alone: one in-memory file of the whole table."""
    frame = pl.from_arrow(pa.Table.from_batches(batches))
    assert isinstance(frame, pl.DataFrame)
    native = {
        "null": None,
        "snappy": polars_avro.Codec.Snappy,
        "deflate": polars_avro.Codec.Deflate,
    }
    polars_avro.write_avro(frame, io.BytesIO(), codec=native.get(codec, polars_avro.Codec.Snappy))
    return 1


def main() -> None:
    """Parse the arguments, run the rounds, print the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=300_000)
    parser.add_argument("--users", type=int, default=8)
    parser.add_argument("--codec", default="snappy", choices=["null", "deflate", "snappy"])
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    batches = make_batches(args.rows, args.users)
    plans = {
        "unpartitioned": plan_files(SCHEMA, codec=args.codec),
        "user + date/hour": plan_files(
            SCHEMA,
            partition_by=["user"],
            time_column="ts",
            time_pattern="date=yyyy-MM-dd/hour=HH",
            codec=args.codec,
            max_open_files=64,
        ),
    }
    payload_batches = make_payload_batches(batches)
    payload_schema = StructType(
        [
            StructField("user", StringType()),
            StructField("ts", TimestampType()),
            StructField("payload", StringType()),
        ]
    )
    payload_plans = {
        f"payload, {label}": plan_files(
            payload_schema,
            payload_column="payload",
            **{k: v for k, v in options.items() if k != "codec"},
            codec=args.codec,
        )
        for label, options in {
            "unpartitioned": {},
            "user + date/hour": {
                "partition_by": ["user"],
                "time_column": "ts",
                "time_pattern": "date=yyyy-MM-dd/hour=HH",
                "max_open_files": 64,
            },
        }.items()
    }
    print(f"{args.rows} rows of 12 fields, batches of {BATCH_ROWS}, codec {args.codec}")
    print(f"{'partitioning':<27} {'rows rows/s':>12} {'native rows/s':>14} {'ratio':>7} files")
    cases = [(label, plan, batches) for label, plan in plans.items()] + [
        (label, plan, payload_batches) for label, plan in payload_plans.items()
    ]
    for label, plan, data in cases:
        old = _rates(lambda root, p=plan, d=data: write_rows(p, d, root), args.rounds, args.rows)
        new = _rates(lambda root, p=plan, d=data: write_native(p, d, root), args.rounds, args.rows)
        print(f"{label:<27} {old[0]:>12,.0f} {new[0]:>14,.0f} {new[0] / old[0]:>6.1f}x {new[1]}")
    alone = _rates(lambda root: write_polars(batches, args.codec), args.rounds, args.rows)
    print(f"polars_avro.write_avro alone (one file, no split): {alone[0]:,.0f} rows/s")


def _rates(run: Callable[[Path], int], rounds: int, rows: int) -> tuple[float, int]:
    """Median rows/s over `rounds` runs, each into a fresh directory; and the files written."""
    rates = []
    files = 0
    for _ in range(rounds):
        with tempfile.TemporaryDirectory(prefix="avro-encode-") as root:
            start = time.perf_counter()
            files = run(Path(root))
            rates.append(rows / (time.perf_counter() - start))
    return statistics.median(rates), files


if __name__ == "__main__":
    main()
