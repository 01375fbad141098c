"""Records mode over Spark Connect, the shape of Databricks serverless and standard access mode:
a Connect client (PySpark 4.3 in remote mode) sends the query to a Connect server started from
PySpark 4.3's own jars, whose Python workers have the package. A client that calls
`register(spark)` starts the query; the server is SIGKILLed (its whole process tree) after
batch 1's decision and restarted; a client that finds the sink by its short name, without
importing the package, restarts the query from the same checkpoint: every input id is seen once
by read_committed consumers and no transaction of the sink stays open."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from kafka_txn_sink import failpoints
from kafka_txn_sink.testing.spark_connect import SparkConnectServer
from tests.e2e.conftest import NEWEST
from tests.e2e.harness import (
    Pipeline,
    assert_exactly_once,
    kill_group,
    open_transactions,
    produce_ids,
)

pytestmark = [pytest.mark.kafka, pytest.mark.spark]

N = 1200  # three micro-batches of 400 over three Spark partitions
POINT = "driver.after_decision"


@pytest.fixture
def connect_server(pipeline: Pipeline) -> Iterator[SparkConnectServer]:
    """A Connect server of the pipeline's PySpark and connector jars, its workers' failpoints
    armed to hold batch 1 after its decision; the pipeline is its client."""
    armed = failpoints.environment(f"{POINT}=block@1", pipeline.signals, max_s=300)
    server = SparkConnectServer(pipeline.workdir / "connect", pipeline.python,
                                pipeline.jars.split(","), env=armed)
    pipeline.remote = server.url
    with server:
        yield server


@pytest.mark.parametrize("pipeline", [NEWEST], indirect=True)
def test_register_then_short_name_across_a_server_killed_after_its_decision(
    pipeline: Pipeline, connect_server: SparkConnectServer
) -> None:
    ids = produce_ids(pipeline.bootstrap, pipeline.input, N)

    pipeline.register = True
    process = pipeline.start()
    pipeline.wait_reached(POINT, process)
    connect_server.kill()
    kill_group(process)  # its session died with the server
    assert pipeline.reached_batches(POINT) == [1]
    assert pipeline.open_log().decided_batches() == [0, 1]
    decided = pipeline.open_log().decision(1)
    assert decided is not None and decided.participants
    # The kill struck between the decision and its EndTxns: batch 1's participants are open.
    still_open = {t.triple for t in open_transactions(pipeline.bootstrap, pipeline.sink_id)}
    assert {p.triple for p in decided.participants} <= still_open

    connect_server.env = {}  # failpoints disarmed
    connect_server.start()
    pipeline.register = False  # format("kafka_txn") by its short name
    outcome = pipeline.run()

    assert outcome.returncode == 0, outcome.error + "\n" + connect_server.log.read_text()[-3000:]
    assert outcome.result["sink_imported"] is False  # the client needs no kafka_txn_sink
    batches = outcome.result["batches"]
    assert isinstance(batches, list) and batches[0] == 1  # from the checkpoint: batch 1 again
    report = assert_exactly_once(pipeline, ids)
    assert report.seen == N
    commit_log = pipeline.open_log()
    decided = commit_log.decided_batches()
    assert decided == list(range(len(decided))) and len(decided) >= 3, decided
    assert len(commit_log.owners()) == 2  # one run per server start
