"""Options are validated once, on the driver; every error names the option."""

from __future__ import annotations

import pytest

from kafka_txn_sink.errors import ConfigError
from kafka_txn_sink.files_options import parse_files_options
from kafka_txn_sink.options import parse_options

BASE = {"kafka.bootstrap.servers": "127.0.0.1:9092", "sinkId": "orders", "commitLog": "/tmp/log"}


def parse(**extra: str) -> object:
    return parse_options({**BASE, **extra})


def test_minimal_options_parse() -> None:
    options = parse_options({**BASE, "topic": "out", "kafka.linger.ms": "5"})

    assert options.sink_id == "orders"
    assert options.topic == "out"
    assert options.kafka == {"linger.ms": "5"}
    assert options.transaction_timeout_ms is None  # resolved against the broker later
    # Skew, 9 commit-log requests (owner check, 6 PUTs and a GET, completion check) and their
    # backoff, 2 EndTxn rounds: every step from the prepare check to the last EndTxn (margin.py).
    assert options.margin_ms == 5_000 + 9 * 30_000 + 2_325 + 2 * 30_000


def test_option_names_are_case_insensitive() -> None:
    options = parse_options(
        {
            "kafka.bootstrap.servers": "h:1",
            "SINKID": "a",
            "commitlog": "/x",
            "TransactionTimeoutMs": "5000",
        }
    )

    assert (options.sink_id, options.transaction_timeout_ms) == ("a", 5000)


@pytest.mark.parametrize(
    ("missing", "named"),
    [
        ("sinkId", "sinkId"),
        ("commitLog", "commitLog"),
        ("kafka.bootstrap.servers", "kafka.bootstrap.servers"),
    ],
)
def test_missing_required_option_is_named(missing: str, named: str) -> None:
    options = {k: v for k, v in BASE.items() if k != missing}

    with pytest.raises(ConfigError, match=named):
        parse_options(options)


@pytest.mark.parametrize("sink_id", ["bad-id", "has space", "", "x" * 201, "a/b"])
def test_invalid_sink_id_is_rejected(sink_id: str) -> None:
    with pytest.raises(ConfigError, match="sinkId"):
        parse(sinkId=sink_id)


@pytest.mark.parametrize(
    "owned",
    [
        "kafka.transactional.id",
        "kafka.enable.idempotence",
        "kafka.acks",
        "kafka.ACKS",
        "kafka.statistics.interval.ms",
    ],
)
def test_settings_the_sink_owns_are_rejected(owned: str) -> None:
    with pytest.raises(ConfigError, match=owned.split(".", 1)[1]):
        parse(**{owned: "x"})


def test_async_progress_tracking_is_rejected() -> None:
    with pytest.raises(ConfigError, match="asyncProgressTrackingEnabled"):
        parse(asyncProgressTrackingEnabled="true")
    assert parse(asyncProgressTrackingEnabled="false")


def test_unknown_option_is_named_with_a_hint() -> None:
    with pytest.raises(ConfigError, match=r"sinkid2.*kafka\."):
        parse(sinkid2="x")


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("transactionTimeoutMs", "abc"),
        ("transactionTimeoutMs", "10"),
        ("commitTimeoutMs", "-1"),
        ("clockSkewMs", "99999999"),
    ],
)
def test_bad_numbers_are_named(key: str, value: str) -> None:
    with pytest.raises(ConfigError, match=key):
        parse(**{key: value})


def test_kafka_transaction_timeout_is_accepted_as_the_timeout() -> None:
    options = parse_options({**BASE, "kafka.transaction.timeout.ms": "60000"})

    assert options.transaction_timeout_ms == 60000
    assert "transaction.timeout.ms" not in options.kafka


def test_secrets_never_reach_repr_or_errors() -> None:
    options = parse_options(
        {
            **BASE,
            "kafka.sasl.password": "hunter2",
            "s3.secretAccessKey": "s3cr3t",
            "s3.accessKeyId": "AKIA",
        }
    )

    text = repr(options) + str(options.s3)
    assert "hunter2" not in text and "s3cr3t" not in text
    with pytest.raises(ConfigError) as raised:
        parse_options({**BASE, "kafka.sasl.password": "hunter2", "kafka.acks": "1"})
    assert "hunter2" not in str(raised.value)


def test_s3_deadlines_fit_in_the_commit_log_timeout() -> None:
    options = parse(commitLogTimeoutMs="12000", **{"s3.endpoint": "http://127.0.0.1:9000"})

    worst_s = options.s3.max_attempts * (options.s3.connect_timeout_s + options.s3.read_timeout_s)
    assert worst_s <= options.commit_log_timeout_ms / 1000
    assert options.s3.use_path_style


def test_the_avro_codec_is_spelled_as_file_headers_spell_it() -> None:
    files = parse_files_options(
        {"path": "/tmp/f", "referencestopic": "refs", "avrocodec": " Snappy"}
    )
    assert files is not None and files.codec == "snappy"


def test_the_readme_shows_the_option_table_as_options_py_defines_it() -> None:
    from pathlib import Path

    from kafka_txn_sink.options import options_tables

    readme = (Path(__file__).parents[2] / "README.md").read_text()
    start = readme.index("<!-- options table: generated from kafka_txn_sink/options.py -->")
    end = readme.index("<!-- end options table -->")
    shown = readme[start:end].split("\n", 1)[1].strip()

    assert shown == options_tables().strip(), (
        "README's options differ from kafka_txn_sink/options.py: paste the output of "
        "`python -m kafka_txn_sink.options` between the markers"
    )


def test_provenance_headers_are_for_records_mode() -> None:
    assert parse_options({**BASE, "topic": "out", "provenanceheaders": "true"}).provenance_headers
    assert not parse_options({**BASE, "topic": "out"}).provenance_headers
    files_only = {**BASE, "path": "/tmp/files", "referencestopic": "refs"}
    with pytest.raises(ConfigError, match="option provenanceHeaders is for records mode"):
        parse_options({**files_only, "provenanceheaders": "true"})
