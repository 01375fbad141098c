"""Consumer-group progress: a batch's input offsets committed to a group together with its rows.

With option `consumerGroup`, `commit()` opens the run's *progress transaction* on its slot's id
`{sinkId}-{slot}-g` before the prepare check: InitProducerId, then AddOffsetsToTxn and
TxnOffsetCommit of the batch's end offsets, which Spark wrote to
`<checkpointLocation>/offsets/<batchId>` before it ran the batch. The transaction joins the
decision as a participant of partition -1 with no records, so the prepare check, the decision,
the clean-up and recovery cover it like any other. Completing the batch (complete.py) ends it
last: EndTxn(commit) only once every row of the batch is visible, or EndTxn(abort) by its
exact triple once a row was lost, recorded lost beside the rows; the replay's repair
(repair.py) then opens a new one. So the group's offsets move when the batch's rows become
visible, never before, and never back. The transaction itself is progress_txn.py's. The model
(`--offsets participant`) checks this design, and shows why committing the offsets after the
completion, or ending this participant first, is wrong.
"""

from __future__ import annotations

from kafka_txn_sink.errors import ConfigError
from kafka_txn_sink.group_options import CONSUMER_GROUP, GROUP_KAFKA_PREFIX, GroupOptions
from kafka_txn_sink.kafka.cluster import Cluster, shared_cluster
from kafka_txn_sink.options import SinkOptions
from kafka_txn_sink.protocol.messages import GroupOffsets, GroupProgress
from kafka_txn_sink.spark_checkpoint import batch_end_offsets, newest_batch


def batch_progress(options: SinkOptions, batch_id: int) -> GroupProgress | None:
    """What batch `batch_id` commits to the group: its end offsets in Spark's offset log; None
    without option consumerGroup.

    Raises:
        ConfigError: the checkpoint has no offsets for the batch, or names no Kafka topic.
    """
    if options.progress is None:
        return None
    offsets = batch_end_offsets(options.progress.checkpoint, batch_id, options.s3)
    return GroupProgress(options.progress.group, offsets)


def check_progress_start(options: SinkOptions, cluster: Cluster) -> None:
    """Before a batch with option consumerGroup: the query reads Kafka topics that live on the
    group's cluster (the output's, by default), and the group has no active member (whose own
    commits would interleave with the sink's).

    Raises:
        ConfigError: the checkpoint names no Kafka topic, an input topic or partition is not on
            the group's cluster, or the group has members; the message names the group.
        PermissionDeniedError: the sink may not describe the group.
    """
    if options.progress is None:
        return
    group, checkpoint = options.progress.group, options.progress.checkpoint
    if options.progress.elsewhere:
        cluster = group_cluster(options.progress, options.commit_timeout_ms)
    batch = newest_batch(checkpoint, options.s3)
    if batch is not None:
        _check_input_here(options, cluster, batch_end_offsets(checkpoint, batch, options.s3))
    members = cluster.group_members(group)
    if members:
        raise ConfigError(
            f"option {CONSUMER_GROUP}: consumer group {group} has {members} active member(s); "
            f"the sink commits the query's offsets to it, and a consumer in it would commit "
            f"its own over them. Name a group that no consumer joins"
        )


def _check_input_here(options: SinkOptions, cluster: Cluster, offsets: GroupOffsets) -> None:
    """Every input partition exists on the output cluster, and its end is not below the
    query's offsets (a topic of the same name on another cluster)."""
    for topic, parts in offsets.items():
        count = cluster.topic_partitions(topic)
        if count is None or max(parts) >= count:
            found = "no such topic" if count is None else f"{count} partitions"
            raise _input_elsewhere(options, topic, f"partitions {sorted(parts)}; here: {found}")
    ends = cluster.log_ends(offsets)
    for topic, parts in offsets.items():
        beyond = {p: o for p, o in parts.items() if o > ends.get(topic, {}).get(p, -1)}
        if beyond:
            here = {p: ends[topic].get(p) for p in beyond}
            raise _input_elsewhere(
                options, topic, f"the query read up to {beyond}, the end here is {here}"
            )


def _input_elsewhere(options: SinkOptions, topic: str, detail: str) -> ConfigError:
    assert options.progress is not None
    if options.progress.elsewhere:
        where = f"the group's cluster {options.progress.bootstrap}"
        why = f"option {GROUP_KAFKA_PREFIX}bootstrap.servers must name the input's cluster"
    else:
        where = f"the output cluster {options.bootstrap_servers}"
        why = (
            f"the offsets are committed in the output's transactions, so the input must live "
            f"there too, or name its cluster with option {GROUP_KAFKA_PREFIX}bootstrap.servers"
        )
    return ConfigError(
        f"option {CONSUMER_GROUP} ({options.progress.group}): input topic {topic} is not on "
        f"{where} ({detail}); {why}"
    )


def group_cluster(progress: GroupOptions, timeout_ms: int) -> Cluster:
    """The admin client of the group's own cluster (option consumerGroup.kafka.*), kept for the
    process."""
    return shared_cluster(progress.bootstrap, progress.kafka, timeout_ms)
