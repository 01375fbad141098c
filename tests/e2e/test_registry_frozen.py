"""A Schema Registry that stops answering while a batch commits (issue 39, N4).

Spark builds the writer again (`streamWriter()`) in the Python worker that runs a batch's
`commit()` or `abort()`. The commit needs neither the registry (the decision's schemas come from
the tasks) nor the consumer group's member check, so a registry that does not answer at that
moment must not leave the batch's transactions open until the brokers' timeout. The registry
here sits behind a loopback proxy that, while frozen, answers nothing (as a registry under
SIGSTOP); it is frozen after the tasks of batch 1 flushed, and thawed only once batch 1 is
complete. The proxy also counts schema registrations: one per batch's planning, no more.
"""

from __future__ import annotations

import threading
import time

import pytest

from kafka_txn_sink import testing
from kafka_txn_sink.testing.schema_registry import CCOMPAT_PATH
from tests.e2e.harness import Pipeline, assert_exactly_once, finish, produce_ids
from tests.e2e.test_registry_formats import decoded_values, with_format
from tests.s3_proxy import HeaderDroppingProxy

pytestmark = [pytest.mark.kafka, pytest.mark.spark, pytest.mark.registry]

N = 500  # batch 0 of 400 rows (maxOffsetsPerTrigger), batch 1 of 100
HELD = "task.after_flush"


class FreezableProxy(HeaderDroppingProxy):
    """Forwards everything to the registry, but holds every request unanswered while frozen;
    counts the schema registrations (POSTs to a subject's versions) it forwarded."""

    def __init__(self, registry: testing.SchemaRegistry) -> None:
        super().__init__(registry.base_url, drop=(), lifetime_s=600.0, timeout_s=60.0)
        self._thawed = threading.Event()
        self._thawed.set()
        self.held = 0
        self.registrations = 0

    @property
    def url(self) -> str:
        """The proxy's address of the Confluent-compatible API: schema.registry.url."""
        return self.endpoint + CCOMPAT_PATH

    def freeze(self) -> None:
        self._thawed.clear()

    def thaw(self) -> None:
        self._thawed.set()

    def forward(
        self, method: str, path: str, headers: list[tuple[str, str]], body: bytes
    ) -> tuple[int, str, list[tuple[str, str]], bytes]:
        if not self._thawed.is_set():
            with self._lock:
                self.held += 1
            self._thawed.wait(300)
        if method == "POST" and path.split("?")[0].rstrip("/").endswith("/versions"):
            with self._lock:
                self.registrations += 1
        return super().forward(method, path, headers, body)


def test_a_batch_commits_while_the_registry_does_not_answer(
    pipeline: Pipeline, schema_registry: testing.SchemaRegistry
) -> None:
    with FreezableProxy(schema_registry) as proxy:
        with_format(pipeline, schema_registry, "avro")
        pipeline.options["schema.registry.url"] = proxy.url
        ids = produce_ids(pipeline.bootstrap, pipeline.input, N)
        process = pipeline.start(f"{HELD}=block@1")
        pipeline.wait_reached(HELD, process)
        proxy.freeze()
        pipeline.release(HELD)
        log = pipeline.open_log()
        deadline = time.monotonic() + 60
        while log.completion(1) is None and time.monotonic() < deadline:
            time.sleep(0.2)
        completed_while_frozen = log.completion(1) is not None
        held_while_frozen = proxy.held
        proxy.thaw()
        outcome = finish(process)

        assert completed_while_frozen, (
            f"batch 1 was not complete 60 s after the registry froze ({held_while_frozen} "
            f"requests held): {outcome.error}"
        )
        assert outcome.returncode == 0, outcome.error
        assert_exactly_once(pipeline, ids)
        assert sorted(v["id"] for v in decoded_values(pipeline, schema_registry, "avro")) == sorted(
            ids
        )
        batches = outcome.result["batches"]
        assert isinstance(batches, list)
        # One registration per batch's planning (the writer Spark builds for the tasks).
        assert proxy.registrations == len(batches), (proxy.registrations, batches)
