"""The progress transaction of option consumerGroup (progress.py): a transaction that holds a
batch's input offsets for the group and no records, opened by the task's producer. Loaded only
with that option, since it brings the task's send path (confluent-kafka, pyarrow).
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

from kafka_txn_sink.errors import KafkaTxnSinkError
from kafka_txn_sink.group_options import CONSUMER_GROUP
from kafka_txn_sink.kafka.cluster import client_config
from kafka_txn_sink.kafka.permissions import (
    Permission,
    group_permission,
    refused,
    topic_permission,
)
from kafka_txn_sink.kafka.producer import TaskTransaction
from kafka_txn_sink.kafka.security import librdkafka_config
from kafka_txn_sink.options import SinkOptions
from kafka_txn_sink.protocol.messages import (
    PROGRESS_PARTITION,
    GroupProgress,
    Participant,
    Triple,
)
from kafka_txn_sink.protocol.runs import RunRef
from kafka_txn_sink.protocol.txn_ids import progress_id


def open_progress(options: SinkOptions, run: RunRef, progress: GroupProgress) -> Participant:
    """Open `run`'s progress transaction with `progress` committed in it, and leave it open:
    the participant that ends it.

    Raises:
        PermissionDeniedError: Write on the sink's ids, or Read on the group, is missing.
        KafkaTxnSinkError: the brokers refused otherwise; the transaction is aborted.
    """
    txn_id = progress_id(options.sink_id, slot=run.slot)
    txn = ProgressTransaction(options.producer_config(txn_id), options.client_timeout_s)
    txn.init()
    try:
        metadata = group_metadata(
            options.bootstrap_servers, options.kafka, options.commit_timeout_ms, progress.group
        )
        txn.send_offsets(progress, metadata)
        triple = txn.open_triple()
    except BaseException:
        txn.abort()
        raise
    return Participant(
        partition=PROGRESS_PARTITION,
        attempt=0,
        triple=triple,
        rows=0,
        offsets={},
        progress=progress,
    )


# What the group coordinator answers an outside client's TxnOffsetCommit once the group has
# members.
_MEMBERS_ERRORS = (
    KafkaError.UNKNOWN_MEMBER_ID,
    KafkaError.ILLEGAL_GENERATION,
    KafkaError.REBALANCE_IN_PROGRESS,
    KafkaError.FENCED_INSTANCE_ID,
)


class ProgressTransaction(TaskTransaction):
    """A transaction that writes no records, only a consumer group's offsets."""

    def send_offsets(self, progress: GroupProgress, group_metadata: Any) -> None:
        """AddOffsetsToTxn and TxnOffsetCommit of `progress` (waits for both answers).

        Raises:
            PermissionDeniedError: Read on the group is missing.
            KafkaTxnSinkError: the coordinator refused otherwise.
        """
        positions = [
            TopicPartition(topic, partition, offset)
            for topic, parts in sorted(progress.offsets.items())
            for partition, offset in sorted(parts.items())
        ]
        try:
            self._client.send_offsets_to_transaction(positions, group_metadata, self._timeout_s)
        except KafkaException as exc:
            error = exc.args[0]
            step = f"committing the offsets of group {progress.group} in {self.transactional_id}"
            hint = (
                f": a consumer joined group {progress.group} (option {CONSUMER_GROUP} needs a "
                f"group no consumer joins)"
                if error.code() in _MEMBERS_ERRORS
                else ""
            )
            raise refused(
                error.code(),
                error.str(),
                self._config,
                step,
                _needed(error.code(), progress),
                self.transactional_id,
            ) or KafkaTxnSinkError(f"{step} failed: {error.str()}{hint}") from exc

    def commit(self) -> None:
        """EndTxn(commit), waiting for its answer.

        Raises:
            KafkaTxnSinkError: refused, fenced, or no answer (its outcome is then unknown).
        """
        try:
            self._client.commit_transaction(self._timeout_s)
        except KafkaException as exc:
            error = exc.args[0]
            raise KafkaTxnSinkError(
                f"EndTxn(commit) of {self.transactional_id} failed ({error.str()}); the group "
                f"keeps what it held unless the commit landed: the next batch commits again"
            ) from exc

    def open_triple(self) -> Triple:
        """The open transaction's triple; the client is dropped unclosed, so it stays open."""
        triple = self._read_triple()
        self.detach()
        return triple


def _needed(code: int, progress: GroupProgress) -> Permission:
    """What TxnOffsetCommit lacks: Read on an input topic (the first; each needs it), or Read on
    the group."""
    if code == KafkaError.TOPIC_AUTHORIZATION_FAILED:
        return topic_permission("Read", min(progress.offsets))
    return group_permission("Read", progress.group)


def group_metadata(bootstrap: str, kafka: Mapping[str, str], timeout_ms: int, group: str) -> Any:
    """The group's metadata as a client that never joins it sends it (generation -1, no member
    id): the start refuses a group with active members (start.py)."""
    config = client_config(bootstrap, kafka, timeout_ms)
    consumer = Consumer(
        {**librdkafka_config(config), "group.id": group, "enable.auto.commit": False}
    )
    try:
        return consumer.consumer_group_metadata()
    finally:
        with contextlib.suppress(KafkaException, RuntimeError):
            consumer.close()
