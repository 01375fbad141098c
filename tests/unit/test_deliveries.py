"""Which delivery error a failed transaction reports: the cause, not the purges it set off; and
what the per-partition reports of `send_many` keep: first and last offset, every failure."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass

from confluent_kafka import KafkaError, Producer

from kafka_txn_sink.kafka.deliveries import (
    Deliveries,
    PartitionReports,
    acknowledged_of,
    eos_of,
)


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
    deliveries = Deliveries()

    deliveries.on_delivery(PURGED, Report("small"))  # type: ignore[arg-type]
    deliveries.on_delivery(TOO_LARGE, Report("big"))  # type: ignore[arg-type]
    deliveries.on_delivery(PURGED, Report("small"))  # type: ignore[arg-type]

    assert deliveries.error is not None
    assert deliveries.error.code() == KafkaError.MSG_SIZE_TOO_LARGE
    assert deliveries.error_topic == "big"
    assert not deliveries.purged_only


def test_the_first_real_failure_is_kept() -> None:
    deliveries = Deliveries()

    deliveries.on_delivery(TOO_LARGE, Report("first"))  # type: ignore[arg-type]
    deliveries.on_delivery(KafkaError(KafkaError._MSG_TIMED_OUT), Report("later"))  # type: ignore[arg-type]

    assert deliveries.error_topic == "first"


def test_only_purges_are_still_a_failure() -> None:
    deliveries = Deliveries()

    deliveries.on_delivery(PURGED, Report("small"))  # type: ignore[arg-type]

    assert deliveries.purged_only and deliveries.error_topic == "small"


def deliver(reports: PartitionReports, outcomes: list[tuple[KafkaError | None, int]]) -> None:
    """Send one record per outcome and report each as librdkafka would, in order."""
    callbacks = []
    for _ in outcomes:
        callbacks.append(reports.callback())
        reports.sent += 1
    for callback, (error, offset) in zip(callbacks, outcomes, strict=True):
        callback(error, Report("t", offset))  # type: ignore[arg-type]


def test_partition_reports_keep_the_first_and_the_last_offset() -> None:
    reports = PartitionReports()

    deliver(reports, [(None, 40), (None, 41), (None, 47), (None, 52)])

    assert reports.offsets() == [40, 52]
    assert reports.take_errors() == []


def test_a_single_record_is_its_partitions_first_and_last() -> None:
    reports = PartitionReports()

    deliver(reports, [(None, 7)])

    assert reports.offsets() == [7]


def test_a_failure_in_the_middle_is_taken_once_and_names_its_topic() -> None:
    reports = PartitionReports()
    deliver(reports, [(None, 1), (TOO_LARGE, -1), (None, 3)])

    failed = reports.take_errors()

    assert [(error.code(), msg.topic()) for error, msg in failed] == [
        (KafkaError.MSG_SIZE_TOO_LARGE, "t")
    ]
    assert reports.take_errors() == []
    deliveries = Deliveries()
    for error, msg in failed:
        deliveries.on_delivery(error, msg)
    assert deliveries.error is not None and deliveries.error_topic == "t"


def stats_sample(topics: dict[str, int], eos: dict[str, object] | None) -> str:
    """A statistics sample shaped as librdkafka writes it: topics and partitions, eos last."""
    sample: dict[str, object] = {
        "name": "rdkafka#producer-1",
        "client_id": 'a "eos": {"txn_state": "Ready"} in a client id',
        "topics": {
            name: {"topic": name, "partitions": {str(p): {"msgq_cnt": 0} for p in range(count)}}
            for name, count in topics.items()
        },
    }
    if eos is not None:
        sample["eos"] = eos
    return json.dumps(sample)


EOS = {"txn_state": "InTransaction", "producer_id": 8, "producer_epoch": 3, "epoch_cnt": 1}


def test_the_producer_id_is_read_from_the_eos_object_and_no_topic_named_eos() -> None:
    raw = stats_sample({"eos": 3, "orders": 1024}, EOS)

    assert eos_of(raw) == EOS


def test_a_sample_in_another_order_is_read_whole() -> None:
    raw = json.dumps({"eos": EOS, "topics": {"eos": {"partitions": {}}}})

    assert eos_of(raw) == EOS


def test_a_sample_without_eos_gives_nothing() -> None:
    assert eos_of(stats_sample({"eos": 2}, None)) == {}


def test_a_real_samples_eos_object_is_found_from_the_end() -> None:
    """librdkafka's own sample of a transactional producer that has not connected yet (no
    reachable broker): its eos object, found from the end, names the state before any id."""
    samples: list[str] = []
    producer = Producer(
        {
            "bootstrap.servers": "127.0.0.1:9",
            "transactional.id": "sample-shape",
            "statistics.interval.ms": 100,
            "stats_cb": samples.append,
            "log_level": 0,
        }
    )
    deadline = time.monotonic() + 10
    while not samples and time.monotonic() < deadline:
        producer.poll(0.1)
    raw = samples[0]
    assert raw.rindex('"eos"') > raw.index('"topics"')
    eos = eos_of(raw)
    assert eos == json.loads(raw)["eos"]
    assert eos["txn_state"] != "InTransaction" and eos["epoch_cnt"] == 0


def test_acknowledged_counts_per_partition_leave_out_the_unassigned_queue() -> None:
    raw = json.dumps(
        {
            "topics": {
                "orders": {
                    "partitions": {
                        "0": {"next_ack_seq": 300, "msgq_cnt": 0},
                        "1": {"next_ack_seq": 120},
                        "-1": {"next_ack_seq": 0, "msgs": 420},
                    }
                }
            },
            "eos": EOS,
        }
    )

    assert acknowledged_of(raw) == {("orders", 0): 300, ("orders", 1): 120}
    assert acknowledged_of("") == {}
