"""The EndTxn client against Apache Kafka's own txn_admin: what it commits, what it refuses.

Each transaction here is opened by a separate process that exits without closing its producer,
as a Spark task does; the test process then completes it as the driver does.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
from confluent_kafka import Producer

from kafka_txn_sink.errors import KafkaTxnSinkError, KafkaUnavailableError
from kafka_txn_sink.kafka import txn_admin as txn_admin_module
from kafka_txn_sink.kafka.admin_api import Fate
from kafka_txn_sink.kafka.cluster import Cluster
from kafka_txn_sink.kafka.producer import TaskTransaction
from kafka_txn_sink.kafka.producer_settings import producer_config
from kafka_txn_sink.kafka.txn_admin import NOT_FOUND, ONGOING, TxnAdmin
from kafka_txn_sink.protocol.messages import Triple
from kafka_txn_sink.testing import KafkaBroker
from kafka_txn_sink.testing.topics import read_topic
from tests.e2e.harness import commit_prepared, create_topics

pytestmark = pytest.mark.kafka

HERE = Path(__file__).parent


@dataclass(frozen=True)
class Opened:
    triple: Triple
    topic: str
    partition: int
    first_offset: int


@pytest.fixture
def topic(kafka_bootstrap: str) -> str:
    name = f"coord_{uuid.uuid4().hex[:10]}"
    create_topics(kafka_bootstrap, 3, name)
    return name


def open_elsewhere(bootstrap: str, topic: str, rows: int = 10, timeout_ms: int = 60_000) -> Opened:
    txn_id = f"coordtest_{uuid.uuid4().hex[:8]}-0"
    done = subprocess.run(
        [
            sys.executable,
            str(HERE / "prepare_and_exit.py"),
            bootstrap,
            txn_id,
            topic,
            str(rows),
            str(timeout_ms),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    body = json.loads(done.stdout.strip().splitlines()[-1])
    partition, (first, _) = sorted(body["offsets"][topic].items())[0]
    triple = Triple(body["transactional_id"], body["producer_id"], body["producer_epoch"])
    return Opened(triple, topic, int(partition), first)


def visible_rows(bootstrap: str, topic: str, prefix: str) -> int:
    return sum(
        1 for r in read_topic(bootstrap, topic) if (r.value or b"").decode().startswith(prefix)
    )


def test_transaction_of_an_exited_process_stays_open(kafka_bootstrap: str, topic: str) -> None:
    opened = open_elsewhere(kafka_bootstrap, topic)

    with TxnAdmin(kafka_bootstrap, {}) as txn_admin:
        state = txn_admin.describe([opened.triple.transactional_id])[
            opened.triple.transactional_id
        ]

    assert state.state == ONGOING
    assert state.triple == opened.triple
    assert len(read_topic(kafka_bootstrap, topic, "read_uncommitted")) == 10
    assert visible_rows(kafka_bootstrap, topic, opened.triple.transactional_id) == 0


def test_commit_from_another_process_makes_rows_visible_once(
    kafka_bootstrap: str, topic: str
) -> None:
    opened = open_elsewhere(kafka_bootstrap, topic)

    with TxnAdmin(kafka_bootstrap, {}) as txn_admin:
        first = txn_admin.end_transactions([opened.triple], commit=True, deadline_s=30)
        again = txn_admin.end_transactions([opened.triple], commit=True, deadline_s=30)

    assert [r.error for r in first] == [None]
    assert [r.error for r in again] == [None], "a repeated commit must answer success"
    assert visible_rows(kafka_bootstrap, topic, opened.triple.transactional_id) == 10


def test_abort_from_another_process_hides_rows(kafka_bootstrap: str, topic: str) -> None:
    opened = open_elsewhere(kafka_bootstrap, topic)

    with TxnAdmin(kafka_bootstrap, {}) as txn_admin:
        result = txn_admin.end_transactions([opened.triple], commit=False, deadline_s=30)
        commit_after_abort = txn_admin.end_transactions(
            [opened.triple], commit=True, deadline_s=30
        )

    assert [r.error for r in result] == [None]
    assert commit_after_abort[0].error == "InvalidTxnStateError"
    assert visible_rows(kafka_bootstrap, topic, opened.triple.transactional_id) == 0


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        ({"producer_epoch": 1}, {"InvalidProducerEpochError", "ProducerFencedError"}),
        ({"producer_id": 999_999}, {"InvalidProducerIdMappingError"}),
        ({"transactional_id": "coordtest_never_used-0"}, {"InvalidProducerIdMappingError"}),
    ],
)
def test_end_txn_with_a_wrong_triple_is_refused(
    kafka_bootstrap: str, topic: str, change: dict[str, object], expected: set[str]
) -> None:
    opened = open_elsewhere(kafka_bootstrap, topic)
    wrong = Triple(**{**opened.triple.__dict__, **change})  # type: ignore[arg-type]

    with TxnAdmin(kafka_bootstrap, {}) as txn_admin:
        (result,) = txn_admin.end_transactions([wrong], commit=True, deadline_s=30)
        state = txn_admin.describe([opened.triple.transactional_id])

    assert result.error in expected
    assert state[opened.triple.transactional_id].state == ONGOING
    assert visible_rows(kafka_bootstrap, topic, opened.triple.transactional_id) == 0
    with TxnAdmin(kafka_bootstrap, {}) as txn_admin:
        txn_admin.end_transactions([opened.triple], commit=False, deadline_s=30)


def test_many_commits_in_parallel(kafka_bootstrap: str, topic: str) -> None:
    opened = [open_elsewhere(kafka_bootstrap, topic, rows=3) for _ in range(6)]

    with TxnAdmin(kafka_bootstrap, {}) as txn_admin:
        results = txn_admin.end_transactions(
            [o.triple for o in opened], commit=True, deadline_s=30
        )

    assert [r.error for r in results] == [None] * 6
    assert len(read_topic(kafka_bootstrap, topic)) == 18


def prepared_here(bootstrap: str, topic: str, rows: int) -> Triple:
    """A transaction prepared as a task prepares it, its producer dropped without closing; its
    timeout outlasts the test (the oldest clients take up to 2 s to prepare each)."""
    txn_id = f"coordtest_{uuid.uuid4().hex[:8]}-0"
    txn = TaskTransaction(producer_config(bootstrap, {}, txn_id, 600_000), 30)
    txn.init()
    for row in range(rows):
        txn.send(topic, f"{txn_id} {row}".encode())
    prepared = txn.prepare()
    txn.detach()
    assert prepared is not None
    return prepared.triple


@pytest.mark.parametrize("per_client", [txn_admin_module.END_TXN_PER_CLIENT, 4])
def test_one_call_commits_every_good_triple_and_names_each_wrong_one(
    kafka_bootstrap: str, topic: str, per_client: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    # With 4 a client, the 14 EndTxns go over four clients in threads, each its own connection.
    monkeypatch.setattr(txn_admin_module, "END_TXN_PER_CLIENT", per_client)
    good = [prepared_here(kafka_bootstrap, topic, rows=3) for _ in range(12)]
    left_open = [prepared_here(kafka_bootstrap, topic, rows=3) for _ in range(2)]
    wrong = [
        Triple(left_open[0].transactional_id, left_open[0].producer_id, 9),
        Triple(left_open[1].transactional_id, 999_999, left_open[1].producer_epoch),
    ]
    asked = good[:6] + wrong + good[6:]

    with TxnAdmin(kafka_bootstrap, {}) as txn_admin:
        results = txn_admin.end_transactions(asked, commit=True, deadline_s=30)
        helpers = len(txn_admin._helpers)  # made only when a round is split over clients
        states = txn_admin.describe([t.transactional_id for t in left_open])
        txn_admin.end_transactions(left_open, commit=False, deadline_s=30)

    assert [r.triple for r in results] == asked
    assert [r.error for r in results if r.triple in good] == [None] * 12
    assert results[6].error in {"InvalidProducerEpochError", "ProducerFencedError"}
    assert results[7].error == "InvalidProducerIdMappingError"
    assert {s.state for s in states.values()} == {ONGOING}
    seen = [r.value for r in read_topic(kafka_bootstrap, topic)]
    assert len(seen) == len(set(seen)) == 36
    assert helpers == -(-len(asked) // per_client) - 1


def test_a_helper_that_cannot_connect_leaves_the_round_to_the_clients_there_are(
    kafka_bootstrap: str, topic: str, monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    monkeypatch.setattr(txn_admin_module, "END_TXN_PER_CLIENT", 2)
    triples = [prepared_here(kafka_bootstrap, topic, rows=1) for _ in range(6)]

    def unreachable(*_: object) -> TxnAdmin:
        raise KafkaUnavailableError("cannot reach Kafka at kafka.bootstrap.servers=(test)")

    with TxnAdmin(kafka_bootstrap, {}) as txn_admin:
        monkeypatch.setattr(txn_admin_module, "TxnAdmin", unreachable)
        with caplog.at_level(logging.WARNING, logger=txn_admin_module.__name__):
            results = txn_admin.end_transactions(triples, commit=True, deadline_s=30)

    assert [r.triple for r in results] == triples
    assert [r.error for r in results] == [None] * 6
    assert "EndTxn goes over 1 client(s): cannot reach Kafka" in caplog.text
    seen = [r.value for r in read_topic(kafka_bootstrap, topic)]
    assert len(seen) == len(set(seen)) == 6


def test_a_round_ends_at_its_deadline_when_the_coordinator_lookup_hangs(
    make_kafka_broker: Callable[..., KafkaBroker],
) -> None:
    """N7: the FindCoordinator of an EndTxn round is bounded by the round's deadline, not by the
    client's request timeout (20 s here), so the commit margin bounds the round; the transaction
    it could not reach is still there to commit once the broker answers."""
    broker = make_kafka_broker()
    topic = f"coord_{uuid.uuid4().hex[:10]}"
    create_topics(broker.bootstrap, 1, topic)
    triple = prepared_here(broker.bootstrap, topic, rows=3)
    assert broker.pid is not None
    with TxnAdmin(broker.bootstrap, {}, timeout_ms=20_000) as txn_admin:
        os.kill(broker.pid, signal.SIGSTOP)
        try:
            started = time.monotonic()
            [result] = txn_admin.end_transactions([triple], commit=True, deadline_s=1.5)
            took = time.monotonic() - started
        finally:
            os.kill(broker.pid, signal.SIGCONT)
        [after] = txn_admin.end_transactions([triple], commit=True, deadline_s=30)

    assert result.error is not None and "deadline exceeded" in result.error
    assert took < 5, f"the round took {took:.1f} s past a deadline of 1.5 s"
    assert after.error is None
    assert sorted(r.value for r in read_topic(broker.bootstrap, topic)) == [
        f"{triple.transactional_id} {row}".encode() for row in range(3)
    ]


def test_fenced_by_a_new_producer_then_commit_fails(kafka_bootstrap: str, topic: str) -> None:
    opened = open_elsewhere(kafka_bootstrap, topic)
    fencer = Producer(
        {"bootstrap.servers": kafka_bootstrap, "transactional.id": opened.triple.transactional_id}
    )
    fencer.init_transactions(30)

    with TxnAdmin(kafka_bootstrap, {}) as txn_admin:
        (result,) = txn_admin.end_transactions([opened.triple], commit=True, deadline_s=30)

    assert result.error in {"InvalidProducerEpochError", "ProducerFencedError"}
    assert visible_rows(kafka_bootstrap, topic, opened.triple.transactional_id) == 0


def test_probe_tells_committed_aborted_and_open_apart(kafka_bootstrap: str, topic: str) -> None:
    committed, aborted, still_open = (open_elsewhere(kafka_bootstrap, topic) for _ in range(3))
    with TxnAdmin(kafka_bootstrap, {}) as txn_admin:
        txn_admin.end_transactions([committed.triple], commit=True, deadline_s=30)
        txn_admin.end_transactions([aborted.triple], commit=False, deadline_s=30)
    cluster = Cluster(kafka_bootstrap, {}, timeout_ms=3000)

    def probe(o: Opened) -> Fate:
        return cluster.fate({o.topic: {o.partition: (o.first_offset, o.first_offset)}}).fate

    assert probe(committed) is Fate.COMMITTED
    assert probe(aborted) is Fate.ABORTED
    assert probe(still_open) is Fate.OPEN
    with TxnAdmin(kafka_bootstrap, {}) as txn_admin:
        txn_admin.end_transactions([still_open.triple], commit=False, deadline_s=30)


def test_list_and_describe_unknown_ids(kafka_bootstrap: str, topic: str) -> None:
    opened = open_elsewhere(kafka_bootstrap, topic)

    with TxnAdmin(kafka_bootstrap, {}) as txn_admin:
        ongoing = txn_admin.list_ids([ONGOING])
        unknown = txn_admin.describe(["coordtest_nobody-7"])
        txn_admin.end_transactions([opened.triple], commit=False, deadline_s=30)

    assert opened.triple.transactional_id in ongoing
    assert unknown["coordtest_nobody-7"].state == NOT_FOUND


def test_unreachable_broker_is_a_clear_error() -> None:
    with pytest.raises(KafkaUnavailableError, match=r"kafka.bootstrap.servers=127.0.0.1:1"):
        TxnAdmin("127.0.0.1:1", {}, timeout_ms=2000)


def test_later_attempt_fences_the_earlier_one(kafka_bootstrap: str, topic: str) -> None:
    """Two attempts of one Spark partition racing: only the later one can prepare."""
    txn_id = f"coordtest_{uuid.uuid4().hex[:8]}-0"

    def attempt() -> TaskTransaction:
        return TaskTransaction(producer_config(kafka_bootstrap, {}, txn_id, 60_000), 30)

    early, late = attempt(), attempt()
    early.init()
    early.send(topic, value=b"early")
    late.init()  # fences `early` and aborts what it sent
    late.send(topic, value=b"late")
    with pytest.raises(KafkaTxnSinkError):
        for _ in range(50):  # the fence shows on the next round trip of `early`
            early.send(topic, value=b"early")
        early.prepare()
    prepared = late.prepare()
    assert prepared is not None
    commit_prepared(kafka_bootstrap, prepared)

    values = [r.value for r in read_topic(kafka_bootstrap, topic)]
    assert values == [b"late"]
