"""Which delivery error a failed transaction reports: the cause, not the purges it set off; and
what the per-partition reports of `send_many` keep: first and last offset, every failure."""

from __future__ import annotations

from dataclasses import dataclass

from confluent_kafka import KafkaError

from kafka_txn_sink.kafka.producer import _Deliveries, _PartitionReports


@dataclass
class Report:
    """What on_delivery reads of a confluent_kafka Message."""

    topic_name: str
    offset_value: int = 0

    def topic(self) -> str:
        return self.topic_name

    def offset(self) -> int:
        return self.offset_value


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


def deliver(reports: _PartitionReports, outcomes: list[tuple[KafkaError | None, int]]) -> None:
    """Send one record per outcome and report each as librdkafka would, in order."""
    callbacks = []
    for _ in outcomes:
        callbacks.append(reports.callback())
        reports.sent += 1
    for callback, (error, offset) in zip(callbacks, outcomes, strict=True):
        callback(error, Report("t", offset))  # type: ignore[arg-type]


def test_partition_reports_keep_the_first_and_the_last_offset() -> None:
    reports = _PartitionReports()

    deliver(reports, [(None, 40), (None, 41), (None, 47), (None, 52)])

    assert reports.offsets() == [40, 52]
    assert reports.take_errors() == []


def test_a_single_record_is_its_partitions_first_and_last() -> None:
    reports = _PartitionReports()

    deliver(reports, [(None, 7)])

    assert reports.offsets() == [7]


def test_a_failure_in_the_middle_is_taken_once_and_names_its_topic() -> None:
    reports = _PartitionReports()
    deliver(reports, [(None, 1), (TOO_LARGE, -1), (None, 3)])

    failed = reports.take_errors()

    assert [(error.code(), msg.topic()) for error, msg in failed] == [
        (KafkaError.MSG_SIZE_TOO_LARGE, "t")
    ]
    assert reports.take_errors() == []
    deliveries = _Deliveries()
    for error, msg in failed:
        deliveries.on_delivery(error, msg)
    assert deliveries.error is not None and deliveries.error_topic == "t"
