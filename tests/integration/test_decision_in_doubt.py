"""A decision write whose outcome the driver never learns (issue 24, defect 1), on the real
broker and S3 server: a proxy holds the driver's PUTs of the batch's outcome key past the
client's deadlines, then delivers them, as a network may deliver a request its client gave up
on. Spark then calls abort(). Whatever lands, the batch has one outcome: decided and then
completed whole, or aborted and run again; never decided with its transactions aborted.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from kafka_txn_sink.commit_log import open_commit_log
from kafka_txn_sink.errors import CommitLogError
from kafka_txn_sink.kafka.groups import fetch_offsets
from kafka_txn_sink.kafka.txn_admin import ONGOING, TxnAdmin
from kafka_txn_sink.options import SinkOptions, parse_options
from kafka_txn_sink.protocol.decide import abort_batch, commit_batch
from kafka_txn_sink.protocol.messages import Abort
from kafka_txn_sink.protocol.runs import RunRef, take_over
from kafka_txn_sink.protocol.task_commit import TaskCommit
from kafka_txn_sink.protocol.txn_ids import progress_id
from kafka_txn_sink.testing import create_topic
from kafka_txn_sink.testing.topics import read_topic
from tests.conftest import S3_TEST_SECRET
from tests.integration.test_restart_ids import prepare
from tests.s3_proxy import HoldingProxy

pytestmark = [pytest.mark.kafka, pytest.mark.s3]

PARTITIONS = 2
# commitLogTimeoutMs 3000: S3 calls of 0.5 s, 3 attempts (options._s3_settings).
HOLD_S = 30.0  # a bound only: the test releases the held PUTs itself


def _options(
    bootstrap: str,
    endpoint: str,
    bucket: str,
    names: tuple[str, str],
    group: dict[str, str] | None = None,
) -> Any:
    topic, sink_id = names
    return parse_options(
        {
            **(group or {}),
            "kafka.bootstrap.servers": bootstrap,
            "topic": topic,
            "sinkId": sink_id,
            "commitLog": f"s3://{bucket}/log",
            "s3.endpoint": endpoint,
            "s3.region": "us-east-1",
            "s3.accessKeyId": "testing",
            "s3.secretAccessKey": S3_TEST_SECRET,
            "commitTimeoutMs": "5000",
            "commitLogTimeoutMs": "3000",
            "clockSkewMs": "1000",
        }
    ).with_transaction_timeout(60_000)


def _run_batch(options: SinkOptions, batch_id: int) -> tuple[RunRef, list[TaskCommit]]:
    owner = take_over(options.sink_id, open_commit_log(options.commit_log, options.s3), 0)
    run = RunRef(owner.run, owner.slot)
    return run, [prepare(options, run, batch_id, p) for p in range(PARTITIONS)]


def _values(bootstrap: str, options: SinkOptions) -> list[str]:
    assert options.topic is not None
    return sorted(r.value.decode() for r in read_topic(bootstrap, options.topic) if r.value)


@pytest.mark.parametrize("held", [b'"kind":"decision"', b'"kind"'], ids=["decision", "both"])
def test_a_decision_that_lands_after_abort_loses_nothing(
    kafka_bootstrap: str,
    s3_endpoint: str,
    s3_bucket: str,
    unique: Callable[[str], str],
    held: bytes,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`decision`: only the decision's PUTs are held, so abort()'s record lands first and the
    late decision is refused; `both`: abort()'s PUT is held too, so abort() aborts nothing
    and whichever held PUT arrives first is the round's outcome."""
    names = (unique("in_doubt_out"), unique("in_doubt"))
    create_topic(kafka_bootstrap, names[0], partitions=PARTITIONS)
    with HoldingProxy(s3_endpoint, "/log/decisions/", held, HOLD_S) as proxy:
        options = _options(kafka_bootstrap, proxy.endpoint, s3_bucket, names)
        monkeypatch.setattr("kafka_txn_sink.protocol.runs.driver_identity", lambda: "driver-a")
        run, tasks = _run_batch(options, 0)

        with pytest.raises(CommitLogError):
            commit_batch(options, tasks, 0, run)  # Spark's commit(): no answer to any PUT
        abort_batch(options, tasks, 0, run)  # then Spark's abort()
        proxy.release()  # the held PUTs arrive now
        deadline_ok = _wait(lambda: len(proxy.delivered) == proxy.held > 0)
        assert deadline_ok, f"held {proxy.held}, delivered {proxy.delivered}"

    # The query restarts (another driver) and replays batch 0, as Spark does.
    options = _options(kafka_bootstrap, s3_endpoint, s3_bucket, names)
    monkeypatch.setattr("kafka_txn_sink.protocol.runs.driver_identity", lambda: "driver-b")
    log = open_commit_log(options.commit_log, options.s3)
    first = log.outcome(0, 0)
    run, replayed = _run_batch(options, 0)
    commit_batch(options, replayed, 0, run)
    commit_batch(options, [prepare(options, run, 1, p) for p in range(PARTITIONS)], 1, run)

    expected = sorted(f"{b}-{p}" for b in (0, 1) for p in range(PARTITIONS))
    assert _values(kafka_bootstrap, options) == expected  # every row once
    completion = log.completion(0)
    assert completion is not None and completion.lost == ()
    decided = log.decision(0)
    assert decided is not None
    if isinstance(first, Abort):  # abort()'s record won the key: the late decision was refused
        assert 412 in proxy.delivered and decided.round == 1
    else:  # the decision landed first: it is the batch's, completed by the restarted query
        assert decided == first
    if held == b'"kind":"decision"':
        assert isinstance(first, Abort)  # abort()'s PUT was not held


def _wait(done: Callable[[], bool], timeout_s: float = 20.0) -> bool:
    import time

    deadline = time.monotonic() + timeout_s
    while not done():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def _checkpoint(path: Path, topic: str) -> Path:
    """A Spark checkpoint whose batch 0 read `topic` up to offset 0 of each partition."""
    (path / "offsets").mkdir(parents=True)
    end = {topic: {str(p): 0 for p in range(PARTITIONS)}}
    meta = '{"batchWatermarkMs":0,"batchTimestampMs":0,"conf":{}}'
    (path / "offsets" / "0").write_text(f"v1\n{meta}\n{json.dumps(end)}")
    return path


def test_abort_after_a_decision_in_doubt_leaves_the_group_readable(
    kafka_bootstrap: str,
    s3_endpoint: str,
    s3_bucket: str,
    unique: Callable[[str], str],
    tmp_path: Path,
) -> None:
    """Review N8, option consumerGroup: commit() opened the batch's progress transaction, and
    its decision write got no answer. Spark's abort() (another process, the tasks' messages
    only) closes the round with its abort record and then ends the progress transaction too, so
    the group's stable offsets can be read at once, not only after the transaction timeout
    (60 s here)."""
    names = (unique("in_doubt_out"), unique("in_doubt_g"))
    source, group = unique("in_doubt_in"), unique("in_doubt_group")
    create_topic(kafka_bootstrap, names[0], partitions=PARTITIONS)
    create_topic(kafka_bootstrap, source, partitions=PARTITIONS)
    settings = {
        "consumerGroup": group,
        "checkpointLocation": str(_checkpoint(tmp_path / "checkpoint", source)),
    }
    with HoldingProxy(s3_endpoint, "/log/decisions/", b'"kind":"decision"', HOLD_S) as proxy:
        options = _options(kafka_bootstrap, proxy.endpoint, s3_bucket, names, settings)
        run, tasks = _run_batch(options, 0)
        with pytest.raises(CommitLogError):
            commit_batch(options, tasks, 0, run)
        abort_batch(options, tasks, 0, run)
        proxy.release()

    progress = progress_id(options.sink_id, slot=run.slot)
    with TxnAdmin(kafka_bootstrap, {}) as client:
        state = client.describe([progress])[progress]
        offsets = fetch_offsets(
            client, group, {source: dict.fromkeys(range(PARTITIONS), 0)}, 10, stable=True
        )
    assert state.state != ONGOING, f"{progress} is still open after abort(): {state}"
    assert offsets == {}  # nothing committed, nothing pending
    assert _values(kafka_bootstrap, options) == []
