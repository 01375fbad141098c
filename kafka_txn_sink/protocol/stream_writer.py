"""The stream writer: `write()` runs in every task, `commit()`/`abort()` on the driver.

Spark builds it on the driver just before a batch's tasks (and again in the commit worker), then
pickles it to the tasks; so it carries only options and what the commit log said at that moment.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from typing import Any

import pyarrow as pa
from pyspark import TaskContext
from pyspark.sql.datasource import DataSourceStreamWriter, WriterCommitMessage
from pyspark.sql.types import StructType

from kafka_txn_sink import failpoints
from kafka_txn_sink.commit_log import CommitLog, open_commit_log
from kafka_txn_sink.errors import ConfigError, InputError
from kafka_txn_sink.files.references import reference
from kafka_txn_sink.files.writer import FileNaming, FilePlan, FileSet, WrittenFile
from kafka_txn_sink.kafka.cluster import discard_cluster, shared_cluster
from kafka_txn_sink.kafka.producer import TaskTransaction, producer_config
from kafka_txn_sink.kafka.txn_admin import TxnAdmin, discard_txn_admin, shared_txn_admin
from kafka_txn_sink.options import SinkOptions
from kafka_txn_sink.protocol.complete import Settler
from kafka_txn_sink.protocol.decide import CleanupSchedule, Committer, query_id_mismatch
from kafka_txn_sink.protocol.messages import TaskCommit
from kafka_txn_sink.protocol.txn_ids import transactional_id
from kafka_txn_sink.records.arrow import (
    ARROW_WRITER_AVAILABLE,
    ArrowStreamWriterBase,
    record_columns,
    row_converter,
    send_batch,
)
from kafka_txn_sink.records.columns import Columns, as_bytes, as_headers
from kafka_txn_sink.storage.files import open_file_sink

log = logging.getLogger(__name__)


class KafkaTxnStreamWriter(DataSourceStreamWriter):
    def __init__(
        self,
        options: SinkOptions,
        columns: Columns | None,
        files_plan: FilePlan | None,
        log_query_id: str | None,
        last_decided: int | None,
    ):
        self.options = options
        self.columns = columns  # None: records mode is off
        self.files_plan = files_plan  # None: files mode is off
        self.log_query_id = log_query_id
        self.last_decided = last_decided

    # -- executor ---------------------------------------------------------------------------

    def write(self, iterator: Iterator[Any]) -> TaskCommit:
        context = TaskContext.get()
        if context is None:
            raise ConfigError("write() must run inside a Spark task")
        if context.getLocalProperty("__is_continuous_processing") == "true":
            raise ConfigError("the continuous trigger is not supported; use a micro-batch trigger")
        batch_id = int(context.getLocalProperty("streaming.sql.batchId") or -1)
        query_id = context.getLocalProperty("sql.streaming.queryId") or ""
        partition, attempt = context.partitionId(), context.attemptNumber()
        self._check_query_id(query_id)
        skipped = TaskCommit(query_id, batch_id, partition, attempt, status="skipped")
        # Checked before init: initialising the id would fence a decided, uncommitted participant.
        if self._decided(batch_id):
            return skipped
        txn = TaskTransaction(self._producer_config(partition), self._client_timeout_s)
        files = self._file_set(batch_id, partition, attempt)
        try:
            txn.init()
            failpoints.fire("task.after_init", batch_id)
            self._send(txn, files, iterator, batch_id)
            written = files.close() if files is not None else []
            self._send_references(txn, written, batch_id)
            prepared = txn.prepare()
        except BaseException:
            if files is not None:
                files.abort()
            txn.abort()
            raise
        finally:
            txn.detach()
        if prepared is None:
            return replace(skipped, status="empty")
        failpoints.fire("task.after_flush", batch_id)
        return replace(
            skipped,
            status="prepared",
            rows=prepared.rows,
            transactional_id=prepared.triple.transactional_id,
            producer_id=prepared.triple.producer_id,
            producer_epoch=prepared.triple.producer_epoch,
            offsets=prepared.offsets,
            prepared_at_ms=prepared.prepared_at_ms,
            files=tuple(w.ref for w in written),
        )

    def _send(
        self, txn: TaskTransaction, files: FileSet | None, rows: Iterator[Any], batch_id: int
    ) -> None:
        for count, row in enumerate(rows):
            if self.columns is not None:
                self._send_record(txn, row)
            if files is not None:
                files.add(row)
            if count == 0:
                failpoints.fire("task.after_produce", batch_id)

    def _send_record(self, txn: TaskTransaction, row: Any) -> None:
        cols = self.columns
        assert cols is not None
        topic = (row[cols.topic] if cols.topic is not None else None) or self.options.topic
        if topic is None:
            raise InputError("column topic is null and there is no topic option")
        txn.send(
            topic,
            value=as_bytes(row[cols.value], "value"),
            key=as_bytes(row[cols.key], "key") if cols.key is not None else None,
            partition=row[cols.partition] if cols.partition is not None else None,
            headers=as_headers(row[cols.headers]) if cols.headers is not None else None,
        )

    def _file_set(self, batch_id: int, partition: int, attempt: int) -> FileSet | None:
        files = self.options.files
        if self.files_plan is None or files is None:
            return None
        sink = open_file_sink(files.path, self.options.s3)
        return FileSet(self.files_plan, sink, FileNaming(batch_id, partition, attempt))

    def _send_references(
        self, txn: TaskTransaction, written: list[WrittenFile], batch_id: int
    ) -> None:
        files = self.options.files
        if files is None or not written:
            return
        sink = open_file_sink(files.path, self.options.s3)
        for item in written:
            ref = reference(
                item,
                sink=sink,
                sink_id=self.options.sink_id,
                batch_id=batch_id,
                codec=files.codec,
                inline_max_bytes=files.schema_inline_max_bytes,
            )
            txn.send(files.references_topic, value=ref.value, key=ref.key)

    def _check_query_id(self, query_id: str) -> None:
        if self.log_query_id and query_id != self.log_query_id:
            raise query_id_mismatch(
                self.options.sink_id, self.options.commit_log, self.log_query_id, query_id
            )

    def _decided(self, batch_id: int) -> bool:
        if self.last_decided is not None and batch_id <= self.last_decided:
            return True
        options = self.options
        commit_log = open_commit_log(options.commit_log, options.s3, options.commit_log_format)
        return commit_log.has_decision(batch_id)

    def _producer_config(self, partition: int) -> dict[str, Any]:
        return producer_config(
            self.options.bootstrap_servers,
            self.options.kafka,
            transactional_id(self.options.sink_id, partition),
            self.options.require_transaction_timeout(),
        )

    @property
    def _client_timeout_s(self) -> float:
        return self.options.commit_timeout_ms / 1000

    # -- driver -------------------------------------------------------------------------------

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        schedule = cleanup_schedule(self.options)
        with driver_session(self.options) as (commit_log, txn_admin, settler):
            try:
                Committer(self.options, commit_log, txn_admin, settler, schedule).commit(
                    messages, batchId
                )
            except BaseException:
                schedule.make_due("the previous commit failed")
                raise

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        cleanup_schedule(self.options).make_due("a batch was aborted")
        with driver_session(self.options) as (commit_log, txn_admin, settler):
            Committer(self.options, commit_log, txn_admin, settler).abort(messages, batchId)


class KafkaTxnStreamArrowWriter(KafkaTxnStreamWriter):
    """The same writer, fed Spark's Arrow record batches instead of rows (PySpark 4.1+).

    Registered as a `DataSourceStreamArrowWriter` where PySpark has that class, which is what
    makes Spark hand `write()` the batches; see arrow_writer.py for what it saves.
    """

    def __init__(self, *args: Any, schema: StructType, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.schema = schema

    def _send(
        self,
        txn: TaskTransaction,
        files: FileSet | None,
        rows: Iterator[Any],
        batch_id: int,
    ) -> None:
        batches: Iterator[pa.RecordBatch] = rows
        to_rows = row_converter(self.schema) if files is not None else None
        first = True
        for batch in batches:
            if batch.num_rows == 0:
                continue
            if self.columns is not None:
                send_batch(txn, record_columns(batch, self.columns), self.options.topic)
            if files is not None and to_rows is not None:
                for row in to_rows(batch):
                    files.add(row)
            if first:
                failpoints.fire("task.after_produce", batch_id)
                first = False


if ArrowStreamWriterBase is not None:
    ArrowStreamWriterBase.register(KafkaTxnStreamArrowWriter)


def stream_writer_class() -> type[KafkaTxnStreamWriter]:
    """The Arrow writer where PySpark offers it (4.1+), else the row writer.

    KTS_ARROW_WRITER=0 in the driver's environment forces the row writer (for comparisons).
    """
    if ARROW_WRITER_AVAILABLE and os.environ.get("KTS_ARROW_WRITER") != "0":
        return KafkaTxnStreamArrowWriter
    return KafkaTxnStreamWriter


@contextmanager
def driver_session(options: SinkOptions) -> Iterator[tuple[CommitLog, TxnAdmin, Settler]]:
    """The clients one driver step needs.

    They are shared by every step of this process (Spark reuses its planner and commit-worker
    Python processes from batch to batch), and dropped when a step fails, so the next step
    starts from fresh connections.
    """
    commit_log = driver_commit_log(options)
    txn_admin = shared_txn_admin(
        options.bootstrap_servers, options.kafka, options.commit_timeout_ms
    )
    cluster = shared_cluster(options.bootstrap_servers, options.kafka, options.commit_timeout_ms)
    try:
        yield (
            commit_log,
            txn_admin,
            Settler.for_options(options, commit_log, txn_admin, cluster),
        )
    except BaseException:
        discard_txn_admin(txn_admin)
        discard_cluster(cluster)
        _forget_commit_log(options)
        raise


# -- per-process state of the driver -----------------------------------------------------------

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
