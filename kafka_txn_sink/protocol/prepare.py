"""Step 1, in every task: prepare one transaction of the batch and tell the driver about it.

A task attempt of Spark partition `p`:
0. refuses `spark.speculation=true` (`refuse_speculation`), before anything else;
1. checks that the query writing is the one the commit log belongs to (not in a batch write,
   whose batch and query id the driver chose: `BatchWrite`);
2. returns `skipped` if batch N is decided already (initialising the id now would fence a
   decided participant that is not committed yet). It does not check for a newer run: its
   slot's ids are its run's alone, so it cannot hurt another run, and the driver's commit stops
   a superseded run;
3. initialises the transactional id `{sinkId}-{slot}-{p}` of its run's slot (fencing every
   earlier attempt of the run and aborting whatever it left open) and begins a transaction,
   while Spark delivers its first input;
4. hands its rows to its outputs (records, files, or both: `TaskOutput`), which produce into
   that transaction; files mode uploads its files and produces one reference per file;
5. flushes, reads the transaction's producer id and epoch, and returns a `TaskCommit` with the
   triple, the offsets written and the files: the transaction stays open ("prepared") for the
   driver to decide. A failure aborts it, and nothing of the task is ever visible.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from itertools import chain, islice
from typing import Any

import pyarrow as pa
from pyspark import TaskContext

from kafka_txn_sink import failpoints
from kafka_txn_sink.commit_log import CommitLog, open_commit_log
from kafka_txn_sink.errors import CommitLogError, ConfigError, QueryIdMismatchError
from kafka_txn_sink.kafka.producer import TaskTransaction
from kafka_txn_sink.options import SinkOptions
from kafka_txn_sink.protocol import task_errors
from kafka_txn_sink.protocol.causes import cause_of
from kafka_txn_sink.protocol.messages import FileRef, now_ms
from kafka_txn_sink.protocol.output import TaskOutput
from kafka_txn_sink.protocol.task_commit import TaskCommit
from kafka_txn_sink.protocol.task_plan import TaskPlan
from kafka_txn_sink.protocol.txn_ids import transactional_id
from kafka_txn_sink.records.dead_letter import DeadLetters
from kafka_txn_sink.records.output import RecordsOutput
from kafka_txn_sink.records.provenance import Provenance
from kafka_txn_sink.serde.resolve import Encodings, schema_uses
from kafka_txn_sink.storage import open_storage

# The row writer's rows go to the outputs as tuples, in groups of this many after the first
# row (which goes alone, so a record is in the transaction as soon as the task has taken a
# row): a call per group, not per row, and records mode produces a group through `send_many`.
ROWS_PER_CALL = 4096
SPECULATION = "spark.speculation"

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class TaskIdentity:
    """Which attempt of which task of which batch of which query this is."""

    query_id: str
    batch_id: int
    partition: int
    attempt: int


def prepare_task(plan: TaskPlan, inputs: Iterator[Any], arrow: bool) -> TaskCommit:
    """Prepare this task's transaction from its rows (or Arrow batches, if `arrow`).

    Raises:
        ConfigError: not inside a Spark task, or under the continuous trigger.
        QueryIdMismatchError: another query's checkpoint writes to this sink's log.
        InputError / StagingError / KafkaTxnSinkError: the rows could not be written; the
            transaction is aborted and nothing of the task is visible.
    """
    started_at_ms = now_ms()
    task = current_task(plan)
    try:
        return _prepare(plan, task, inputs, arrow, started_at_ms)
    except Exception as exc:
        _leave_error(plan, task, exc)
        raise


def _prepare(
    plan: TaskPlan, task: TaskIdentity, inputs: Iterator[Any], arrow: bool, started_at_ms: int
) -> TaskCommit:
    """prepare_task's steps, for one identified task attempt."""
    _check_query_id(plan, task.query_id)
    skipped = TaskCommit(
        task.query_id,
        task.batch_id,
        task.partition,
        task.attempt,
        "skipped",
        run=plan.run,
        transaction_timeout_ms=plan.options.transaction_timeout_ms,
    )
    level = 0
    if decided(plan, task.batch_id):
        level = repair_level(plan, task.batch_id)
        if not level:
            return skipped
        skipped = replace(skipped, level=level)
    options = plan.options
    txn = TaskTransaction(
        options.producer_config(
            transactional_id(options.sink_id, task.partition, slot=plan.run.slot)
        ),
        options.client_timeout_s,
    )
    outputs = open_outputs(plan, txn, task, records_only=level > 0)
    try:
        inputs = _init_while_spark_delivers(txn, inputs)
        failpoints.fire("task.after_init", task.batch_id)
        _feed(outputs, inputs, arrow, task.batch_id)
        files = _close(outputs)
        prepared = txn.prepare()
    except BaseException:
        for output in outputs:
            output.abort()
        txn.abort()
        raise
    finally:
        txn.detach()
    if prepared is None:
        return replace(skipped, status="empty")
    failpoints.fire("task.after_flush", task.batch_id)
    return replace(
        skipped,
        status="prepared",
        rows=prepared.rows,
        triple=prepared.triple,
        offsets=prepared.offsets,
        prepared_at_ms=prepared.prepared_at_ms,
        started_at_ms=started_at_ms,
        bytes=prepared.bytes,
        files=files,
        digest=next((o.digest() for o in outputs if isinstance(o, RecordsOutput)), ""),
        dead_lettered=sum(o.set_aside for o in outputs if isinstance(o, RecordsOutput)),
        schemas=schema_uses(encodings_of(plan, task.batch_id)),
    )


def _leave_error(plan: TaskPlan, task: TaskIdentity, exc: Exception) -> None:
    """Leave the kind of this attempt's error for the metrics (protocol/task_errors.py)."""
    options = plan.options
    error = task_errors.TaskError(
        task.batch_id,
        plan.run.run,
        task.partition,
        task.attempt,
        cause_of(exc),
        now_ms(),
    )
    try:
        storage = open_storage(options.commit_log, options.s3)
    except Exception as opening:
        log.warning("could not open the commit log's location: %s", type(opening).__name__)
        return
    task_errors.leave(storage, error)


def encodings_of(plan: TaskPlan, batch_id: int) -> Encodings | None:
    """The registry formats a task of batch `batch_id` writes with: for the replay of a
    repaired batch, the ids its decision recorded (the repair takes only equal records)."""
    repair = plan.repair
    if repair is not None and repair.batch_id == batch_id and plan.repair_encodings is not None:
        return plan.repair_encodings
    return plan.encodings


def repair_level(plan: TaskPlan, batch_id: int) -> int:
    """The repair level a task of decided batch `batch_id` writes at (protocol/repair.py), or 0
    when it writes nothing: no repair is planned for the batch, or its level is recorded
    already (this is a late attempt; initialising the id now could fence the repair)."""
    repair = plan.repair
    if repair is None or repair.batch_id != batch_id or plan.columns is None:
        return 0
    options = plan.options
    commit_log = open_commit_log(options.commit_log, options.s3, options.commit_log_format)
    if commit_log.repair(batch_id, repair.level) is not None:
        return 0
    _check_visible(commit_log, options)  # else "the level is free" would be a guess
    return repair.level


def current_task(plan: TaskPlan) -> TaskIdentity:
    """This task attempt, as Spark's task context names it (batch and query id from the plan
    in a batch write).

    Raises:
        ConfigError: not inside a Spark task, or under the continuous trigger.
    """
    context = TaskContext.get()
    if context is None:
        raise ConfigError("write() must run inside a Spark task")
    # The one place Spark's conf is visible to the sink when Spark found it by its short name:
    # a query hands its session's settings, Spark's conf among them, to its tasks as local
    # properties (SQLExecution.withSQLConfPropagated); the driver's Python workers get none.
    refuse_speculation(context.getLocalProperty(SPECULATION))
    if plan.write is not None:
        query_id, batch_id = plan.write.query_id, plan.write.batch_id
    else:
        if context.getLocalProperty("__is_continuous_processing") == "true":
            raise ConfigError("the continuous trigger is not supported; use a micro-batch trigger")
        query_id = context.getLocalProperty("sql.streaming.queryId") or ""
        batch_id = int(context.getLocalProperty("streaming.sql.batchId") or -1)
    return TaskIdentity(
        query_id=query_id,
        batch_id=batch_id,
        partition=context.partitionId(),
        attempt=context.attemptNumber(),
    )


def refuse_speculation(value: str | None) -> None:
    """Refuse Spark's `spark.speculation` when it is on (`value`: the setting, None if unset).

    Raises:
        ConfigError: it is on. A speculative copy of a task shares its transactional id
            `{sinkId}-{slot}-{p}`: the copies fence each other, and a copy Spark did not choose
            can abort a participant of a decided batch.
    """
    if (value or "").strip().lower() == "true":
        raise ConfigError(
            f"{SPECULATION}=true is not supported by kafka_txn: speculative task copies share a "
            f"transactional id and fence each other; set {SPECULATION}=false for this Spark "
            f"application (spark-submit --conf {SPECULATION}=false, or the session builder's "
            f"config before the session starts)"
        )


def open_outputs(
    plan: TaskPlan, txn: TaskTransaction, task: TaskIdentity, records_only: bool = False
) -> list[TaskOutput]:
    """The task's outputs, bound to its transaction: records mode first, then files mode
    (not in a repair: files mode publishes lost references again itself, complete.py)."""
    outputs: list[TaskOutput] = []
    files = plan.options.files
    if plan.columns is not None:
        references = files.references_topic if files is not None else None
        encodings = encodings_of(plan, task.batch_id)
        where = Provenance(plan.options.sink_id, task.batch_id, task.partition)
        provenance = where if plan.options.provenance_headers else None
        dead_letters = (
            DeadLetters(plan.options.dead_letter.topic, where, plan.dead_letter_limits)
            if plan.options.dead_letter is not None
            else None
        )
        records = RecordsOutput(
            txn, plan.columns, plan.options.topic, references, encodings, provenance, dead_letters
        )
        outputs.append(records)
    if plan.files_plan is not None and not records_only:
        # Imported here: a records-only sink never loads files mode (fastavro, the Avro stack).
        from kafka_txn_sink.files.output import FilesOutput

        outputs.append(
            FilesOutput(
                plan.options,
                plan.files_plan,
                txn,
                task.batch_id,
                task.partition,
                task.attempt,
            )
        )
    return outputs


def _init_while_spark_delivers(txn: TaskTransaction, inputs: Iterator[Any]) -> Iterator[Any]:
    """Initialise the transaction (step 3) while Spark delivers the task's first input, and
    return the inputs whole once both are done. Nothing is produced before the init ends;
    only the wait overlaps (in a 1 s trigger's tasks the first input came 49 ms after
    `write()` at the median, the init took 15 ms: measured, docs/performance.md).

    An error of the first input waits for the init to end (at most the client timeout), so
    that the abort never runs beside it.

    Raises:
        whatever the init or the first input raised (the init's error first).
    """
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="kts-init") as pool:
        initialised = pool.submit(txn.init)
        try:
            first = next(inputs, _NO_INPUT)
        finally:
            initialised.result()  # waits; an init error goes before the input's
    return inputs if first is _NO_INPUT else chain([first], inputs)


_NO_INPUT = object()


def _feed(outputs: list[TaskOutput], inputs: Iterator[Any], arrow: bool, batch_id: int) -> None:
    if arrow:
        _feed_batches(outputs, inputs, batch_id)
    else:
        _feed_rows(outputs, inputs, batch_id)


def _feed_rows(outputs: list[TaskOutput], rows: Iterator[Any], batch_id: int) -> None:
    # As plain tuples: PySpark's Row indexes through a __getitem__ written in Python (about
    # 0.2 us a cell, measured), a tuple in C; a tuple of a Row is made in C too.
    first = next(rows, None)
    if first is None:
        return
    for output in outputs:
        output.add_rows([tuple(first)])
    failpoints.fire("task.after_produce", batch_id)
    while group := list(map(tuple, islice(rows, ROWS_PER_CALL))):
        for output in outputs:
            output.add_rows(group)


def _feed_batches(
    outputs: list[TaskOutput], batches: Iterator[pa.RecordBatch], batch_id: int
) -> None:
    first = True
    for batch in batches:
        if batch.num_rows == 0:
            continue
        for output in outputs:
            output.add_batch(batch)
        if first:
            failpoints.fire("task.after_produce", batch_id)
            first = False


def _close(outputs: list[TaskOutput]) -> tuple[FileRef, ...]:
    return tuple(ref for output in outputs for ref in output.close())


def _check_query_id(plan: TaskPlan, query_id: str) -> None:
    if plan.write is not None:
        return  # a batch write: the driver chose its batch; the log has a query id per write
    options = plan.options
    QueryIdMismatchError.check(options.sink_id, options.commit_log, plan.log_query_id, [query_id])


def decided(plan: TaskPlan, batch_id: int) -> bool:
    """Whether batch `batch_id` is decided, as this task sees the commit log.

    Raises:
        CommitLogError: the task cannot see the log the driver claimed (`_sink.json`, or the
            Delta table's sink row): "not decided" would then be a guess, and a late attempt
            of a decided batch would fence a participant the driver is about to commit.
    """
    if plan.last_decided is not None and batch_id <= plan.last_decided:
        return True
    options = plan.options
    commit_log = open_commit_log(options.commit_log, options.s3, options.commit_log_format)
    if commit_log.has_decision(batch_id):
        return True
    _check_visible(commit_log, options)
    return False


def _check_visible(commit_log: CommitLog, options: SinkOptions) -> None:
    """A task's "not in the log" is believed only where the log the driver claimed is visible.

    Raises:
        CommitLogError: this task cannot see the log's claim (`_sink.json`, or the Delta
            table's sink row).
    """
    if commit_log.sink_meta() is None:
        raise CommitLogError(
            f"this task cannot see the commit log at commitLog={options.commit_log} "
            f"({commit_log.uri}): the driver claimed it before the batch started, but it holds "
            "no claim here. Executors must reach the same commitLog location as the driver "
            "(an s3:// path, or a volume mounted on every node; not a path local to the "
            "driver), since each task checks there whether its batch is decided already"
        )
