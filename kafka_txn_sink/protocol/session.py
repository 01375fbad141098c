"""The driver's per-process state: the clients, the commit log and the clean-up schedule.

Spark reuses its planner and commit-worker Python processes from batch to batch, so what a
driver step needs is made once per process and per sink, and kept: the Kafka clients (one per
connection settings, kafka/client_cache.py), the commit log object, and when the next clean-up
is due. A step that fails drops its clients, so the next step starts from fresh connections.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from kafka_txn_sink.commit_log import CommitLog, open_commit_log
from kafka_txn_sink.kafka.admin_api import EndTxnResult, TxnState
from kafka_txn_sink.kafka.cluster import Cluster, discard_cluster, shared_cluster
from kafka_txn_sink.options import SinkOptions
from kafka_txn_sink.protocol.complete import Republishing, Settler
from kafka_txn_sink.protocol.messages import Triple
from kafka_txn_sink.protocol.recover import CleanupSchedule

if TYPE_CHECKING:
    from kafka_txn_sink.kafka.txn_admin import TxnAdmin


class CoordinatorClient:
    """The process's TxnAdmin for the sink's connection settings, made on the step's first
    request to a transaction coordinator: a planner whose start asks them nothing (the log
    exists, nothing to roll forward) neither imports kafka-python nor connects it."""

    def __init__(self, options: SinkOptions):
        self._options = options
        self._made: TxnAdmin | None = None

    def _admin(self) -> TxnAdmin:
        if self._made is None:
            from kafka_txn_sink.kafka.txn_admin import shared_txn_admin

            options = self._options
            self._made = shared_txn_admin(
                options.bootstrap_servers, options.kafka, options.commit_timeout_ms
            )
        return self._made

    def end_transactions(
        self, triples: Iterable[Triple], commit: bool, deadline_s: float
    ) -> list[EndTxnResult]:
        """See TransactionAdmin."""
        return self._admin().end_transactions(triples, commit, deadline_s)

    def describe(self, txn_ids: Iterable[str]) -> dict[str, TxnState]:
        """See TransactionAdmin."""
        return self._admin().describe(txn_ids)

    def list_ids(self, states: Iterable[str] = ()) -> list[str]:
        """See TransactionAdmin."""
        return self._admin().list_ids(states)

    def discard(self) -> None:
        """Close the client if this step made or took one: the next step starts afresh."""
        if self._made is not None:
            from kafka_txn_sink.kafka.txn_admin import discard_txn_admin

            discard_txn_admin(self._made)
            self._made = None


@dataclass(frozen=True)
class DriverSession:
    """What one driver step of one sink works with."""

    options: SinkOptions
    commit_log: CommitLog
    txn_admin: CoordinatorClient
    cluster: Cluster
    settler: Settler


@contextmanager
def driver_session(options: SinkOptions) -> Iterator[DriverSession]:
    """The clients of this process for `options`; dropped if the step inside fails.

    Raises:
        KafkaUnavailableError: a new client cannot reach the brokers.
        CommitLogError: the commit log cannot be opened.
    """
    cluster = shared_cluster_of(options)
    txn_admin = CoordinatorClient(options)
    try:
        commit_log = driver_commit_log(options)
        settler = Settler(
            options.sink_id,
            commit_log,
            txn_admin,
            cluster,
            options.client_timeout_s,
            republisher(options),
        )
        yield DriverSession(options, commit_log, txn_admin, cluster, settler)
    except BaseException:
        discard_cluster(cluster)
        txn_admin.discard()
        _forget_commit_log(options)
        raise


def shared_cluster_of(options: SinkOptions) -> Cluster:
    """The cluster client of this process for the sink's connection settings."""
    return shared_cluster(options.bootstrap_servers, options.kafka, options.commit_timeout_ms)


def republisher(options: SinkOptions) -> Republishing | None:
    """Files mode's republisher (None in records mode alone, or before the timeout is known)."""
    if options.files is None or options.transaction_timeout_ms is None:
        return None
    # Imported here: a records-only driver never loads files mode (fastavro, the Avro stack).
    from kafka_txn_sink.files.republish import Republisher

    return Republisher.for_options(options)


_LOGS: dict[tuple[Any, ...], CommitLog] = {}
_SCHEDULES: dict[tuple[str, str], CleanupSchedule] = {}
_STATE_LOCK = threading.Lock()


def _log_key(options: SinkOptions) -> tuple[Any, ...]:
    return (os.getpid(), options.commit_log, options.s3, options.commit_log_format)


def driver_commit_log(options: SinkOptions) -> CommitLog:
    """The commit log object of this sink, kept for the life of the process.

    Safe to keep: a JSON log holds nothing but its storage client, and a Delta log follows its
    table's new versions on every read.
    """
    key = _log_key(options)
    with _STATE_LOCK:
        found = _LOGS.get(key)
    if found is None:
        opened = open_commit_log(options.commit_log, options.s3, options.commit_log_format)
        with _STATE_LOCK:
            found = _LOGS.setdefault(key, opened)
    return found


def _forget_commit_log(options: SinkOptions) -> None:
    with _STATE_LOCK:
        _LOGS.pop(_log_key(options), None)


def cleanup_schedule(options: SinkOptions) -> CleanupSchedule:
    """When this process next runs the full clean-up of this sink (see CleanupSchedule)."""
    key = (options.sink_id, options.commit_log)
    with _STATE_LOCK:
        found = _SCHEDULES.get(key)
        if found is None or found.pid != os.getpid():
            found = _SCHEDULES[key] = CleanupSchedule()
        return found
