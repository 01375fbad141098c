"""The same metrics pushed over OTLP/HTTP, for users whose pipeline is OpenTelemetry's: after
each refresh, `OtlpPush.push()` sends what a scrape of the Prometheus registry would show, with
the OpenTelemetry SDK's own exporter (extra `otlp`).

One source of truth: every value comes from the registry's samples, so both routes always agree.
Counters go out as cumulative, monotonic sums named as their Prometheus family
(`kafka_txn_sink_rows`, which an OpenTelemetry-to-Prometheus bridge turns back into
`..._total`); gauges as gauges; a histogram as its Prometheus series, `_bucket` (with `le`),
`_sum` and `_count`, each a cumulative sum (the SDK has no asynchronous histogram). Labels are
attributes. Headers (an API key) come from `OTEL_EXPORTER_OTLP_HEADERS` or
`OTEL_EXPORTER_OTLP_METRICS_HEADERS`, read by the exporter: never from the command line, where
`ps` would show them.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry
from prometheus_client.samples import Sample

from kafka_txn_sink import extras
from kafka_txn_sink.metrics.exporter import PREFIX

if TYPE_CHECKING:
    from opentelemetry.metrics import CallbackOptions, Observation

log = logging.getLogger(__name__)

_SUMS = ("counter", "histogram")  # families whose samples are cumulative


class OtlpPush:
    """Pushes a registry's samples to an OTLP/HTTP endpoint on each `push()` (not thread-safe)."""

    def __init__(self, registry: CollectorRegistry, endpoint: str, timeout_s: float):
        """`endpoint`: the full URL, `http(s)://host:4318/v1/metrics` for a collector.

        Raises:
            MissingExtraError: the `otlp` extra is not installed.
        """
        extras.require("--otlp-endpoint", "otlp")
        # Imported here: the exporter's packages are the extra's.
        from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
        from opentelemetry.sdk.metrics import MeterProvider
        from opentelemetry.sdk.metrics.export import (
            MetricExportResult,
            PeriodicExportingMetricReader,
        )
        from opentelemetry.sdk.resources import Resource

        class Exporter(OTLPMetricExporter):
            """The SDK's exporter, remembering its last result: a flush does not report it."""

            succeeded: bool | None = None

            def export(self, *args: Any, **kwargs: Any) -> MetricExportResult:
                result = super().export(*args, **kwargs)
                self.succeeded = result is MetricExportResult.SUCCESS
                return result

        self._exporter = exporter = Exporter(endpoint=endpoint, timeout=timeout_s)
        # No interval of its own: push() exports right after the registry was refreshed.
        reader = PeriodicExportingMetricReader(exporter, export_interval_millis=math.inf)
        self._provider = MeterProvider(
            metric_readers=[reader], resource=Resource.create({"service.name": PREFIX})
        )
        self._meter = self._provider.get_meter("kafka_txn_sink")
        self._registry = registry
        self._timeout_ms = timeout_s * 1000
        self._latest: dict[str, list[tuple[float, dict[str, str]]]] = {}

    def push(self) -> bool:
        """Export the registry's current samples; False if the export did not succeed in time
        (logged by the exporter; the next push sends current values again)."""
        latest: dict[str, list[tuple[float, dict[str, str]]]] = {}
        for family in self._registry.collect():
            for sample in family.samples:
                if sample.name.endswith("_created"):
                    continue  # a counter's creation time: Prometheus' own, no value to chart
                name = _instrument_name(family.type, family.name, sample)
                if name not in self._latest and name not in latest:
                    self._create(name, family.type in _SUMS, family.documentation)
                latest.setdefault(name, []).append((sample.value, dict(sample.labels)))
        self._latest = latest
        self._exporter.succeeded = None
        self._provider.force_flush(timeout_millis=self._timeout_ms)
        pushed = bool(self._exporter.succeeded)
        if not pushed:
            log.warning("the metrics could not be pushed over OTLP in time; the next push retries")
        return pushed

    def close(self) -> None:
        """Stop the exporter (no final export)."""
        self._provider.shutdown(timeout_millis=self._timeout_ms)

    def _create(self, name: str, cumulative: bool, description: str) -> None:
        make = (
            self._meter.create_observable_counter
            if cumulative
            else self._meter.create_observable_gauge
        )
        make(name, callbacks=[self._observer(name)], description=description)

    def _observer(self, name: str) -> Callable[[CallbackOptions], Iterable[Observation]]:
        from opentelemetry.metrics import Observation

        def observe(options: CallbackOptions) -> Iterable[Observation]:
            return [Observation(value, labels) for value, labels in self._latest.get(name, [])]

        return observe


def _instrument_name(family_type: str, family_name: str, sample: Sample) -> str:
    """A counter's family name; a histogram's or a gauge's sample name."""
    return family_name if family_type == "counter" else sample.name
