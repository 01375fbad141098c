"""An OTLP/HTTP metrics receiver for the test bed, on loopback: what a collector's `otlp` receiver
takes in, decoded with OpenTelemetry's own protobuf definitions (`opentelemetry-proto`), kept
so a test can ask what arrived.

The machine has no OpenTelemetry Collector, and its Prometheus (Debian's 2.42) predates the
OTLP receiver; this one decodes the same requests a collector would and keeps every data point
of the newest request by name and attributes. It answers 200 with an empty response, as a
collector that took everything does.
"""

from __future__ import annotations

import gzip
import threading
from collections.abc import Iterable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType

from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
    ExportMetricsServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import KeyValue
from opentelemetry.proto.metrics.v1.metrics_pb2 import Metric, NumberDataPoint

from kafka_txn_sink.testing.processes import LOOPBACK

PATH = "/v1/metrics"


@dataclass(frozen=True)
class Received:
    """One metric of a request: its kind (`sum` or `gauge`), whether a sum is monotonic and
    cumulative, and its data points' values by sorted attributes."""

    kind: str
    monotonic_cumulative: bool
    values: dict[tuple[tuple[str, str], ...], float]


@dataclass
class OtlpReceiver:
    """`with OtlpReceiver() as receiver:` serves `receiver.endpoint` until the block ends."""

    requests: int = 0
    latest: dict[str, Received] = field(default_factory=dict)
    resource: dict[str, str] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _server: ThreadingHTTPServer | None = None

    @property
    def endpoint(self) -> str:
        """The URL to push to."""
        if self._server is None:
            raise RuntimeError("the receiver is not running")
        return f"http://{LOOPBACK}:{self._server.server_address[1]}{PATH}"

    def value(self, name: str, **attributes: str) -> float | None:
        """The newest value of `name` with exactly these attributes, or None."""
        with self._lock:
            received = self.latest.get(name)
            return None if received is None else received.values.get(_sorted(attributes))

    def __enter__(self) -> OtlpReceiver:
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                if self.headers.get("Content-Encoding") == "gzip":
                    body = gzip.decompress(body)
                if self.path != PATH:
                    self.send_error(404)
                    return
                receiver._take(ExportMetricsServiceRequest.FromString(body))
                answer = ExportMetricsServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, format: str, *args: object) -> None:
                return  # quiet: the tests say what they expected

        self._server = ThreadingHTTPServer((LOOPBACK, 0), Handler)
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def _take(self, request: ExportMetricsServiceRequest) -> None:
        latest = {}
        resource: dict[str, str] = {}
        for resource_metrics in request.resource_metrics:
            resource.update(_attributes(resource_metrics.resource.attributes))
            for scope in resource_metrics.scope_metrics:
                for metric in scope.metrics:
                    latest[metric.name] = _received(metric)
        with self._lock:
            self.requests += 1
            self.latest = latest
            self.resource = resource


def _received(metric: Metric) -> Received:
    if metric.HasField("sum"):
        cumulative = metric.sum.aggregation_temporality == 2  # AGGREGATION_TEMPORALITY_CUMULATIVE
        points = metric.sum.data_points
        return Received("sum", metric.sum.is_monotonic and cumulative, _values(points))
    if metric.HasField("gauge"):
        return Received("gauge", False, _values(metric.gauge.data_points))
    return Received(metric.WhichOneof("data") or "none", False, {})


def _values(points: Iterable[NumberDataPoint]) -> dict[tuple[tuple[str, str], ...], float]:
    found = {}
    for point in points:
        value = point.as_double if point.HasField("as_double") else float(point.as_int)
        found[_sorted(_attributes(point.attributes))] = value
    return found


def _attributes(pairs: Iterable[KeyValue]) -> dict[str, str]:
    return {kv.key: kv.value.string_value for kv in pairs}


def _sorted(attributes: dict[str, str]) -> tuple[tuple[str, str], ...]:
    return tuple(sorted(attributes.items()))
