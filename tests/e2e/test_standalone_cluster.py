"""Records mode on a Spark standalone cluster (a master and two one-core workers on loopback),
the package installed from its wheel in the Python of the driver and the executors, reading
Spark's Kafka source: every input id is seen once by read_committed consumers when an
executor's JVM is SIGKILLed mid-batch and when the driver is killed after its decision, and no
transaction of the sink stays open afterwards."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from kafka_txn_sink.testing import pinned
from kafka_txn_sink.testing.spark_cluster import SparkCluster, wheel_venv
from tests.e2e.harness import (
    ROOT,
    Pipeline,
    assert_exactly_once,
    finish,
    kill_group,
    produce_ids,
    wait_until,
)
from tests.e2e.test_repair import kill_at_batch_1_and_wait_for_the_timeout
from tests.e2e.test_repair_shuffled import (
    assert_repaired,
    first_and_replayed_orders,
    reading_a_reordering_topic,
)

pytestmark = [pytest.mark.kafka, pytest.mark.spark]

N = 1200  # three micro-batches of 400 over three Spark partitions
HELD = "task.after_produce"


@pytest.fixture(scope="module")
def wheel_python(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The interpreter of a venv holding the package's wheel and the pinned PySpark."""
    return wheel_venv(tmp_path_factory.mktemp("wheel"), ROOT, pinned("SPARK_VERSION"))


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory, wheel_python: str) -> Iterator[SparkCluster]:
    with SparkCluster(tmp_path_factory.mktemp("cluster"), workers=2, python=wheel_python) as bed:
        yield bed


@pytest.fixture
def on_cluster(pipeline: Pipeline, cluster: SparkCluster, wheel_python: str) -> Pipeline:
    """The test's pipeline with its driver on the wheel's venv; the cluster has both workers."""
    assert cluster.workers_alive() == 2, cluster.status()
    pipeline.python = wheel_python
    return pipeline


def held_tasks(pipeline: Pipeline) -> list[int]:
    """The pids of the Python workers that reached the held failpoint in batch 1."""
    path = pipeline.signals / f"{HELD}.reached"
    lines = path.read_text().splitlines() if path.exists() else []
    return [entry["pid"] for entry in map(json.loads, filter(None, lines))
            if entry["batch"] == 1]


@pytest.mark.full
def test_several_batches_on_two_workers(on_cluster: Pipeline, cluster: SparkCluster) -> None:
    ids = produce_ids(on_cluster.bootstrap, on_cluster.input, N)
    before = [cluster.applications_on(w) for w in range(2)]

    outcome = on_cluster.run(master=cluster.master_url)

    assert outcome.returncode == 0, outcome.error
    batches = outcome.result["batches"]
    assert isinstance(batches, list) and len(batches) >= 3
    assert_exactly_once(on_cluster, ids)
    # Both workers ran executors of this query, in JVMs of their own.
    assert all(len(cluster.applications_on(w)) == len(before[w]) + 1 for w in range(2))


def test_executor_jvm_killed_while_its_task_is_held(
    on_cluster: Pipeline, cluster: SparkCluster
) -> None:
    ids = produce_ids(on_cluster.bootstrap, on_cluster.input, N)

    process = on_cluster.start(f"{HELD}=block@1", master=cluster.master_url)
    on_cluster.wait_reached(HELD, process)
    holder = cluster.executor_of(held_tasks(on_cluster)[0])
    assert holder is not None, (held_tasks(on_cluster), cluster.executors())
    cluster.kill_executor(holder)
    # Two one-core executors hold at most two tasks: a third reaching the point is the lost
    # task (or the batch's last) run again in the slot the killed executor left.
    wait_until(lambda: len(held_tasks(on_cluster)) >= 3, 180, "a task run after the kill")
    on_cluster.release(HELD)
    outcome = finish(process)

    assert outcome.returncode == 0, outcome.error
    assert_exactly_once(on_cluster, ids)
    assert len(held_tasks(on_cluster)) == 4  # three partitions, and the killed one run again
    assert holder not in cluster.executors()


@pytest.mark.full
def test_driver_killed_after_its_decision_then_restarted(
    on_cluster: Pipeline, cluster: SparkCluster
) -> None:
    ids = produce_ids(on_cluster.bootstrap, on_cluster.input, N)

    process = on_cluster.start("driver.after_decision=block@1", master=cluster.master_url)
    on_cluster.wait_reached("driver.after_decision", process)
    kill_group(process)
    assert on_cluster.reached_batches("driver.after_decision") == [1]

    outcome = on_cluster.run(master=cluster.master_url)

    assert outcome.returncode == 0, outcome.error
    assert_exactly_once(on_cluster, ids)



# CI: tests/e2e/test_repair_shuffled.py's repartition by key in local mode, where the replay's
# other order is certain.
@pytest.mark.full
def test_a_shuffled_query_replayed_is_repaired_on_two_workers(
    on_cluster: Pipeline, cluster: SparkCluster, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 39 on a cluster: `repartition(2, key)` before the sink, the driver killed after
    batch 1's decision and restarted past the transaction timeout, and the repair takes the
    replay. The replay numbers the map tasks in another order, but a reduce task fetches its own
    executor's blocks first, so whether its records come in another order depends on where the
    tasks land (in one CI run of 2026-11-28 they came in the first run's order): the order is
    reported, not required."""
    shuffled = reading_a_reordering_topic(on_cluster)
    shuffled.partitions = 2
    shuffled.shape = ["--repartition-by", "key", "--partition-by-task"]
    ids = kill_at_batch_1_and_wait_for_the_timeout(
        shuffled, "driver.after_decision", cluster.master_url
    )

    restarted = shuffled.run(master=cluster.master_url)

    assert restarted.returncode == 0, restarted.error
    assert_repaired(shuffled, ids)
    orders = first_and_replayed_orders(shuffled)
    assert all(sorted(first) == sorted(again) for first, again in orders.values()), orders
    with capsys.disabled():
        moved = sum(first != again for first, again in orders.values())
        print(f"\ntwo workers: batch 1 written in another order in {moved} of {len(orders)}")
