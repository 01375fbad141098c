"""Secrets given to the sink never reach a log record, kafka-python's DEBUG output included
(which, unmasked, prints the SASL password: the first case shows it does)."""

from __future__ import annotations

import io
import logging
import subprocess
import sys

import pytest
from pyspark.sql.types import StringType, StructField, StructType

from kafka_txn_sink.options import parse_options

SECRET = "pw-7f3a\\x00zz"  # also tests a form that repr escapes

DRIVER_AT_DEBUG = """
import logging, sys

logging.basicConfig(level=logging.DEBUG, stream=sys.stdout)
from kafka_txn_sink.errors import KafkaUnavailableError
from kafka_txn_sink.kafka.txn_admin import TxnAdmin
from kafka_txn_sink.options import parse_options

SECRET = {secret!r}
kafka = {{"security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "PLAIN",
         "sasl.username": "alice", "sasl.password": SECRET}}
if sys.argv[1] == "masked":
    parse_options({{"kafka.bootstrap.servers": "127.0.0.1:9", "topic": "t", "sinkId": "s",
                   "commitLog": "/tmp/l", **{{"kafka." + k: v for k, v in kafka.items()}}}})
logging.getLogger("anything.else").debug("sasl bytes %r", b"\\x00alice\\x00" + SECRET.encode())
try:
    TxnAdmin("127.0.0.1:9", kafka, timeout_ms=1500)
except KafkaUnavailableError:
    pass
"""


def run(mode: str) -> str:
    done = subprocess.run(
        [sys.executable, "-c", DRIVER_AT_DEBUG.format(secret=SECRET), mode],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return done.stdout + done.stderr


def test_unmasked_kafka_python_logs_the_password_at_debug() -> None:
    out = run("unmasked")

    assert "sasl_plain_password" in out
    assert "pw-7f3a" in out


def test_the_sink_masks_its_secrets_in_every_log_record() -> None:
    out = run("masked")

    assert "sasl_plain_password" in out  # kafka-python still logs its configuration...
    assert "pw-7f3a" not in out  # ...without the password, in any form
    assert "***" in out


JAAS_PASSWORD = "jaas-pw-5d1e"
S3_SECRET = "s3-secret-8b0c"


def stack_logged(log: logging.Logger) -> None:
    log.debug("where from", stack_info=True)  # jaas-pw-5d1e: a secret in a stack's source line


def test_tracebacks_chained_messages_and_stacks_are_masked() -> None:
    parse_options(
        {
            "kafka.bootstrap.servers": "127.0.0.1:9",
            "topic": "t",
            "sinkId": "s",
            "commitLog": "s3://bucket/log",
            "s3.secretAccessKey": S3_SECRET,
            "kafka.security.protocol": "SASL_SSL",
            "kafka.sasl.mechanism": "SCRAM-SHA-512",
            "kafka.sasl.jaas.config": "org.apache.kafka.common.security.scram.ScramLoginModule "
            f'required username="alice" password="{JAAS_PASSWORD}";',
        }
    )
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    log = logging.getLogger("kafka_txn_sink.tests.tracebacks")
    log.addHandler(handler)
    log.setLevel(logging.DEBUG)
    log.propagate = False
    try:
        try:
            raise ValueError(f"login refused for password {JAAS_PASSWORD!r}")
        except ValueError as refused:
            raise RuntimeError(f"S3 said no to {S3_SECRET}") from refused
    except RuntimeError:
        log.exception("cannot start")
        log.debug("at debug", exc_info=True)
    stack_logged(log)
    log.removeHandler(handler)

    text = out.getvalue()
    assert "cannot start" in text and "at debug" in text and "where from" in text
    assert "RuntimeError" in text and "ValueError" in text and "stack_logged" in text
    assert JAAS_PASSWORD not in text
    assert S3_SECRET not in text
    assert "***" in text


def test_the_plan_pickled_to_the_tasks_holds_no_registry_or_group_cluster_secret(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """N10: tasks never call the registry nor the group's cluster, so a task's plan (pickled
    to every executor) carries neither's settings; the driver's options keep them."""
    import pickle

    from kafka_txn_sink import planner
    from kafka_txn_sink.protocol.runs import RunRef
    from kafka_txn_sink.protocol.start import BatchStart

    options = parse_options(
        {
            "kafka.bootstrap.servers": "b:9092",
            "topic": "t",
            "sinkId": "s",
            "commitLog": "/tmp/log",
            "valueFormat": "avro",
            "schema.registry.url": "http://alice:Hunter2pw@127.0.0.1:9/",
            "schema.registry.basic.auth.user.info": "bob:Sekret99",
            "consumerGroup": "g",
            "checkpointLocation": "/tmp/cp",
            "consumerGroup.kafka.bootstrap.servers": "other:9092",
            "consumerGroup.kafka.security.protocol": "SASL_SSL",
            "consumerGroup.kafka.sasl.mechanism": "PLAIN",
            "consumerGroup.kafka.sasl.username": "gu",
            "consumerGroup.kafka.sasl.password": "GroupPw77",
        }
    )
    monkeypatch.setattr(planner, "resolve", lambda *_: None)
    schema = StructType([StructField("key", StringType()), StructField("value", StringType())])
    plan = planner._plan(options, schema, lambda o: BatchStart(o, None, None, RunRef(0, 0)))

    shipped = pickle.dumps(plan)
    for secret in (b"Hunter2pw", b"Sekret99", b"GroupPw77"):
        assert secret not in shipped
    assert options.serde.registry["url"].endswith("@127.0.0.1:9/")
    assert options.progress is not None and options.progress.kafka["sasl.password"] == "GroupPw77"
    assert plan.options.progress is not None and plan.options.progress.group == "g"
