"""Secrets given to the sink never reach a log record, kafka-python's DEBUG output included
(which, unmasked, prints the SASL password: the first case shows it does)."""

from __future__ import annotations

import subprocess
import sys

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
