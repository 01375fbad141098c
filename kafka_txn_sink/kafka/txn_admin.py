"""Talks to the transaction coordinators: EndTxn for transactions opened by other processes,
DescribeTransactions for the prepare check, ListTransactions for the clean-up; and to group
coordinators: OffsetFetch (librdkafka's AdminClient crashes the process when a group coordinator
answers it NOT_COORDINATOR: it looks the coordinator up again through a consumer-group handle an
admin client does not have).

No Kafka client commits a transaction it did not open (KIP-939 is unreleased), so the driver
sends EndTxn itself. The broker checks only (transactional id, producer id, epoch) and the WRITE
ACL on the transactional id, not the connection. Requests go through kafka-python's admin
connection manager (a private interface of the pinned kafka-python), which brings SASL and TLS.
EndTxn is sent at version <= 3, the transaction protocol (TV1) librdkafka's tasks use.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import kafka.errors as kafka_errors
from kafka.admin import KafkaAdminClient
from kafka.protocol.admin.transactions import (
    DescribeTransactionsRequest,
    ListTransactionsRequest,
)
from kafka.protocol.consumer import OffsetFetchRequest
from kafka.protocol.metadata import CoordinatorType, FindCoordinatorRequest
from kafka.protocol.producer import EndTxnRequest

from kafka_txn_sink.errors import KafkaTxnSinkError, KafkaUnavailableError
from kafka_txn_sink.kafka.admin_api import NOT_FOUND, ONGOING, EndTxnResult, TxnState
from kafka_txn_sink.kafka.client_cache import ClientCache
from kafka_txn_sink.kafka.permissions import refused
from kafka_txn_sink.kafka.security import driver_settings
from kafka_txn_sink.protocol.messages import Triple

log = logging.getLogger(__name__)

__all__ = ["NOT_FOUND", "ONGOING", "EndTxnResult", "TxnAdmin", "TxnState", "shared_txn_admin"]

END_TXN_MAX_VERSION = 3
# OffsetFetch by group and topic names with require_stable (Kafka 3.0+); v10 names topics by id.
OFFSET_FETCH_VERSIONS = (8, 9)
# Requests pipelined on one connection; EndTxns beyond it wait for a slot in `end_transactions`.
MAX_IN_FLIGHT = 256
# A broker answers one connection's requests one after another, and a replicated coordinator
# answers an EndTxn only once its transaction-log write is replicated: so a large EndTxn round
# takes more clients (each its own connections, in its own thread), one per this many EndTxns,
# up to MAX_END_TXN_CLIENTS. 1,024 EndTxns on a 3-node cluster: 1,448 ms on one connection,
# 701 ms on eight (docs/performance.md).
END_TXN_PER_CLIENT = 128
MAX_END_TXN_CLIENTS = 8
# A helper client that cannot connect this fast is left out: the round goes on with fewer, and
# its deadline (set before) bounds the whole round as it does with one client.
HELPER_CONNECT_MS = 5_000


def admin_settings(
    bootstrap: str, kafka: Mapping[str, str], timeout_ms: int, connect_ms: int | None = None
) -> dict[str, Any]:
    """kafka-python admin settings from the sink's librdkafka-style `kafka.*` settings (checked
    with `security.check_driver_support` when the options were read)."""
    settings: dict[str, Any] = {
        "bootstrap_servers": bootstrap,
        "client_id": "kafka-txn-sink-driver",
        "request_timeout_ms": timeout_ms,
        "bootstrap_timeout_ms": timeout_ms if connect_ms is None else connect_ms,
        "reconnect_backoff_max_ms": 1000,
        # kafka-python's default of 5 makes every further request fail at once with "node
        # paused", so EndTxn for more than 5 participants crawled through retries and backoff
        # (2.6 s for 32, measured) or stalled until the deadline on a fresh connection.
        "max_in_flight_requests_per_connection": MAX_IN_FLIGHT,
    }
    settings.update(driver_settings(kafka, bootstrap))
    return settings


class TxnAdmin:
    """A driver-side client of the transaction coordinators. Close it when done."""

    def __init__(
        self,
        bootstrap: str,
        kafka: Mapping[str, str],
        timeout_ms: int = 30_000,
        connect_ms: int | None = None,
    ):
        """`timeout_ms` bounds each request; `connect_ms` the first connection (default: the
        same)."""
        self._bootstrap = bootstrap
        self._timeout_ms = timeout_ms
        self._kafka = dict(kafka)
        self._helpers: list[TxnAdmin] = []  # more clients for large EndTxn rounds
        self._helpers_lock = threading.Lock()
        self._helper_failed = False  # once one could not connect, rounds use what there is
        try:
            self._admin = KafkaAdminClient(
                **admin_settings(bootstrap, kafka, timeout_ms, connect_ms)
            )
        except kafka_errors.KafkaError as exc:
            raise KafkaUnavailableError(
                f"cannot reach Kafka at kafka.bootstrap.servers={bootstrap}: {exc}"
            ) from exc
        self._manager = self._admin._manager
        self._net = self._manager._net
        # One request round at a time per client: a shared client may be used from several
        # threads, and kafka-python drives its loop on the caller's thread when it has no IO
        # thread of its own.
        self._lock = threading.RLock()

    def close(self) -> None:
        """Close the connections (best effort)."""
        with self._helpers_lock:
            helpers, self._helpers = self._helpers, []
        for helper in helpers:
            helper.close()
        try:
            self._admin.close()
        except Exception:  # closing is best effort; the sockets die with the process anyway
            log.debug("closing the admin client failed", exc_info=True)

    def __enter__(self) -> TxnAdmin:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    # -- EndTxn -----------------------------------------------------------------------------

    def end_transactions(
        self, triples: Iterable[Triple], commit: bool, deadline_s: float
    ) -> list[EndTxnResult]:
        """Send EndTxn for every triple at once; retriable errors are retried until the deadline.

        A repeated commit of a committed transaction answers success. Any other error is
        reported, not raised: an error is not proof that the transaction was not committed.
        """
        wanted = list(triples)
        if not wanted:
            return []
        deadline = time.monotonic() + deadline_s
        ids = [t.transactional_id for t in wanted]
        clients = self._end_txn_clients(len(wanted), deadline)
        if len(clients) == 1:
            results = self._end_on_this_client(wanted, commit, deadline, ids)
        else:
            results = _end_split(clients, wanted, commit, deadline, ids)
        for result in results:
            # Refused, the EndTxn did nothing: that is no question of the transaction's fate.
            refusal = kafka_errors.TransactionalIdAuthorizationFailedError.__name__
            if (result.error or "").split(":", 1)[0] == refusal:
                raise self._refusal(
                    kafka_errors.TransactionalIdAuthorizationFailedError(), "EndTxn", ids
                )
        return results

    def _end_txn_clients(self, count: int, deadline: float) -> list[TxnAdmin]:
        """This client and as many helpers as `count` EndTxns take (made once, then kept)."""
        wanted = min(MAX_END_TXN_CLIENTS, -(-count // END_TXN_PER_CLIENT))
        with self._helpers_lock:
            while len(self._helpers) < wanted - 1 and not self._helper_failed:
                connect_ms = min(HELPER_CONNECT_MS, int((deadline - time.monotonic()) * 1000))
                if connect_ms < 100:  # no time left to connect: this round goes with fewer
                    break
                try:
                    helper = TxnAdmin(self._bootstrap, self._kafka, self._timeout_ms, connect_ms)
                except KafkaTxnSinkError as exc:
                    log.warning("EndTxn goes over %d client(s): %s", len(self._helpers) + 1, exc)
                    self._helper_failed = True
                    break
                self._helpers.append(helper)
            return [self, *self._helpers[: wanted - 1]]

    def _end_on_this_client(
        self, wanted: list[Triple], commit: bool, deadline: float, ids: Sequence[str]
    ) -> list[EndTxnResult]:
        """EndTxn for `wanted` on this client's connections, MAX_IN_FLIGHT // 2 at a time."""

        async def run_all(chunk: list[Triple]) -> list[EndTxnResult]:
            # One batched FindCoordinator for every id first (cached afterwards), then every
            # EndTxn at once. kafka-python runs its own event loop (not asyncio): schedule all,
            # then await each. The batched lookup only saves requests: when it times out, each
            # EndTxn looks its coordinator up again and reports its own error by the deadline.
            try:
                if time.monotonic() < deadline:
                    await self._coordinators_of((t.transactional_id for t in chunk), deadline)
            except kafka_errors.KafkaError as exc:
                if not getattr(exc, "retriable", False):
                    raise  # a refusal names its permission (`_run`)
                log.debug("the batched FindCoordinator failed: %s", type(exc).__name__)
            futures = [
                self._net.call_soon_with_future(self._end_one, t, commit, deadline) for t in chunk
            ]
            return [await future for future in futures]

        results: list[EndTxnResult] = []
        for start in range(0, len(wanted), MAX_IN_FLIGHT // 2):
            chunk = wanted[start : start + MAX_IN_FLIGHT // 2]
            results.extend(self._run(run_all, chunk, ids=ids))
        return results

    async def _end_one(self, triple: Triple, commit: bool, deadline: float) -> EndTxnResult:
        request = EndTxnRequest(
            transactional_id=triple.transactional_id,
            producer_id=triple.producer_id,
            producer_epoch=triple.producer_epoch,
            committed=commit,
            max_version=END_TXN_MAX_VERSION,
        )
        backoff = 0.05
        last = "no answer"
        while time.monotonic() < deadline:
            error, detail = await self._send_end_txn(request, triple.transactional_id, deadline)
            if error is kafka_errors.NoError:
                return EndTxnResult(triple, None)
            if not getattr(error, "retriable", False):
                return EndTxnResult(triple, detail)
            if getattr(error, "invalid_metadata", False) or error in _COORDINATOR_MOVED:
                self._forget_coordinator(triple.transactional_id)
            last = detail
            await self._net.sleep(min(backoff, max(0.0, deadline - time.monotonic())))
            backoff = min(backoff * 2, 1.0)
        return EndTxnResult(triple, f"deadline exceeded (last: {last})")

    async def _send_end_txn(
        self, request: EndTxnRequest, txn_id: str, deadline: float
    ) -> tuple[type[Exception], str]:
        try:
            node = await self._coordinator_of(txn_id, deadline)
            response = await self._send_by(request, deadline, node)
        except kafka_errors.KafkaError as exc:
            return type(exc), f"{type(exc).__name__}: {exc}"
        error = kafka_errors.for_code(response.error_code)
        return error, error.__name__

    # -- DescribeTransactions ------------------------------------------------------------------

    def describe(self, txn_ids: Iterable[str]) -> dict[str, TxnState]:
        """State of each id; ids the coordinator does not know are reported as NotFound."""
        ids = sorted(set(txn_ids))
        if not ids:
            return {}

        deadline = time.monotonic() + self._timeout_ms / 1000

        async def run() -> dict[str, TxnState]:
            states: dict[str, TxnState] = {}
            pending, backoff = ids, 0.05
            while pending:
                by_node: dict[int, list[str]] = {}
                for txn_id, node in (await self._coordinators_of(pending, deadline)).items():
                    by_node.setdefault(node, []).append(txn_id)
                moved: list[str] = []
                for node, node_ids in by_node.items():
                    try:
                        response = await self._manager.send(
                            DescribeTransactionsRequest(transactional_ids=node_ids), node_id=node
                        )
                    except kafka_errors.KafkaError as exc:
                        if not getattr(exc, "retriable", False):
                            raise
                        moved.extend(node_ids)
                        continue
                    for txn in response.transaction_states:
                        if kafka_errors.for_code(txn.error_code) in _COORDINATOR_MOVED:
                            moved.append(txn.transactional_id)
                        else:
                            states[txn.transactional_id] = _state_of(txn)
                for txn_id in moved:
                    self._forget_coordinator(txn_id)
                if moved and time.monotonic() >= deadline:
                    raise kafka_errors.NotCoordinatorError(f"no coordinator answered for {moved}")
                if moved:
                    await self._net.sleep(backoff)
                    backoff = min(backoff * 2, 1.0)
                pending = moved
            return states

        return self._run(run, ids=ids)

    # -- ListTransactions -----------------------------------------------------------------------

    def list_ids(self, states: Iterable[str] = ()) -> list[str]:
        """Every transactional id the brokers know in one of `states` (all states if empty).

        Raises:
            KafkaUnavailableError: a broker refused (e.g. no DESCRIBE permission) or timed out.
        """
        state_filters = list(states)

        async def run() -> list[str]:
            found: set[str] = set()
            for broker in self._manager.cluster.brokers():
                response = await self._manager.send(
                    ListTransactionsRequest(
                        state_filters=state_filters, producer_id_filters=[], min_version=0
                    ),
                    node_id=broker.node_id,
                )
                error = kafka_errors.for_code(response.error_code)
                if error is not kafka_errors.NoError:
                    raise error(f"ListTransactions failed on broker {broker.node_id}")
                found.update(t.transactional_id for t in response.transaction_states)
            return sorted(found)

        return self._run(run)

    # -- OffsetFetch ----------------------------------------------------------------------------

    def fetch_group_offsets(
        self,
        group: str,
        partitions: Mapping[str, Iterable[int]] | None,
        stable: bool,
        timeout_s: float,
    ) -> OffsetsAnswer:
        """One OffsetFetch to `group`'s coordinator for `partitions` (None: every partition the
        group has). A coordinator that answers it moved is forgotten, so asking again finds the
        new one; no answer raises.

        Raises:
            kafka.errors.KafkaError: no answer (connection lost, timed out, no coordinator).
        """
        wanted = (
            None
            if partitions is None
            else [
                _GROUP_TOPIC(name=topic, partition_indexes=sorted(parts))
                for topic, parts in sorted(partitions.items())
            ]
        )
        request = OffsetFetchRequest(
            groups=[_GROUP(group_id=group, topics=wanted)],
            require_stable=stable,
            min_version=OFFSET_FETCH_VERSIONS[0],
            max_version=OFFSET_FETCH_VERSIONS[1],
        )
        deadline = time.monotonic() + timeout_s

        async def ask() -> Any:
            node = await self._coordinator_of(group, deadline, CoordinatorType.GROUP)
            return await self._send_by(request, deadline, node)

        with self._lock:
            try:
                response = self._manager.run(ask)
            except kafka_errors.KafkaError:
                self._forget_coordinator(group, CoordinatorType.GROUP)  # it may have moved
                raise
        answer = _offsets_answer(response, group)
        if kafka_errors.for_code(answer.error) in _COORDINATOR_MOVED:
            self._forget_coordinator(group, CoordinatorType.GROUP)
        return answer

    # -- plumbing -------------------------------------------------------------------------------

    def _run(self, coroutine: Any, *args: Any, ids: Sequence[str] = ()) -> Any:
        try:
            with self._lock:
                return self._manager.run(coroutine, *args)
        except kafka_errors.KafkaError as exc:
            raise self._refusal(exc, "a request", ids) from exc

    def _refusal(
        self, exc: kafka_errors.KafkaError, what: str, ids: Sequence[str]
    ) -> KafkaTxnSinkError:
        """The error for a failed request about `ids`: a named permission when refused."""
        step = f"{what} for transactional id {ids[0]}" if ids else what
        denial = refused(
            int(getattr(exc, "errno", 0) or 0),
            type(exc).__name__,
            self._kafka,
            step,
            txn_id=ids[0] if ids else None,
        )
        if denial is not None:
            return denial
        return KafkaUnavailableError(f"Kafka request failed: {type(exc).__name__}: {exc}")

    async def _coordinators_of(
        self,
        keys: Iterable[str],
        deadline: float,
        kind: CoordinatorType = CoordinatorType.TRANSACTION,
    ) -> dict[str, int]:
        """The coordinator of each key: cached, or one batched FindCoordinator (v4+; one per key
        before Kafka 3.0) for the rest, each request bounded by `deadline`.

        kafka-python's own lookup gives it the client's request timeout, so an EndTxn round
        could last about that long again past its deadline (review N7).
        """
        cluster = self._manager.cluster
        found: dict[str, int] = {}
        unknown: list[str] = []
        for key in keys:
            cached = cluster.get_coordinator(key, kind)
            if cached is None:
                unknown.append(key)
            else:
                found[key] = cached
        if not unknown:
            return found
        if self._manager.broker_version_data.api_version(FindCoordinatorRequest) >= 4:
            request = FindCoordinatorRequest(
                key_type=kind.value, coordinator_keys=unknown, min_version=4
            )
            response = await self._send_by(request, deadline)
            for row in response.coordinators:
                found[row.key] = cluster.add_coordinator(
                    row, kind, row.key, synthesize_node_id=False
                )
            return found
        for key in unknown:
            request = FindCoordinatorRequest(key=key, key_type=kind.value, max_version=3)
            response = await self._send_by(request, deadline)
            found[key] = cluster.add_coordinator(response, kind, key, synthesize_node_id=False)
        return found

    async def _coordinator_of(
        self, key: str, deadline: float, kind: CoordinatorType = CoordinatorType.TRANSACTION
    ) -> int:
        return (await self._coordinators_of([key], deadline, kind))[key]

    async def _send_by(self, request: Any, deadline: float, node: int | None = None) -> Any:
        """Send `request` (to the least loaded broker without `node`) and wait for its answer
        until `deadline`: the request's own timeout does not cover a new connection's set-up
        (socket_connection_setup_timeout_ms, then ApiVersions and SASL)."""
        remaining_ms = self._remaining_ms(deadline)
        future = self._manager.send(request, node_id=node, request_timeout_ms=remaining_ms)
        return await self._manager.wait_for(future, remaining_ms)

    def _forget_coordinator(
        self, key: str, kind: CoordinatorType = CoordinatorType.TRANSACTION
    ) -> None:
        self._manager.cluster._coordinators.pop((kind, key), None)

    def _remaining_ms(self, deadline: float) -> int:
        return max(100, min(self._timeout_ms, int((deadline - time.monotonic()) * 1000)))


def _end_split(
    clients: list[TxnAdmin],
    wanted: list[Triple],
    commit: bool,
    deadline: float,
    ids: Sequence[str],
) -> list[EndTxnResult]:
    """EndTxn for `wanted` split over `clients`, each in its own thread; the results in the
    order of `wanted`. When a part raises, every part has ended first, and a refusal (a
    permission named) is raised before other failures."""
    parts = [wanted[i :: len(clients)] for i in range(len(clients))]
    with ThreadPoolExecutor(len(clients), thread_name_prefix="endtxn") as pool:
        futures = [
            pool.submit(client._end_on_this_client, part, commit, deadline, ids)
            for client, part in zip(clients, parts, strict=True)
        ]
    failures = [exc for exc in (future.exception() for future in futures) if exc is not None]
    if failures:
        raise next((e for e in failures if not isinstance(e, KafkaUnavailableError)), failures[0])
    answered = [future.result() for future in futures]
    # Triple i went to client i % n as its (i // n)-th.
    return [answered[i % len(clients)][i // len(clients)] for i in range(len(wanted))]


_COORDINATOR_MOVED = (
    kafka_errors.NotCoordinatorError,
    kafka_errors.CoordinatorNotAvailableError,
    kafka_errors.CoordinatorLoadInProgressError,
)


_GROUP = OffsetFetchRequest.OffsetFetchRequestGroup
_GROUP_TOPIC = _GROUP.OffsetFetchRequestTopics


@dataclass(frozen=True)
class OffsetsAnswer:
    """A group coordinator's answer to OffsetFetch: its error code for the group (0: none) and
    (topic, partition, committed offset or -1, error code) for each partition."""

    error: int
    partitions: list[tuple[str, int, int, int]]


def _offsets_answer(response: Any, group: str) -> OffsetsAnswer:
    answered = [g for g in response.groups if g.group_id == group]
    if not answered:
        return OffsetsAnswer(kafka_errors.UnknownServerError.errno, [])
    return OffsetsAnswer(
        answered[0].error_code,
        [
            (topic.name, part.partition_index, part.committed_offset, part.error_code)
            for topic in answered[0].topics
            for part in topic.partitions
        ],
    )


def _state_of(txn: Any) -> TxnState:
    error = kafka_errors.for_code(txn.error_code)
    if error is kafka_errors.TransactionalIdNotFoundError:
        return TxnState(txn.transactional_id, NOT_FOUND)
    if error is not kafka_errors.NoError:
        raise error(f"DescribeTransactions failed for {txn.transactional_id}")
    return TxnState(
        transactional_id=txn.transactional_id,
        state=str(txn.transaction_state),
        producer_id=txn.producer_id,
        producer_epoch=txn.producer_epoch,
        timeout_ms=txn.transaction_timeout_ms,
        start_ms=txn.transaction_start_time_ms,
        partitions=tuple(sorted((t.topic, p) for t in txn.topics for p in t.partitions)),
    )


# -- one TxnAdmin per connection settings and process -----------------------------------------

_SHARED: ClientCache[TxnAdmin] = ClientCache(TxnAdmin, TxnAdmin.close)


def shared_txn_admin(bootstrap: str, kafka: Mapping[str, str], timeout_ms: int) -> TxnAdmin:
    """A TxnAdmin kept for the life of this process (closed at exit); do not close it.

    One bootstrapped client with its connections and cached coordinators serves every batch.
    Call `discard_txn_admin` after a failure: the next caller gets a fresh client.

    Raises:
        KafkaUnavailableError: a new client cannot reach the brokers.
    """
    return _SHARED.get(bootstrap, kafka, timeout_ms)


def discard_txn_admin(coordinator: TxnAdmin) -> None:
    """Forget a shared TxnAdmin and close it (if it is one; otherwise just close it)."""
    _SHARED.discard(coordinator)
