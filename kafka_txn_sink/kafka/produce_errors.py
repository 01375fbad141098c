"""What a refused produce() or transactional call of a task's producer means to the user: a
missing permission (named), a record or topic at fault (`InputError`), the brokers out of
reach, or another failure of the producer."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from confluent_kafka import KafkaError, KafkaException

from kafka_txn_sink.errors import InputError, KafkaTxnSinkError, KafkaUnavailableError
from kafka_txn_sink.kafka.permissions import refused, topic_permission


def kafka_failure(what: str, exc: KafkaException, config: Mapping[str, Any]) -> KafkaTxnSinkError:
    """A transactional call's failure (`what`): a missing permission, the brokers out of reach,
    or the error itself."""
    error: KafkaError = exc.args[0]
    denial = refused(error.code(), error.str(), config, what, txn_id=config["transactional.id"])
    if denial is not None:
        return denial
    if error.code() in (KafkaError._TRANSPORT, KafkaError._TIMED_OUT, KafkaError._ALL_BROKERS_DOWN):
        return KafkaUnavailableError(f"{what} failed: {error.str()}")
    return KafkaTxnSinkError(f"{what} failed: {error.str()}")


def produce_failure(
    topic: str,
    value: bytes | None,
    key: bytes | None,
    exc: KafkaException,
    config: Mapping[str, Any],
) -> KafkaTxnSinkError:
    """A produce() call's refusal of one record: a missing permission, the record too large, a
    topic or partition that does not exist (`InputError`), or the error itself."""
    error: KafkaError = exc.args[0]
    step = f"producing to {topic} in {config['transactional.id']}"
    denial = refused(
        error.code(),
        error.str(),
        config,
        step,
        topic_permission("Write", topic),
        config["transactional.id"],
    )
    if denial is not None:
        return denial
    if error.code() == KafkaError.MSG_SIZE_TOO_LARGE:
        size = len(value or b"") + len(key or b"")
        return InputError(
            f"a record of {size} bytes (columns key + value) for topic {topic} exceeds "
            f"message.max.bytes; raise kafka.message.max.bytes (and the topic's "
            f"max.message.bytes) or send smaller values",
            reason="too_large",
        )
    if error.code() in (KafkaError._UNKNOWN_TOPIC, KafkaError.UNKNOWN_TOPIC_OR_PART):
        return InputError(
            f"topic {topic!r} (from option topic or column topic) does not exist", reason="topic"
        )
    if error.code() == KafkaError._UNKNOWN_PARTITION:
        return InputError(
            f"column partition names a partition that topic {topic!r} lacks", reason="partition"
        )
    return KafkaTxnSinkError(f"producing to {topic} failed: {error.str()}")
