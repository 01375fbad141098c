"""Decisions for the commit-log tests, and processes racing to write them.

Shared by the JSON and Delta log tests, local and on S3. Spawned race workers import
``race_worker`` from here by name, so it lives in an importable module, not in a test file.
"""

from __future__ import annotations

import multiprocessing
import queue
import time
from typing import Any

from kafka_txn_sink.commit_log import LogFormat, open_commit_log
from kafka_txn_sink.errors import CommitLogConflictError
from kafka_txn_sink.protocol.messages import Decision, Participant, Triple
from kafka_txn_sink.storage import S3Settings


def make_decision(
    batch_id: int,
    query_id: str = "query-1",
    decided_at_ms: int = 1_000,
    partitions: tuple[int, ...] = (0, 1),
    tasks: int | None = None,
) -> Decision:
    """Decision of batch ``batch_id`` of sink ``orders``: one participant per partition."""
    participants = tuple(
        Participant(
            partition=p,
            attempt=0,
            triple=Triple(f"orders-{p}", 4000 + p, batch_id),
            rows=10,
            offsets={"events_out": {p: (batch_id * 10, batch_id * 10 + 9)}},
        )
        for p in partitions
    )
    return Decision(
        sink_id="orders",
        query_id=query_id,
        batch_id=batch_id,
        participants=participants,
        tasks=len(partitions) if tasks is None else tasks,
        rows=10 * len(partitions),
        decided_at_ms=decided_at_ms,
    )


def race_worker(
    uri: str,
    settings: S3Settings | None,
    rounds: int,
    query_id: str,
    decided_at_ms: int,
    barrier: Any,
    results: Any,
    fmt: LogFormat = "json",
) -> None:
    """In a spawned process: put ``rounds`` decisions, each after ``barrier``; report outcomes."""
    log = open_commit_log(uri, settings, fmt)
    outcomes = []
    for batch_id in range(rounds):
        barrier.wait(60)
        try:
            log.put_decision(make_decision(batch_id, query_id, decided_at_ms))
            outcomes.append("ok")
        except CommitLogConflictError:
            outcomes.append("conflict")
        except Exception as exc:
            outcomes.append(f"error: {exc!r}")
    results.put((query_id, decided_at_ms, outcomes))


def race(
    uri: str,
    settings: S3Settings | None,
    rounds: int,
    writers: list[tuple[str, int]],
    fmt: LogFormat = "json",
) -> list[tuple[str, int, list[str]]]:
    """Run one spawned process per (query id, decision time); their outcomes, in that order."""
    context = multiprocessing.get_context("spawn")
    barrier = context.Barrier(len(writers))
    results = context.Queue()
    processes = [
        context.Process(
            target=race_worker, args=(uri, settings, rounds, query, at, barrier, results, fmt)
        )
        for query, at in writers
    ]
    for process in processes:
        process.start()
    try:
        found = _collect(results, processes)
        for process in processes:
            process.join(60)
            assert process.exitcode == 0
    finally:
        for process in processes:
            if process.is_alive():
                process.terminate()
    return sorted(found, key=lambda result: writers.index(result[:2]))


def _collect(results: Any, processes: list[Any], timeout_s: float = 180) -> list[Any]:
    """Every worker's result; fails at once if a worker died instead of reporting."""
    found: list[Any] = []
    deadline = time.monotonic() + timeout_s
    while len(found) < len(processes):
        try:
            found.append(results.get(timeout=0.5))
        except queue.Empty:
            died = [p.exitcode for p in processes if p.exitcode not in (None, 0)]
            assert not died, f"a race worker died with exit code(s) {died}"
            assert time.monotonic() < deadline, "the race workers did not finish in time"
    return found


def check_identical_race(
    uri: str, settings: S3Settings | None, rounds: int, fmt: LogFormat = "json"
) -> None:
    """Two processes put the same decisions (times apart): both succeed, the decision is stored."""
    results = race(uri, settings, rounds, [("query-1", 1), ("query-1", 2)], fmt)
    assert [outcomes for _, _, outcomes in results] == [["ok"] * rounds] * 2
    log = open_commit_log(uri, settings, fmt)
    for batch_id in range(rounds):
        stored = log.decision(batch_id)
        assert stored is not None and stored.same_decision(make_decision(batch_id))


def check_different_race(
    uri: str, settings: S3Settings | None, rounds: int, fmt: LogFormat = "json"
) -> None:
    """Two processes put different decisions: per batch one wins, one gets a conflict."""
    results = race(uri, settings, rounds, [("query-1", 1), ("query-2", 2)], fmt)
    log = open_commit_log(uri, settings, fmt)
    for batch_id in range(rounds):
        outcomes = {query: outcomes[batch_id] for query, _, outcomes in results}
        assert sorted(outcomes.values()) == ["conflict", "ok"], (batch_id, outcomes)
        winner = next(query for query, outcome in outcomes.items() if outcome == "ok")
        stored = log.decision(batch_id)
        assert stored is not None and stored.query_id == winner, (batch_id, outcomes)
