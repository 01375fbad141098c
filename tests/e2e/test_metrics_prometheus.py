"""The sink's metrics as a platform team meets them: a real Prometheus (Debian's package)
scrapes `kafka-txn-sink metrics` (which also pushes them over OTLP) beside a query whose driver
is frozen with its tasks' transactions prepared and then killed; the guard shows the frozen
batch's transactions and the partitions they hold back within a scrape, and once the restarted
query has caught up, the counters say what a read_committed consumer counts and the guard is
clear. Every value is read through Prometheus' query API, not from the endpoint, and the OTLP
receiver got the same."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from kafka_txn_sink.testing.otlp_receiver import OtlpReceiver
from kafka_txn_sink.testing.processes import LOOPBACK, free_port, spawn, tail, terminate
from kafka_txn_sink.testing.prometheus import Prometheus
from tests.e2e.harness import Pipeline, assert_exactly_once, kill_group, produce_ids

pytestmark = [pytest.mark.kafka, pytest.mark.spark]

DASHBOARD = (
    Path(__file__).resolve().parents[2] / "examples" / "grafana" / "kafka_txn_sink_dashboard.json"
)
N = 500  # batch 0 of 400 rows (maxOffsetsPerTrigger), batch 1 of 100
SCRAPE_S = 0.5


@pytest.fixture
def exporter_port() -> int:
    return free_port()


def start_exporter(pipeline: Pipeline, port: int, otlp: str) -> subprocess.Popen[bytes]:
    """`kafka-txn-sink metrics` on `port` and pushing to `otlp`, as a sidecar runs it
    (bounded: 10 minutes)."""
    command = [
        sys.executable,
        "-m",
        "kafka_txn_sink",
        "metrics",
        "--log",
        str(pipeline.commit_log),
        "--bootstrap",
        pipeline.bootstrap,
        "--listen",
        f"{LOOPBACK}:{port}",
        "--otlp-endpoint",
        otlp,
        "--interval",
        str(SCRAPE_S),
        "--history",  # batch 0 was decided before the exporter started: count it too
        "10",
        "--duration",
        "600",
    ]
    log = pipeline.workdir / "exporter.log"
    return spawn(command, log, pipeline.workdir, detached=False)


@pytest.fixture
def prometheus(tmp_path: Path, exporter_port: int) -> Iterator[Prometheus]:
    with Prometheus(tmp_path / "prometheus", [f"{LOOPBACK}:{exporter_port}"], SCRAPE_S) as server:
        yield server


def eventually(
    prometheus: Prometheus, promql: str, holds: Callable[[float | None], bool]
) -> float | None:
    """The value of `promql` once `holds` is true of it (30 s at most)."""
    deadline = time.monotonic() + 30
    while True:
        found = prometheus.value(promql)
        if holds(found):
            return found
        if time.monotonic() > deadline:
            raise AssertionError(f"{promql} is still {found} after 30 s")
        time.sleep(0.25)


def assert_dashboard_queries_answer(prometheus: Prometheus, sink_id: str) -> None:
    """Every query of the Grafana dashboard in examples/ evaluates on this Prometheus, and those
    of the panels that always have data (throughput, latency, lag, open transactions) have it."""
    dashboard = json.loads(DASHBOARD.read_text())
    empty = []
    for panel in dashboard["panels"]:
        for target in panel["targets"]:
            expr = (
                target["expr"]
                .replace("$sink_id", sink_id)
                .replace("$__rate_interval", "1m")
                .replace("$__range", "10m")
            )
            if not prometheus.query(expr):
                empty.append((panel["title"], expr))
    always = {
        "Rows committed per second",
        "Commit latency (decision to completion)",
        "Read_committed lag (high watermark - last stable offset)",
        "Open transactions",
    }
    assert not [title for title, _ in empty if title in always], empty


@pytest.fixture
def otlp() -> Iterator[OtlpReceiver]:
    with OtlpReceiver() as receiver:
        yield receiver


def pushed(
    otlp: OtlpReceiver, name: str, holds: Callable[[float | None], bool], **labels: str
) -> float | None:
    """The pushed value of `name` once `holds` is true of it (30 s at most)."""
    deadline = time.monotonic() + 30
    while not holds(found := otlp.value(name, **labels)):
        if time.monotonic() > deadline:
            raise AssertionError(f"{name} {labels} pushed is still {found} after 30 s")
        time.sleep(0.25)
    return found


def test_prometheus_sees_a_frozen_batch_then_every_row_once_after_the_kill(
    pipeline: Pipeline, prometheus: Prometheus, exporter_port: int, otlp: OtlpReceiver
) -> None:
    ids = produce_ids(pipeline.bootstrap, pipeline.input, N)
    process = pipeline.start("driver.before_decision=block@1")
    pipeline.wait_reached("driver.before_decision", process)
    exporter = start_exporter(pipeline, exporter_port, otlp.endpoint)
    try:
        # Batch 1's tasks prepared, not decided: its transactions are open and a run may still
        # decide them; each partition they wrote to trails its high watermark.
        sink = f'sink_id="{pipeline.sink_id}"'
        live = eventually(
            prometheus,
            f'kafka_txn_sink_open_transactions{{{sink},state="live"}}',
            lambda v: bool(v),
        )
        assert live is not None and 1 <= live <= 3  # one per task that got rows
        assert prometheus.value(f"kafka_txn_sink_oldest_open_transaction_age_seconds{{{sink}}}")
        held = prometheus.query(f"kafka_txn_sink_partition_held_seconds{{{sink}}}")
        lagging = prometheus.query(f"kafka_txn_sink_partition_lso_lag{{{sink}}} > 0")
        assert held and lagging
        assert {r["metric"]["topic"] for r in held} == {pipeline.output}
        # The same reading, pushed over OTLP.
        state = {"sink_id": pipeline.sink_id, "state": "live"}
        pushed(otlp, "kafka_txn_sink_open_transactions", lambda v: v == live, **state)
        assert prometheus.value(f"kafka_txn_sink_batches_total{{{sink}}}") == 1  # batch 0 only

        kill_group(process)
        outcome = pipeline.run()
        assert outcome.returncode == 0, outcome.error
        report = assert_exactly_once(pipeline, ids)
        # Spark's own progress counts the rows the restarted query wrote (batch 1, replayed),
        # and describes every Python sink by Spark's class name (PythonTable has no toString).
        first = pipeline.open_log().decision(0)
        assert first is not None
        assert outcome.result["sink_rows"] == N - first.rows
        assert ".v2.python.PythonTable@" in str(outcome.result["sink"])

        decided = len(pipeline.open_log().decided_batches())
        eventually(prometheus, f"kafka_txn_sink_batches_total{{{sink}}}", lambda v: v == decided)
        assert prometheus.value(f"kafka_txn_sink_rows_total{{{sink}}}") == report.seen == N
        for step in ("completion", "decide", "slowest_task", "decision_write", "settle"):
            count = prometheus.value(f"kafka_txn_sink_{step}_seconds_count{{{sink}}}")
            assert count == decided, step
        assert prometheus.value(f"kafka_txn_sink_incomplete_batches{{{sink}}}") == 0
        assert prometheus.value(f"kafka_txn_sink_lost_rows_total{{{sink}}}") == 0
        bytes_sent = prometheus.value(f"kafka_txn_sink_record_bytes_total{{{sink}}}")
        assert bytes_sent is not None and bytes_sent >= N * 8  # every id's record, and more
        # The guard is clear: no open transaction of the sink, nothing held back.
        eventually(prometheus, f"sum(kafka_txn_sink_open_transactions{{{sink}}})", lambda v: v == 0)
        assert prometheus.query(f"kafka_txn_sink_partition_held_seconds{{{sink}}}") == []
        assert prometheus.value(f"max(kafka_txn_sink_partition_lso_lag{{{sink}}})") == 0
        assert prometheus.value(f"kafka_txn_sink_guard_up{{{sink}}}") == 1
        assert_dashboard_queries_answer(prometheus, pipeline.sink_id)
        # What was pushed over OTLP agrees: counters as cumulative sums, the guard clear.
        mine = {"sink_id": pipeline.sink_id}
        pushed(otlp, "kafka_txn_sink_batches", lambda v: v == decided, **mine)
        assert otlp.value("kafka_txn_sink_rows", **mine) == N
        assert otlp.latest["kafka_txn_sink_rows"].monotonic_cumulative
        assert otlp.value("kafka_txn_sink_completion_seconds_count", **mine) == decided
        pushed(otlp, "kafka_txn_sink_open_transactions", lambda v: v == 0, **state)
    except BaseException:
        print(tail(pipeline.workdir / "exporter.log"))
        raise
    finally:
        terminate(exporter, 10)
