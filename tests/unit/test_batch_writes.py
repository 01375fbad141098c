"""Batch writes (`df.write`, option writeId) on the driver, without Spark or a broker: the option,
the refusals before anything runs, finding a write again in the log, and the decision of a
write's batch (a fake TxnAdmin and a real local commit log, as in test_decide.py).

The whole write through Spark and a real broker is tested in tests/e2e/test_batch_writes.py.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from pyspark.sql.types import StringType, StructField, StructType

from kafka_txn_sink.commit_log import open_commit_log
from kafka_txn_sink.datasource import KafkaTxnDataSource
from kafka_txn_sink.errors import (
    CommitLogConflictError,
    ConfigError,
    QueryIdMismatchError,
    TransactionTooOldError,
)
from kafka_txn_sink.options import parse_options
from kafka_txn_sink.protocol.complete import Settler
from kafka_txn_sink.protocol.decide import Committer
from kafka_txn_sink.protocol.messages import Decision
from kafka_txn_sink.protocol.run_records import SinkMeta
from kafka_txn_sink.protocol.runs import RunRef
from kafka_txn_sink.protocol.start import find_write
from kafka_txn_sink.protocol.task_commit import TaskCommit
from kafka_txn_sink.protocol.write_ids import BatchWrite, is_batch_write, write_query_id
from tests.unit.test_decide import SINK, Driver, FakeCluster, FakeTxnAdmin, prepared

BASE = {"kafka.bootstrap.servers": "127.0.0.1:1", "sinkId": SINK, "commitLog": "/tmp/none"}
SCHEMA = StructType([StructField("key", StringType()), StructField("value", StringType())])


# -- the option, and what is refused before anything runs -----------------------------------------


def test_write_id_is_parsed_and_absent_by_default() -> None:
    assert parse_options({**BASE, "WRITEID": " 2026-11-21 nightly "}).write_id == (
        "2026-11-21 nightly"
    )
    assert parse_options(BASE).write_id is None


@pytest.mark.parametrize("write_id", ["", "   ", "x" * 201, "line\nbreak", "nul\x00"])
def test_a_write_id_that_is_not_1_to_200_printable_characters_is_named(write_id: str) -> None:
    with pytest.raises(ConfigError, match="option writeId must be 1-200 printable characters"):
        parse_options({**BASE, "writeId": write_id})


def test_a_batch_write_without_write_id_is_refused_naming_it() -> None:
    source = KafkaTxnDataSource({**BASE, "topic": "out"})

    with pytest.raises(ConfigError, match="option writeId is required in a batch write"):
        source.writer(SCHEMA, overwrite=False)


def test_save_mode_overwrite_is_refused_naming_it() -> None:
    source = KafkaTxnDataSource({**BASE, "topic": "out", "writeId": "w"})

    with pytest.raises(ConfigError, match=r"save mode overwrite is not supported.*append"):
        source.writer(SCHEMA, overwrite=True)


def test_a_streaming_query_with_write_id_is_refused_naming_it() -> None:
    source = KafkaTxnDataSource({**BASE, "topic": "out", "writeId": "w"})

    with pytest.raises(ConfigError, match="option writeId is for batch writes"):
        source.streamWriter(SCHEMA, overwrite=False)


# -- a write found again by its id -----------------------------------------------------------------


def decision(batch_id: int, query_id: str) -> Decision:
    return Decision(SINK, query_id, batch_id, (), tasks=1, rows=0, decided_at_ms=1)


def test_a_write_is_found_by_its_id_among_the_others(driver: Driver) -> None:
    driver.log.create(SinkMeta(SINK, 1))
    for batch_id, write_id in enumerate(["mon", "tue", "wed"]):
        driver.log.put_decision(decision(batch_id, write_query_id(write_id)))

    found = find_write(driver.log, write_query_id("tue"))

    assert found is not None and found.batch_id == 1
    assert find_write(driver.log, write_query_id("thu")) is None
    assert find_write(driver.log, "tue") is None  # a streaming query id is never a write's


def test_a_write_query_id_never_looks_like_a_spark_query_id() -> None:
    assert is_batch_write(BatchWrite("2026-11-21", 0).query_id)
    assert not is_batch_write("5f0c6a3e-1d2b-4c8e-9a7f-0b1c2d3e4f50")


# -- the decision of a write's batch -------------------------------------------------------------


@pytest.fixture
def driver(tmp_path: Path) -> Driver:
    return make_driver(tmp_path, write=None)


def make_driver(tmp_path: Path, write: BatchWrite | None) -> Driver:
    options = parse_options(
        {
            **BASE,
            "commitLog": str(tmp_path / "log"),
            "commitTimeoutMs": "1000",
            "commitLogTimeoutMs": "1000",
            "clockSkewMs": "1000",
        }
    ).with_transaction_timeout(60_000)
    log = open_commit_log(options.commit_log)
    txn_admin, cluster = FakeTxnAdmin(), FakeCluster()
    settler = Settler(SINK, log, txn_admin, cluster, deadline_s=1)
    committer = Committer(options, log, txn_admin, settler, RunRef(0, 0), write=write)
    return Driver(log, txn_admin, cluster, committer)


def write_task(driver: Driver, write: BatchWrite, partition: int) -> TaskCommit:
    return prepared(driver, write.batch_id, partition, query=write.query_id)


def test_a_write_is_decided_under_its_own_query_id_after_other_writes(tmp_path: Path) -> None:
    monday = BatchWrite("mon", 0)
    make_driver(tmp_path, monday).committer.commit([], 0)
    tuesday = BatchWrite("tue", 1)
    driver = make_driver(tmp_path, tuesday)

    driver.committer.commit([write_task(driver, tuesday, p) for p in range(2)], 1)

    decided = driver.log.decision(1)
    assert decided is not None and decided.query_id == "write:tue"
    assert len(decided.participants) == 2 and driver.log.completion(1) is not None


def test_a_streaming_commit_still_checks_the_query_id(tmp_path: Path) -> None:
    make_driver(tmp_path, BatchWrite("mon", 0)).committer.commit([], 0)
    driver = make_driver(tmp_path, write=None)

    with pytest.raises(QueryIdMismatchError):
        driver.committer.commit([prepared(driver, 1, 0)], 1)


def test_an_empty_write_is_decided_under_its_query_id(tmp_path: Path) -> None:
    driver = make_driver(tmp_path, BatchWrite("empty", 0))

    driver.committer.commit([], 0)

    assert find_write(driver.log, write_query_id("empty")) is not None


def test_a_write_decided_before_commits_without_error_and_writes_nothing(tmp_path: Path) -> None:
    write = BatchWrite("mon", 0)
    driver = make_driver(tmp_path, write)
    driver.committer.commit([write_task(driver, write, 0)], 0)
    driver.txn_admin.calls.clear()
    skipped = TaskCommit(write.query_id, 0, 0, 0, "skipped")  # the re-run's task

    driver.committer.commit([skipped], 0)

    assert [call for call in driver.txn_admin.calls if call[1]] == []  # no EndTxn(commit)


def test_a_write_whose_batch_another_write_decided_meanwhile_fails(tmp_path: Path) -> None:
    monday = BatchWrite("mon", 0)
    make_driver(tmp_path, monday).committer.commit([], 0)
    tuesday = BatchWrite("tue", 0)  # planned before monday's decision: the same batch
    driver = make_driver(tmp_path, tuesday)
    skipped = TaskCommit(tuesday.query_id, 0, 0, 0, "skipped")  # its task saw the decision

    with pytest.raises(CommitLogConflictError, match=r"one write at a time.*'tue'"):
        driver.committer.commit([skipped], 0)

    assert find_write(driver.log, tuesday.query_id) is None  # so a re-run writes it


def test_a_write_too_old_to_commit_says_to_run_it_again(tmp_path: Path) -> None:
    write = BatchWrite("big", 0)
    driver = make_driver(tmp_path, write)
    task = write_task(driver, write, 0)
    driver.txn_admin.open(task.prepared_triple, start_ms=int(time.time() * 1000) - 59_000)

    with pytest.raises(TransactionTooOldError, match=r"write 'big' \(batch 0\).*same writeId"):
        driver.committer.commit([task], 0)

    assert driver.log.decision(0) is None
