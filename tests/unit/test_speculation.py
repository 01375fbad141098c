"""`spark.speculation=true` is refused in every task before it reads the commit log or touches
Kafka: Spark hands the application's settings to a query's tasks as local properties, the one
place the sink sees them when Spark found it by its short name (no `register(spark)`)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from pyspark import TaskContext
from pyspark.sql.types import StringType, StructField, StructType

from kafka_txn_sink.errors import ConfigError
from kafka_txn_sink.options import parse_options
from kafka_txn_sink.protocol.prepare import prepare_task, refuse_speculation
from kafka_txn_sink.protocol.runs import RunRef
from kafka_txn_sink.protocol.task_plan import TaskPlan
from kafka_txn_sink.records.columns import plan_columns


@pytest.fixture
def task_context() -> Iterator[TaskContext]:
    """A Python worker's task context, as pyspark's worker fills it in (batch 0 of a query)."""
    context = TaskContext()
    context._stageId, context._partitionId, context._attemptNumber = 1, 0, 0
    context._taskAttemptId, context._cpus, context._resources = 7, 1, {}
    context._localProperties = {
        "sql.streaming.queryId": "q",
        "streaming.sql.batchId": "0",
    }
    TaskContext._setTaskContext(context)
    yield context
    TaskContext._setTaskContext(None)  # type: ignore[arg-type]


def plan(tmp_path: Path) -> TaskPlan:
    options = parse_options(
        {
            "kafka.bootstrap.servers": "127.0.0.1:1",  # nothing listens: touching Kafka fails
            "topic": "out",
            "sinkId": "spec",
            "commitLog": str(tmp_path / "log"),
        }
    ).with_transaction_timeout(60_000)
    schema = StructType([StructField("value", StringType())])
    return TaskPlan(options, plan_columns(schema, "out"), None, None, None, RunRef(1, 0))


def test_a_task_refuses_speculation_before_the_log_or_kafka(
    task_context: TaskContext, tmp_path: Path
) -> None:
    task_context._localProperties = {
        **(task_context._localProperties or {}),
        "spark.speculation": "true",
    }

    with pytest.raises(ConfigError) as failure:
        prepare_task(plan(tmp_path), iter([("v",)]), arrow=False)

    assert "spark.speculation=true is not supported" in str(failure.value)
    assert "set spark.speculation=false" in str(failure.value)
    assert not (tmp_path / "log").exists()


@pytest.mark.parametrize("value", [None, "false", "False", ""])
def test_speculation_off_or_unset_is_accepted(value: str | None) -> None:
    refuse_speculation(value)


@pytest.mark.parametrize("value", ["true", "TRUE", " true "])
def test_speculation_on_is_refused_however_spelled(value: str) -> None:
    with pytest.raises(ConfigError, match=r"spark\.speculation=true"):
        refuse_speculation(value)
