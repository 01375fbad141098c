"""Which delivery error a failed transaction reports: the cause, not the purges it set off."""

from __future__ import annotations

from dataclasses import dataclass

from confluent_kafka import KafkaError

from kafka_txn_sink.kafka.producer import _Deliveries


@dataclass
class Report:
    """What on_delivery reads of a confluent_kafka Message."""

    topic_name: str

    def topic(self) -> str:
        return self.topic_name


TOO_LARGE = KafkaError(KafkaError.MSG_SIZE_TOO_LARGE)
PURGED = KafkaError(KafkaError._PURGE_QUEUE)


def test_a_purge_reported_first_gives_way_to_the_failure_that_caused_it() -> None:
    deliveries = _Deliveries()

    deliveries.on_delivery(PURGED, Report("small"))  # type: ignore[arg-type]
    deliveries.on_delivery(TOO_LARGE, Report("big"))  # type: ignore[arg-type]
    deliveries.on_delivery(PURGED, Report("small"))  # type: ignore[arg-type]

    assert deliveries.error is not None
    assert deliveries.error.code() == KafkaError.MSG_SIZE_TOO_LARGE
    assert deliveries.error_topic == "big"
    assert not deliveries.purged_only


def test_the_first_real_failure_is_kept() -> None:
    deliveries = _Deliveries()

    deliveries.on_delivery(TOO_LARGE, Report("first"))  # type: ignore[arg-type]
    deliveries.on_delivery(KafkaError(KafkaError._MSG_TIMED_OUT), Report("later"))  # type: ignore[arg-type]

    assert deliveries.error_topic == "first"


def test_only_purges_are_still_a_failure() -> None:
    deliveries = _Deliveries()

    deliveries.on_delivery(PURGED, Report("small"))  # type: ignore[arg-type]

    assert deliveries.purged_only and deliveries.error_topic == "small"
