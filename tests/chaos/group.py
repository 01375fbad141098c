"""The consumer group the sink commits its input offsets to (option consumerGroup), checked after
every trial and after the drain: it holds the end offsets of the newest batch that is complete,
or of the batch after it when that one is decided and only its completion marker is missing (the
progress transaction commits just before the marker), never anything else."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from confluent_kafka import ConsumerGroupTopicPartitions
from confluent_kafka.admin import AdminClient

from kafka_txn_sink.commit_log import CommitLog
from kafka_txn_sink.protocol.repair import batch_levels
from kafka_txn_sink.spark_checkpoint import batch_end_offsets
from tests.chaos.bed import Bed, Sink
from tests.chaos.oracle import commit_log_of

Offsets = dict[str, dict[int, int]]


def group_offsets(bootstrap: str, group: str) -> Offsets:
    """What the group has committed, as any lag tool reads it (no require_stable)."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    request = [ConsumerGroupTopicPartitions(group)]
    answer = admin.list_consumer_group_offsets(request, request_timeout=30)[group].result(
        timeout=60
    )
    found: Offsets = {}
    for tp in answer.topic_partitions or ():
        if tp.offset >= 0:
            found.setdefault(tp.topic, {})[tp.partition] = tp.offset
    return found


def newest_complete(commit_log: CommitLog) -> int | None:
    """The newest decided batch whose every level is complete with nothing waiting."""
    for batch in sorted(commit_log.decided_batches(), reverse=True):
        decision = commit_log.decision(batch)
        if decision is None:
            continue
        levels = batch_levels(commit_log, decision)
        if levels.settled and not levels.waiting():
            return batch
    return None


def group_anomaly(bed: Bed, sink: Sink, final: bool = False) -> str | None:
    """Why the group's offsets are not where the log says, or None. `final`: after the drain,
    every batch is complete, and the group must hold the last one's end exactly."""
    held = group_offsets(bed.bootstrap, sink.group)
    commit_log = commit_log_of(bed, sink)
    complete = newest_complete(commit_log)
    allowed: dict[str, Offsets] = {"none": {}} if complete is None else {}
    if complete is not None:
        allowed[f"batch {complete}"] = batch_end_offsets(str(sink.checkpoint), complete)
    after = 0 if complete is None else complete + 1
    if not final and commit_log.decision(after) is not None:
        allowed[f"batch {after}"] = batch_end_offsets(str(sink.checkpoint), after)
    if held in allowed.values():
        return None
    return (
        f"group {sink.group} holds {held}, not the end offsets of "
        f"{' or '.join(allowed)} ({list(allowed.values())})"
    )


def group_anomalies(results: Iterable[dict[str, Any]]) -> list[str]:
    """The trials after which the group was not where the log says."""
    return [f"trial {r['index']}: {r['group']}" for r in results if r.get("group", "ok") != "ok"]
