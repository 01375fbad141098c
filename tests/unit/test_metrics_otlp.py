"""The metrics pushed over OTLP/HTTP carry what a Prometheus scrape shows: counters as
cumulative monotonic sums, gauges as gauges, histograms as their series; a collector that does
not answer costs a bounded wait and a warning, never the exporter."""

from __future__ import annotations

import logging
import time
from dataclasses import replace
from pathlib import Path

import pytest

from kafka_txn_sink.commit_log import JsonCommitLog
from kafka_txn_sink.metrics.batches import LogReader
from kafka_txn_sink.metrics.exporter import SinkMetrics
from kafka_txn_sink.metrics.otlp import OtlpPush
from kafka_txn_sink.protocol.messages import Completion
from kafka_txn_sink.protocol.run_records import SinkMeta
from kafka_txn_sink.protocol.stats import BatchStats
from kafka_txn_sink.storage import LocalStorage
from kafka_txn_sink.testing.otlp_receiver import OtlpReceiver
from kafka_txn_sink.testing.processes import LOOPBACK, free_port
from tests.unit.test_cli import DECIDED_AT_MS, decision
from tests.unit.test_metrics import value


@pytest.fixture
def metrics(tmp_path: Path) -> tuple[JsonCommitLog, SinkMetrics]:
    commit_log = JsonCommitLog(LocalStorage(tmp_path / "log"))
    commit_log.create(SinkMeta("orders", created_at_ms=1))
    return commit_log, SinkMetrics("orders", LogReader(commit_log, history=5), guard=None)


def test_a_push_carries_the_scrapes_values_and_the_next_push_the_new_ones(
    metrics: tuple[JsonCommitLog, SinkMetrics],
) -> None:
    commit_log, sink = metrics
    stats = BatchStats(bytes=10, slowest_task_ms=800, decide_ms=40, margin_left_ms=52_000)
    commit_log.put_decision(replace(decision(0), stats=stats))
    commit_log.put_completion(Completion("orders", 0, DECIDED_AT_MS + 250))
    sink.refresh()
    with OtlpReceiver() as receiver:
        push = OtlpPush(sink.registry, receiver.endpoint, timeout_s=5)
        try:
            assert push.push()
            rows = receiver.latest["kafka_txn_sink_rows"]
            assert rows.kind == "sum" and rows.monotonic_cumulative
            assert receiver.value("kafka_txn_sink_rows", sink_id="orders") == 30
            assert value(sink, "kafka_txn_sink_rows_total") == 30  # the scrape agrees
            assert receiver.latest["kafka_txn_sink_last_decided_batch"].kind == "gauge"
            assert receiver.value("kafka_txn_sink_margin_left_seconds", sink_id="orders") == 52
            assert receiver.value("kafka_txn_sink_completion_seconds_count", sink_id="orders") == 1
            bucket = receiver.value(
                "kafka_txn_sink_completion_seconds_bucket", sink_id="orders", le="0.25"
            )
            assert bucket == 1
            assert receiver.resource["service.name"] == "kafka_txn_sink"

            commit_log.put_decision(decision(1))
            sink.refresh()
            assert push.push()
            assert receiver.value("kafka_txn_sink_rows", sink_id="orders") == 60
            assert receiver.value("kafka_txn_sink_last_decided_batch", sink_id="orders") == 1
            assert receiver.requests == 2
        finally:
            push.close()


def test_a_collector_that_does_not_answer_costs_a_bounded_wait_and_a_warning(
    metrics: tuple[JsonCommitLog, SinkMetrics], caplog: pytest.LogCaptureFixture
) -> None:
    _, sink = metrics
    sink.refresh()
    push = OtlpPush(sink.registry, f"http://{LOOPBACK}:{free_port()}/v1/metrics", timeout_s=2)
    started = time.monotonic()
    try:
        with caplog.at_level(logging.WARNING):
            assert not push.push()
    finally:
        push.close()
    assert time.monotonic() - started < 10
    assert "could not be pushed over OTLP" in caplog.text
