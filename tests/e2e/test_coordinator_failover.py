"""Coordinator fail-over: the broker coordinating the sink's transactions dies during a commit.

On a cluster of three KRaft nodes (transaction state replicated three times, minimum ISR 2,
one `__transaction_state` partition, so one node coordinates every transactional id), a
streaming query is held at a step of batch 1's commit. The node leading the transaction state
partition of the sink's open transactions is SIGKILLed there, and the query released at once.
The killed node comes back as a supervisor would restart it: at once, or only after the query.
The query must finish, and a read_committed consumer must see every input id exactly once, with
no transaction of the sink left open and no loss recorded in the commit log. Batch 2 runs after
the fail-over, so the tasks also start transactions on the new coordinator.

A group's coordinator moves too: the sink reads a group's offsets (the progress transaction's
fate probe, the start check, `group-offsets`) while the node coordinating it shuts down and
comes back, and must neither die nor answer wrong offsets.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
import uuid
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import pytest
from confluent_kafka import Consumer, TopicPartition
from kafka.admin import KafkaAdminClient

from kafka_txn_sink import LOG_LEVEL_ENV
from kafka_txn_sink.testing.kafka_cluster import KafkaCluster
from tests.e2e.harness import (
    Outcome,
    Pipeline,
    assert_exactly_once,
    finish,
    kill_group,
    open_transactions,
    produce_ids,
)

# One worker takes the module (ci/test.sh: --dist loadgroup), so one three-node cluster serves it.
pytestmark = [pytest.mark.kafka, pytest.mark.spark, pytest.mark.xdist_group("kafka_cluster")]

N = 1000  # batches of 400, 400 and 200 rows (the harness's maxOffsetsPerTrigger)
HELD_BATCH = 1
QUERY_TIMEOUT_S = 150
COMPLETED = "driver.after_completion"


@dataclass(frozen=True)
class Kill:
    """Where the query is held when the coordinator dies, and when that node comes back."""

    step: str
    restart_at_once: bool

    def __str__(self) -> str:
        return f"{self.step}-{'restart_at_once' if self.restart_at_once else 'restart_after'}"


KILLS = [
    Kill("driver.before_decision", restart_at_once=False),  # prepared, not decided
    Kill("driver.after_decision", restart_at_once=True),  # decided, no EndTxn sent
    Kill("driver.after_first_endtxn", restart_at_once=True),  # one participant committed
]


@pytest.fixture
def cluster_pipeline(
    kafka_cluster: KafkaCluster, spark_jars: list[str], tmp_path: Path
) -> Pipeline:
    """A `Pipeline` on the three nodes, its topics on every node; dead nodes started first."""
    kafka_cluster.start()
    name = uuid.uuid4().hex[:10]
    pipeline = Pipeline(
        bootstrap=kafka_cluster.bootstrap,
        jars=",".join(spark_jars),
        workdir=tmp_path,
        sink_id=f"sink_{name}",
        input=kafka_cluster.create_topic(f"in_{name}"),
        output=kafka_cluster.create_topic(f"out_{name}"),
    )
    return pipeline


@pytest.mark.parametrize(
    "kill", [pytest.param(k, marks=() if k is KILLS[1] else (pytest.mark.full,)) for k in KILLS],
    ids=str,
)
def test_a_batch_survives_the_death_of_its_coordinator(
    kill: Kill,
    kafka_cluster: KafkaCluster,
    cluster_pipeline: Pipeline,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    pipeline = cluster_pipeline
    monkeypatch.setenv(LOG_LEVEL_ENV, "WARNING")  # the sink's retries and probes, on stderr
    ids = produce_ids(pipeline.bootstrap, pipeline.input, N)
    process = pipeline.start(f"{kill.step}=block@{HELD_BATCH};{COMPLETED}=signal")
    try:
        pipeline.wait_reached(kill.step, process)
        coordinator = coordinator_of_open_transactions(kafka_cluster, pipeline)
        kafka_cluster.kill(coordinator)
        released_at = time.time()
        pipeline.release(kill.step)
        if kill.restart_at_once:
            kafka_cluster.launch(coordinator)
        outcome = finish(process, QUERY_TIMEOUT_S)
        ended_after_s = time.time() - released_at
    finally:
        if process.poll() is None:  # a failed step above: never leave the query blocked
            kill_group(process)
    if not kill.restart_at_once:
        kafka_cluster.launch(coordinator)
    kafka_cluster.wait_healthy()

    report_outage(kill, pipeline, outcome, released_at, ended_after_s)
    assert outcome.returncode == 0, outcome.error
    assert pipeline.reached_batches(kill.step) == [HELD_BATCH]
    assert_exactly_once(pipeline, ids)
    assert_no_loss_recorded(pipeline)


def coordinator_of_open_transactions(cluster: KafkaCluster, pipeline: Pipeline) -> int:
    """The node coordinating the held batch's open transactions (the test bed's answer, checked
    against the coordinator DescribeTransactions reports)."""
    open_ids = [s.transactional_id for s in open_transactions(pipeline.bootstrap, pipeline.sink_id)]
    assert open_ids, "the held batch has no open transaction"
    by_node = cluster.coordinators(open_ids)
    assert len(by_node) == 1, f"one transaction state partition, yet coordinators {by_node}"
    [node] = by_node
    admin = KafkaAdminClient(bootstrap_servers=pipeline.bootstrap)
    try:
        described = admin.describe_transactions(open_ids)
    finally:
        admin.close()
    assert {d.coordinator_id for d in described.values()} == {node}, described
    return node


def assert_no_loss_recorded(pipeline: Pipeline) -> None:
    """Every batch decided, through the held one and the one after it, completed without loss."""
    commit_log = pipeline.open_log()
    decided = commit_log.decided_batches()
    assert {HELD_BATCH, HELD_BATCH + 1} <= set(decided), decided
    for batch_id in decided:
        completion = commit_log.completion(batch_id)
        assert completion is not None, f"batch {batch_id} has no completion marker"
        assert not completion.lost, f"batch {batch_id} recorded a loss: {completion.lost}"


def report_outage(
    kill: Kill, pipeline: Pipeline, outcome: Outcome, released_at: float, ended_after_s: float
) -> None:
    """Print when each batch completed, counted from the kill, and what the query logged on
    the way (pytest shows it with -s or on failure)."""
    reached = pipeline.signals / f"{COMPLETED}.reached"
    lines = reached.read_text().splitlines() if reached.exists() else []
    completed = {c["batch"]: round(c["at"] - released_at, 1) for c in map(json.loads, lines)}
    (pipeline.workdir / "query.stderr").write_text(outcome.stderr)
    loggers = Counter(
        " ".join(line.split()[3:5]) for line in outcome.stderr.splitlines()
        if line[:2] == "20" and len(line.split()) > 4
    )
    print(f"\n{kill}: seconds from the kill to each batch's completion {completed}; "
          f"query ended {ended_after_s:.1f} s after the kill, ran {outcome.result.get('seconds')}"
          f" s, exit {outcome.returncode}; "
          f"log lines {dict(loggers)}; stderr in {pipeline.workdir / 'query.stderr'}")


# Reads the group's offsets as `kafka-txn-sink group-offsets` does, its members and the input's
# ends as the start check does, until told to stop.
READER = """
import json, sys, time
from pathlib import Path
from kafka_txn_sink.errors import KafkaTxnSinkError
from kafka_txn_sink.kafka.cluster import Cluster
bootstrap, group, stop = sys.argv[1], sys.argv[2], Path(sys.argv[3])
cluster = Cluster(bootstrap, {}, 15000)
answers, errors, described, end = {}, {}, {}, time.monotonic() + 240
while not stop.exists() and time.monotonic() < end:
    try:
        held = cluster.committed_offsets(group)
        cluster.log_ends(held)
        key = json.dumps(held, sort_keys=True)
        answers[key] = answers.get(key, 0) + 1
    except KafkaTxnSinkError as exc:
        errors[str(exc)[:200]] = errors.get(str(exc)[:200], 0) + 1
    try:
        cluster.group_members(group)
    except KafkaTxnSinkError as exc:
        described[str(exc)[:200]] = described.get(str(exc)[:200], 0) + 1
print(json.dumps({"answers": answers, "errors": errors, "describe errors": described}))
"""


def test_reading_a_groups_offsets_survives_its_coordinator_moving(
    kafka_cluster: KafkaCluster, tmp_path: Path
) -> None:
    # librdkafka's AdminClient dereferenced a null consumer-group handle when a coordinator
    # answered its OffsetFetch NOT_COORDINATOR: the reading process died of SIGSEGV. And a read
    # of offsets must ride out the move: no error while the group and the leaders find their new
    # nodes. Describing the group (librdkafka's) may still time out once: printed, not asserted
    # (docs/consumer_groups.md).
    kafka_cluster.start()
    name = uuid.uuid4().hex[:10]
    topic, group = kafka_cluster.create_topic(f"in_{name}"), f"group_{name}"
    committed = {topic: {0: 5, 1: 6, 2: 7}}
    consumer = Consumer({"bootstrap.servers": kafka_cluster.bootstrap, "group.id": group})
    try:
        consumer.commit(offsets=[TopicPartition(topic, p, o) for p, o in committed[topic].items()],
                        asynchronous=False)
    finally:
        consumer.close()
    stop = tmp_path / "stop"
    reader = subprocess.Popen(
        [sys.executable, "-c", READER, kafka_cluster.bootstrap, group, str(stop)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        for _ in range(2):  # a graceful shutdown hands the group over while the node answers
            coordinator = kafka_cluster.group_coordinator(group)
            kafka_cluster.node(coordinator).stop()
            kafka_cluster.restart(coordinator)
            if reader.poll() is not None:
                break
        time.sleep(2)  # reads against the settled cluster
        stop.touch()
        out, err = reader.communicate(timeout=60)
    finally:
        if reader.poll() is None:
            reader.kill()
    died = f"signal {signal.Signals(-reader.returncode).name}" if reader.returncode < 0 else ""
    assert reader.returncode == 0, f"the reader died ({died or reader.returncode}): {err[-2000:]}"
    seen = json.loads(out)
    print(f"\nreads of the group while its coordinator moved: {seen}")
    expected = json.dumps({topic: {str(p): o for p, o in committed[topic].items()}}, sort_keys=True)
    assert list(seen["answers"]) == [expected], seen
    assert not seen["errors"], seen
