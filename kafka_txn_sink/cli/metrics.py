"""`metrics`: serve the sink's metrics for Prometheus to scrape (kafka_txn_sink/metrics/).

It runs beside the query (a sidecar, or a process on the driver's node): it reads the commit
log and asks the brokers every `--interval` seconds, and serves the newest values on
`--listen`, or pushes them over OTLP to `--otlp-endpoint` (metrics/otlp.py), or both; `--once`
prints them instead, in the text format a scrape gets.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import signal
import sys
import threading
import time
from collections.abc import Iterator
from types import FrameType
from typing import Any

from prometheus_client import generate_latest, start_http_server

from kafka_txn_sink.cli.common import (
    CliError,
    brokers,
    kafka_options,
    kafka_settings,
    log_options,
    open_log,
    s3_settings,
    sink_id_of,
)
from kafka_txn_sink.cli.render import Output
from kafka_txn_sink.commit_log import CommitLog
from kafka_txn_sink.kafka.cluster import Cluster
from kafka_txn_sink.kafka.txn_admin import TxnAdmin
from kafka_txn_sink.metrics.batches import LogReader
from kafka_txn_sink.metrics.exporter import SinkMetrics
from kafka_txn_sink.metrics.guard import GuardReading, look
from kafka_txn_sink.metrics.otlp import OtlpPush
from kafka_txn_sink.protocol.messages import Decision
from kafka_txn_sink.storage import open_storage

DEFAULT_LISTEN = "127.0.0.1:9464"
DEFAULT_INTERVAL_S = 15.0
OK = 0
NOT_ALL_READ = 1  # --once: the log or the brokers could not be read (the output says which)


def add_parser(commands: Any) -> None:
    """Register `metrics` on the CLI's subcommands."""
    metrics = commands.add_parser(
        "metrics",
        parents=[log_options(), kafka_options()],
        help="serve the sink's metrics (commit log and open transactions) for Prometheus",
    )
    metrics.add_argument(
        "--listen",
        metavar="HOST:PORT",
        help=f"where to serve /metrics (default {DEFAULT_LISTEN}, or nowhere with "
        "--otlp-endpoint; 0.0.0.0:PORT for every interface)",
    )
    metrics.add_argument(
        "--otlp-endpoint",
        metavar="URL",
        help="also push the metrics after each read over OTLP/HTTP, to this URL (a collector's "
        "http(s)://HOST:4318/v1/metrics; headers from OTEL_EXPORTER_OTLP_HEADERS; extra otlp)",
    )
    metrics.add_argument(
        "--interval",
        type=float,
        default=DEFAULT_INTERVAL_S,
        metavar="SECONDS",
        help=f"how often to read the log and ask the brokers (default {DEFAULT_INTERVAL_S:g})",
    )
    metrics.add_argument(
        "--history",
        type=int,
        default=0,
        metavar="N",
        help="the counters start N batches before the newest when the exporter starts "
        "(default 0: they count from its start; a restart with N counts those N again)",
    )
    metrics.add_argument(
        "--once",
        action="store_true",
        help="print the metrics once (text format) and exit: 0, or 1 when the log or the "
        "brokers could not be read",
    )
    metrics.add_argument(
        "--duration",
        type=float,
        metavar="SECONDS",
        help="stop serving after this long (default: until interrupted)",
    )
    metrics.set_defaults(func=cmd_metrics)


def cmd_metrics(args: argparse.Namespace, out: Output) -> int:
    """`metrics`: refresh every interval and serve, or print once."""
    listen = args.listen or (None if args.otlp_endpoint else DEFAULT_LISTEN)
    address = None if listen is None else _listen_address(listen)
    if args.interval <= 0:
        raise CliError(f"--interval must be positive, not {args.interval:g}")
    if args.history < 0:
        raise CliError(f"--history must be 0 or more, not {args.history}")
    commit_log, log_sink_id = open_log(args)
    sink_id = sink_id_of(args, log_sink_id)
    guard = _Guard(args, sink_id, commit_log)
    try:
        metrics = SinkMetrics(
            sink_id,
            LogReader(commit_log, history=args.history),
            guard.look,
            task_errors=open_storage(args.log, s3_settings(args)),
        )
        metrics.refresh()
        if args.once:
            sys.stdout.write(generate_latest(metrics.registry).decode())
            return OK if metrics.all_up() else NOT_ALL_READ
        with contextlib.ExitStack() as stack:
            if address is not None:
                stack.enter_context(_serving(metrics, address, listen or ""))
                print(f"serving {sink_id}'s metrics on http://{listen}/metrics", flush=True)
            push = None
            if args.otlp_endpoint:
                push = OtlpPush(metrics.registry, args.otlp_endpoint, args.timeout_ms / 1000)
                stack.callback(push.close)
                push.push()
                print(f"pushing {sink_id}'s metrics to {args.otlp_endpoint}", flush=True)
            _refresh_until_stopped(metrics, push, args.interval, args.duration)
    finally:
        guard.close()
    return OK


@contextlib.contextmanager
def _serving(metrics: SinkMetrics, address: tuple[str, int], listen: str) -> Iterator[None]:
    """Serve `metrics` on `address` while the block runs."""
    host, port = address
    try:
        server, _ = start_http_server(port, host, registry=metrics.registry)
    except OSError as exc:
        raise CliError(f"--listen {listen}: cannot serve there ({exc.strerror})") from exc
    try:
        yield
    finally:
        server.shutdown()
        server.server_close()


class _Guard:
    """The guard's look at the brokers, with clients made on first use and made again after a
    failure: an exporter started before its brokers are reachable serves `guard_up 0` until
    they are, rather than not at all."""

    def __init__(self, args: argparse.Namespace, sink_id: str, commit_log: CommitLog):
        self._args = args
        self._sink_id = sink_id
        self._log = commit_log
        self._clients: tuple[TxnAdmin, Cluster] | None = None

    def look(self, latest: Decision | None) -> GuardReading:
        """One reading (metrics/guard.py `look`), watching `latest`'s partitions too.

        Raises:
            KafkaTxnSinkError (or another error): the brokers could not be asked; the clients
                are made anew next time.
        """
        if self._clients is None:
            args = self._args
            txn_admin = brokers(args)  # first: it fails at once when nothing answers
            try:
                cluster = Cluster(args.bootstrap, kafka_settings(args), args.timeout_ms)
            except BaseException:
                txn_admin.close()
                raise
            self._clients = (txn_admin, cluster)
        txn_admin, cluster = self._clients
        try:
            return look(self._sink_id, self._log, txn_admin, cluster, latest)
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        """Close the clients, if any."""
        if self._clients is not None:
            self._clients[0].close()
            self._clients = None


def _refresh_until_stopped(
    metrics: SinkMetrics, push: OtlpPush | None, interval_s: float, duration_s: float | None
) -> None:
    """Refresh (and push) every `interval_s` until SIGTERM, SIGINT or `duration_s` has
    passed."""
    stop = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    deadline = math.inf if duration_s is None else time.monotonic() + duration_s
    while True:
        left = deadline - time.monotonic()
        if left <= 0 or stop.wait(min(interval_s, left)):
            return
        metrics.refresh()
        if push is not None:
            push.push()


def _listen_address(listen: str) -> tuple[str, int]:
    """`HOST:PORT` split; a CliError naming --listen when it is not that."""
    host, _, port = listen.rpartition(":")
    if not host or not port.isdigit():
        raise CliError(f"--listen must be HOST:PORT, not {listen!r}")
    return host.strip("[]"), int(port)
