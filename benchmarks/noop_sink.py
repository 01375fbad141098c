"""The floor of a Python streaming sink in Spark: a data source that writes nothing.

    # needs a broker
    .venv/bin/python benchmarks/noop_sink.py [--python .venv-spark-newest/bin/python]

`format("noop_python")` consumes its rows and commits nothing (`noop_arrow`: the same with Arrow
batches, PySpark 4.1+); beside Spark's built-in `format("noop")` on the same input, its per-batch
time is what Spark's Python data source machinery costs before any sink does work (planner call,
Python task workers, commit worker). kafka_txn's fixed cost per batch is measured against it.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pyspark.sql import datasource
from pyspark.sql.datasource import DataSource, DataSourceStreamWriter, WriterCommitMessage


@dataclass
class Done(WriterCommitMessage):
    rows: int


class NoopWriter(DataSourceStreamWriter):
    def write(self, iterator: Iterator[Any]) -> Done:
        # Counts rows without touching them: getattr(row, "num_rows", 1) would cost a Row
        # lookup and a caught exception per row, a cost no real sink pays.
        rows = 0
        for _ in iterator:
            rows += 1
        return Done(rows)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        return None

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        return None


class NoopSource(DataSource):
    @classmethod
    def name(cls) -> str:
        return "noop_python"

    def streamWriter(self, schema: Any, overwrite: bool) -> DataSourceStreamWriter:
        return NoopWriter()


# PySpark 4.1+: the same sink taking Arrow batches, the floor for kafka_txn's Arrow writer.
ArrowWriterBase: Any = getattr(datasource, "DataSourceStreamArrowWriter", None)
if ArrowWriterBase is not None:

    class NoopArrowWriter(NoopWriter, ArrowWriterBase):
        def write(self, iterator: Iterator[Any]) -> Done:
            return Done(sum(batch.num_rows for batch in iterator))


class NoopArrowSource(DataSource):
    @classmethod
    def name(cls) -> str:
        return "noop_arrow"

    def streamWriter(self, schema: Any, overwrite: bool) -> DataSourceStreamWriter:
        if ArrowWriterBase is None:
            raise RuntimeError("noop_arrow needs PySpark 4.1+ (DataSourceStreamArrowWriter)")
        return NoopArrowWriter()


def main() -> int:
    """Each floor beside Spark's Kafka sink and kafka_txn, in one application, on one input."""
    import throughput as t
    from bench_rows import make_data, produce_all

    from tests.e2e.harness import create_topics

    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--python", default=sys.executable)
    parser.add_argument("--rows", type=int, default=60)
    parser.add_argument("--per-batch", type=int, default=6)
    options = parser.parse_args()
    bootstrap = os.environ["KTS_KAFKA_BOOTSTRAP"]
    python = str(Path(options.python).absolute())
    env = t.testing.spark_newest_package_env() if python != sys.executable else {}
    label = t.testing.newest_spark_line() if env else "4.0"
    line = t.Line(label, python, ",".join(t.testing.spark_jars_of(python, env)), env)
    topic, out = f"noop_in_{uuid.uuid4().hex[:8]}", f"noop_out_{uuid.uuid4().hex[:8]}"
    create_topics(bootstrap, 2, topic, out)
    produce_all(bootstrap, topic, make_data("100b", options.rows))
    bench = t.Bench(bootstrap, "", "", Path(tempfile.mkdtemp()), {}, "null")
    sinks: list[tuple[str, dict[str, str]]] = [("noop", {}), ("noop_python", {})]
    if env:  # the newest line: its Arrow floor too
        sinks.append(("noop_arrow", {}))
    sinks.append(("kafka", {"kafka.bootstrap.servers": bootstrap, "topic": out}))
    sinks.append(("kafka_txn", {**bench.txn_options(uuid.uuid4().hex[:8]), "topic": out}))
    queries = [
        {
            "name": fmt,
            "bootstrap": bootstrap,
            "input": topic,
            "per_batch": options.per_batch,
            "variant": "100b",
            "shape": "kafka",
            "format": fmt,
            "checkpoint": str(bench.work / f"ck_{fmt}"),
            "options": opts,
            "timeout_s": t.QUERY_TIMEOUT_S,
        }
        for fmt, opts in sinks
    ]
    for name, batches in t.run_app(line, queries).items():
        print(f"{name:<12} {t.rows_per_s(batches):>10,.0f} rows/s {batches}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
