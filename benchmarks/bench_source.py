"""`format("kafka_txn_measured")`: kafka_txn whose tasks append their peak RSS to a file.

Used by benchmarks/throughput.py for the executor memory figures; Spark's Python workers import
this module (the benchmark puts benchmarks/ on their PYTHONPATH) when they unpickle the writer.
The file is named by KTS_BENCH_RSS_FILE in the environment the workers inherit.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from typing import Any

from pyspark.sql.datasource import DataSourceStreamWriter
from pyspark.sql.types import StructType

from kafka_txn_sink.datasource import KafkaTxnDataSource
from kafka_txn_sink.protocol.stream_writer import KafkaTxnStreamArrowWriter, KafkaTxnStreamWriter
from kafka_txn_sink.protocol.task_commit import TaskCommit


def _status_kb(field: str) -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return -1


def _record(result: TaskCommit, writer: str) -> None:
    path = os.environ.get("KTS_BENCH_RSS_FILE")
    if not path:
        return
    body = {
        "pid": os.getpid(),
        "rows": result.rows,
        "batch": result.batch_id,
        "writer": writer,
        "peak_rss_kb": _status_kb("VmHWM"),
        "rss_kb": _status_kb("VmRSS"),
    }
    with open(path, "a") as out:
        out.write(json.dumps(body) + "\n")


class MeasuredRowWriter(KafkaTxnStreamWriter):
    def write(self, iterator: Iterator[Any]) -> TaskCommit:
        result = super().write(iterator)
        _record(result, "rows")
        return result


class MeasuredArrowWriter(KafkaTxnStreamArrowWriter):
    def write(self, iterator: Iterator[Any]) -> TaskCommit:
        result = super().write(iterator)
        _record(result, "arrow")
        return result


class MeasuredKafkaTxn(KafkaTxnDataSource):
    @classmethod
    def name(cls) -> str:
        return "kafka_txn_measured"

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        writer = super().streamWriter(schema, overwrite)
        arrow = isinstance(writer, KafkaTxnStreamArrowWriter)
        writer.__class__ = MeasuredArrowWriter if arrow else MeasuredRowWriter
        return writer
