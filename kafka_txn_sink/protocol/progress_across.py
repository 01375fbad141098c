"""Consumer-group progress for a group on another cluster than the output: committed after the
batch's rows are visible, never ahead of them and never back.

With option `consumerGroup.kafka.bootstrap.servers`, the input topics and the group live on a
cluster the output's transactions cannot reach, so the offsets cannot move with the rows. Once a
batch is complete and its commit markers are written, `commit()` commits them in a transaction
of the sink's own on the group's cluster, on one id for the whole sink (`{sinkId}-group`):

1. InitProducerId, which fences any other driver's commit of the group still in progress;
2. OffsetFetch (stable) of the group, inside that fenced window;
3. AddOffsetsToTxn and TxnOffsetCommit of each partition whose batch end offset is ahead of what
   the group holds (the others are left as they are), then EndTxn(commit).

An older driver replaying an earlier batch reads the newer offsets and commits nothing behind
them; a commit whose window another driver entered is fenced and fails. So the group never moves
back, and never holds offsets of rows that are not visible. It is not atomic with the rows: a
driver that stops between the two leaves the group one batch behind until the next batch, or the
replay of this one, commits. The model (`--offsets fenced`) checks this design.
"""

from __future__ import annotations

import logging

from kafka_txn_sink.group_options import GroupOptions
from kafka_txn_sink.kafka.producer_settings import producer_config
from kafka_txn_sink.options import SinkOptions
from kafka_txn_sink.protocol.messages import GroupOffsets, GroupProgress
from kafka_txn_sink.protocol.progress import batch_progress, group_cluster
from kafka_txn_sink.protocol.progress_txn import ProgressTransaction, group_metadata
from kafka_txn_sink.protocol.txn_ids import group_id

log = logging.getLogger(__name__)

# The group's transaction holds no records and lives for three requests; a driver that dies in
# it is fenced by the next commit's InitProducerId long before this.
GROUP_TXN_TIMEOUT_MS = 60_000


def commit_across(options: SinkOptions, batch_id: int) -> GroupOffsets:
    """Commit batch `batch_id`'s end offsets to the group on its own cluster, where they are
    ahead of the group's; the caller has seen every row of the batch visible. Returns what was
    committed (empty when the group already held them or later ones).

    Raises:
        PermissionDeniedError: Write on the id, or Read on the group or an input topic, is
            missing on the group's cluster.
        KafkaTxnSinkError: the cluster refused, or another driver's commit fenced this one; the
            group keeps what it held (the next batch, or the replay, commits again).
    """
    progress = batch_progress(options, batch_id)
    assert progress is not None and options.progress is not None
    where = options.progress
    txn = ProgressTransaction(_producer_config(options, where), options.client_timeout_s)
    try:
        txn.init()
        cluster = group_cluster(where, options.commit_timeout_ms)
        held = cluster.settled_offsets(progress.group, progress.offsets)
        ahead = _ahead(progress.offsets, held)
        if ahead:
            metadata = group_metadata(
                where.bootstrap, where.kafka, options.commit_timeout_ms, progress.group
            )
            txn.send_offsets(GroupProgress(progress.group, ahead), metadata)
    except BaseException:
        txn.abort()
        raise
    if not ahead:
        txn.abort()
        return {}
    txn.commit()  # no abort after this: its outcome may be unknown; the next init fences it
    log.info(
        "batch %d: committed %s to group %s on %s", batch_id, ahead, progress.group, where.bootstrap
    )
    return ahead


def _ahead(batch_end: GroupOffsets, held: GroupOffsets) -> GroupOffsets:
    """The batch's end offsets of the partitions where they are ahead of the group's."""
    ahead: GroupOffsets = {}
    for topic, parts in batch_end.items():
        for partition, offset in parts.items():
            if offset > held.get(topic, {}).get(partition, -1):
                ahead.setdefault(topic, {})[partition] = offset
    return ahead


def _producer_config(options: SinkOptions, where: GroupOptions) -> dict[str, object]:
    txn_id = group_id(options.sink_id)
    return producer_config(where.bootstrap, where.kafka, txn_id, GROUP_TXN_TIMEOUT_MS)
