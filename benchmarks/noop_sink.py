"""The floor of a Python streaming sink in Spark: a data source that writes nothing.

    .venv/bin/python benchmarks/noop_sink.py [--python .venv-spark42/bin/python]

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
        rows = 0
        for item in iterator:
            rows += getattr(item, "num_rows", 1)
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
        pass


class NoopArrowSource(DataSource):
    @classmethod
    def name(cls) -> str:
        return "noop_arrow"

    def streamWriter(self, schema: Any, overwrite: bool) -> DataSourceStreamWriter:
        if ArrowWriterBase is None:
            raise RuntimeError("noop_arrow needs PySpark 4.1+ (DataSourceStreamArrowWriter)")
        return NoopArrowWriter()


def main() -> int:
    import throughput as t

    from tests.e2e.harness import create_topics

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--python", default=sys.executable)
    parser.add_argument("--rows", type=int, default=60)
    parser.add_argument("--per-batch", type=int, default=6)
    options = parser.parse_args()
    bootstrap = os.environ["KTS_KAFKA_BOOTSTRAP"]
    python = str(Path(options.python).absolute())
    env = t.testing.spark42_package_env() if python != sys.executable else {}
    jars = t.jars_of(python, env)
    topic = f"noop_in_{uuid.uuid4().hex[:8]}"
    create_topics(bootstrap, 2, topic)
    data = t.make_data("100b", options.rows, topic)
    t.produce_all(bootstrap, topic, data)
    work = Path(tempfile.mkdtemp())
    bench = t.Bench(bootstrap, "", work, options.per_batch, 2, {"x": (python, jars, env)})
    out = f"noop_out_{uuid.uuid4().hex[:8]}"
    create_topics(bootstrap, 2, out)
    sinks: list[tuple[str, str, dict[str, str]]] = [
        ("noop (JVM)", "noop", {}),
        ("noop_python", "noop_python", {}),
    ]
    if python != sys.executable:  # the 4.2 venv: its Arrow floor too
        sinks.append(("noop_arrow", "noop_arrow", {}))
    for label, fmt, opts in [
        *sinks,
        ("kafka (built-in)", "kafka", {"kafka.bootstrap.servers": bootstrap, "topic": out}),
        ("kafka_txn", "kafka_txn", {**bench.txn_options(uuid.uuid4().hex[:8]), "topic": out}),
    ]:
        bench.run("x", label, fmt, "kafka", data, opts)
    return 0


if __name__ == "__main__":
    sys.exit(main())
