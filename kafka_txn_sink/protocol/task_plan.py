"""The plan of a batch's tasks: what the driver's planner hands every task, pickled with the
writer (planner.py builds it, prepare.py follows it). Apart from prepare.py, so that the driver
loads none of the tasks' modules to build or pickle it.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from kafka_txn_sink.options import SinkOptions
from kafka_txn_sink.protocol.repair import RepairPlan
from kafka_txn_sink.protocol.runs import RunRef
from kafka_txn_sink.protocol.write_ids import BatchWrite
from kafka_txn_sink.records.columns import Columns
from kafka_txn_sink.serde.resolve import Encodings


@dataclass(frozen=True)
class TaskPlan:
    """What every task of a batch needs: built on the driver, pickled to the tasks.

    It carries only the options, the checked outputs, what the commit log said when the
    driver built it (`log_query_id`, `last_decided`), and for a batch write its batch.
    """

    options: SinkOptions
    columns: Columns | None  # records mode, or None
    files_plan: Any  # files mode's `files.plan.FilePlan`, or None (typed loosely: lazy import)
    log_query_id: str | None
    last_decided: int | None
    run: RunRef
    write: BatchWrite | None = None  # a batch write; None in a streaming query
    repair: RepairPlan | None = None  # what a replay of the latest decided batch writes again
    encodings: Encodings | None = None  # the key's and value's registry formats (serde/)
    repair_encodings: Encodings | None = None  # a repair's: the decision's schema ids
    # option badRows=deadLetter: the most bytes a record may have, per topic (start.py)
    dead_letter_limits: dict[str, int] = field(default_factory=dict)


def task_options(options: SinkOptions) -> SinkOptions:
    """`options` as a batch's tasks receive them: without the Schema Registry's settings and
    the consumer group cluster's, which only the driver uses (their credentials go no further:
    a task's plan is pickled to every executor)."""
    progress = options.progress
    return replace(
        options,
        serde=replace(options.serde, registry={}),
        progress=replace(progress, kafka={}) if progress is not None else None,
    )
