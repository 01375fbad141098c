"""The producer settings every task uses, the driver's other clients' settings, and librdkafka's
verdict on the user's kafka.* ones."""

from __future__ import annotations

import pytest

from kafka_txn_sink.errors import ConfigError
from kafka_txn_sink.kafka.cluster import client_config
from kafka_txn_sink.kafka.producer_settings import producer_config
from kafka_txn_sink.options import parse_options
from kafka_txn_sink.protocol.start import check_producer_settings

BASE = {"kafka.bootstrap.servers": "127.0.0.1:1", "sinkId": "s", "commitLog": "/tmp/log"}


def test_protocol_settings_are_explicit_and_win_over_the_users() -> None:
    config = producer_config(
        "b:1", {"linger.ms": "5", "message.timeout.ms": "999999"}, "s-3", 60_000
    )

    assert config["transactional.id"] == "s-3"
    assert config["enable.idempotence"] is True
    assert config["acks"] == "all"
    assert config["transaction.timeout.ms"] == 60_000
    assert config["partitioner"] == "murmur2_random"
    assert config["linger.ms"] == "5"
    assert int(config["message.timeout.ms"]) <= 60_000


def test_every_client_connects_to_all_brokers_at_once_unless_the_user_says_otherwise() -> None:
    # Sparse connections cost a new client 50 ms on its first request (cluster.client_config).
    assert producer_config("b:1", {}, "s-0", 60_000)["enable.sparse.connections"] is False
    assert client_config("b:1", {}, 15_000)["enable.sparse.connections"] is False
    mine = {"enable.sparse.connections": "true", "linger.ms": "5"}
    assert client_config("b:1", mine, 15_000)["enable.sparse.connections"] == "true"
    assert "linger.ms" not in client_config("b:1", mine, 15_000)  # a producer's only


@pytest.mark.parametrize("setting", ["kafka.lingerr.ms", "kafka.linger.ms"])
def test_a_setting_librdkafka_refuses_is_a_config_error(setting: str) -> None:
    value = "5" if setting.endswith("lingerr.ms") else "not-a-number"
    options = parse_options({**BASE, setting: value, "kafka.sasl.password": "hunter2"})

    with pytest.raises(ConfigError, match="kafka") as raised:
        check_producer_settings(options.with_transaction_timeout(60_000))
    assert "hunter2" not in str(raised.value)


def test_a_short_transaction_timeout_still_makes_a_valid_producer() -> None:
    from confluent_kafka import Producer

    config = producer_config("127.0.0.1:1", {"socket.timeout.ms": "60000"}, "s-0", 5_000)

    assert config["socket.timeout.ms"] <= 5_000
    Producer(config)  # librdkafka refuses socket.timeout.ms > transaction.timeout.ms + 100
