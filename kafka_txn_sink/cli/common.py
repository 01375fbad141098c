"""What the commands share: exit codes, errors, common options and what they open.

The options every command group takes (`--log`, `--bootstrap`, `--kafka`, S3) are defined here
once, and read here once: into the commit log, the brokers' transaction client and the Kafka
client settings (whose secrets never reach an error message).
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

from kafka_txn_sink import extras
from kafka_txn_sink.commit_log import LOG_FORMATS, CommitLog, detect_format, open_commit_log
from kafka_txn_sink.errors import ConfigError
from kafka_txn_sink.kafka.security import client_settings
from kafka_txn_sink.kafka.txn_admin import TxnAdmin
from kafka_txn_sink.options import COMMIT_LOG, COMMIT_LOG_FORMAT, SINK_ID
from kafka_txn_sink.protocol.txn_ids import validate_sink_id
from kafka_txn_sink.redaction import MASK, is_secret
from kafka_txn_sink.storage import S3Settings

PROG = "kafka-txn-sink"
OK, REFUSED, CANNOT_RUN = 0, 1, 2
DEFAULT_TIMEOUT_MS = 5_000
DEFAULT_TRANSACTION_TIMEOUT_MS = 900_000
DEFAULT_LIST_LIMIT = 20
KAFKA_ENV_PREFIX = "KAFKA_TXN_SINK_KAFKA_"


class CliError(Exception):
    """A one-line reason the command cannot do what was asked."""

    def __init__(self, message: str, code: int = CANNOT_RUN) -> None:
        super().__init__(message)
        self.code = code


# -- options -----------------------------------------------------------------------------------


def json_option() -> argparse.ArgumentParser:
    """The parent parser of `--json`, so it may also follow the command."""
    common = argparse.ArgumentParser(add_help=False)
    # SUPPRESS: a --json after the command must not reset one given before it.
    common.add_argument("--json", action="store_true", default=argparse.SUPPRESS, help="JSON out")
    return common


def log_options() -> argparse.ArgumentParser:
    """The parent parser of the commands that read a commit log (`--log`, S3, `--log-format`)."""
    common = argparse.ArgumentParser(add_help=False, parents=[json_option()])
    common.add_argument(
        "--log", required=True, metavar="URI", help=f"the sink's {COMMIT_LOG} option"
    )
    add_s3_options(common)
    common.add_argument(
        "--log-format",
        choices=["auto", *LOG_FORMATS],
        default="auto",
        help=f"the sink's {COMMIT_LOG_FORMAT} (default: delta where the log has a _delta_log "
        "folder)",
    )
    return common


def kafka_options() -> argparse.ArgumentParser:
    """The parent parser of the commands that ask the brokers about the sink's transactions."""
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--bootstrap", required=True, metavar="HOST:PORT", help="Kafka brokers")
    common.add_argument(
        "--sink-id", metavar="ID", help=f"the sink's {SINK_ID} (default: the one the log names)"
    )
    add_kafka_option(common)
    common.add_argument(
        "--timeout-ms",
        type=int,
        default=DEFAULT_TIMEOUT_MS,
        help=f"Kafka connection and request timeout (default {DEFAULT_TIMEOUT_MS})",
    )
    return common


def add_s3_options(group: Any) -> None:
    """`--s3-endpoint` and `--s3-region` on a parser or argument group."""
    group.add_argument("--s3-endpoint", metavar="URL", help="S3-compatible endpoint")
    group.add_argument("--s3-region", metavar="REGION", help="S3 region")


def add_kafka_option(group: Any) -> None:
    """`--kafka KEY=VALUE` (repeatable) and `--kafka-config FILE` on a parser or group."""
    group.add_argument(
        "--kafka",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="librdkafka client setting, e.g. security.protocol=SASL_SSL (repeatable); "
        "secrets are better given by --kafka-config or the environment",
    )
    group.add_argument(
        "--kafka-config",
        metavar="FILE",
        help=f"a properties file of librdkafka settings (KEY=VALUE lines); also read: "
        f"{KAFKA_ENV_PREFIX}<SETTING> variables, e.g. {KAFKA_ENV_PREFIX}SASL_PASSWORD",
    )


# -- reading them ------------------------------------------------------------------------------


def s3_settings(args: argparse.Namespace) -> S3Settings | None:
    """The S3 endpoint and region given, or None for boto3's defaults."""
    if not (args.s3_endpoint or args.s3_region):
        return None
    return S3Settings(endpoint_url=args.s3_endpoint, region=args.s3_region)


def kafka_settings(args: argparse.Namespace, strict: bool = True) -> dict[str, str]:
    """The Kafka client settings: `--kafka-config FILE`, then `KAFKA_TXN_SINK_KAFKA_*`
    variables, then `--kafka KEY=VALUE` (a later source wins); Spark's `sasl.jaas.config`
    translated as the sink does.

    Raises:
        CliError: (when strict) a malformed setting or file, or a setting the driver's client
            cannot honour.
    """
    settings = _config_file(getattr(args, "kafka_config", None), strict)
    settings.update(_environment_settings())
    for item in getattr(args, "kafka", None) or []:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            if strict:
                raise CliError(f"--kafka takes KEY=VALUE, got {key.strip()!r} without a value")
            continue
        settings[key.strip()] = value
    if not strict:
        return settings
    try:
        return client_settings(settings)
    except ConfigError as exc:
        raise CliError(str(exc).replace("option kafka.", "Kafka setting ")) from None


def _config_file(path: str | None, strict: bool) -> dict[str, str]:
    """The KEY=VALUE lines of a Kafka client properties file (`#` and `!` start comments)."""
    if not path:
        return {}
    try:
        lines = Path(path).read_text().splitlines()
    except OSError as exc:
        raise CliError(f"--kafka-config {path}: {exc.strerror}") from None
    settings: dict[str, str] = {}
    for number, raw in enumerate(lines, 1):
        line = raw.strip()
        if not line or line[0] in "#!":
            continue
        key, sep, value = line.partition("=")
        if not sep or not key.strip():
            if strict:
                raise CliError(f"--kafka-config {path}, line {number}: expected KEY=VALUE")
            continue
        settings[key.strip()] = value.strip()
    return settings


def _environment_settings() -> dict[str, str]:
    """`KAFKA_TXN_SINK_KAFKA_SASL_PASSWORD=...` -> `sasl.password` (librdkafka's names have no
    underscore, so each `_` is a dot)."""
    return {
        name[len(KAFKA_ENV_PREFIX) :].lower().replace("_", "."): value
        for name, value in os.environ.items()
        if name.startswith(KAFKA_ENV_PREFIX) and len(name) > len(KAFKA_ENV_PREFIX)
    }


def scrub(message: str, args: argparse.Namespace) -> str:
    """The first line of `message`, with the values of secret `--kafka` settings masked."""
    for key, value in kafka_settings(args, strict=False).items():
        if value and is_secret(key):
            message = message.replace(value, MASK)
    return message.splitlines()[0] if message else message


def open_log(args: argparse.Namespace) -> tuple[CommitLog, str]:
    """The commit log at `--log` and the sink it belongs to.

    Raises:
        CliError: nothing at the location is a commit log (no `_sink.json`, no Delta sink row).
        MissingExtraError: `--log` or `--path` needs an extra that is not installed.
    """
    extras.require_all(
        extras.location_needs("--log", args.log)
        + extras.location_needs("--path", getattr(args, "path", None))
    )
    s3 = s3_settings(args)
    fmt = detect_format(args.log, s3) if args.log_format == "auto" else args.log_format
    if fmt == "delta":
        extras.require("--log (a Delta commit log)", "delta")
    commit_log = open_commit_log(args.log, s3, fmt)
    meta = commit_log.sink_meta()
    if meta is None:
        where = "has no _sink.json" if fmt == "json" else "has no sink row in its Delta table"
        raise CliError(
            f"no commit log at {args.log} ({commit_log.uri} {where}); "
            f"pass the sink's {COMMIT_LOG} option"
        )
    return commit_log, meta.sink_id


def sink_id_of(args: argparse.Namespace, log_sink_id: str) -> str:
    """The sink to act on: `--sink-id` if given, which must be the log's own.

    Raises:
        CliError: `--sink-id` names another sink than the log's.
        ConfigError: `--sink-id` is not a valid sink id.
    """
    if args.sink_id is None:
        return log_sink_id
    wanted = validate_sink_id(args.sink_id)
    if wanted != log_sink_id:
        raise CliError(f"commit log {args.log} belongs to sink {log_sink_id}, not {wanted}")
    return wanted


def brokers(args: argparse.Namespace) -> TxnAdmin:
    """The brokers' transaction client for `--bootstrap` (a context manager that closes it)."""
    return TxnAdmin(args.bootstrap, kafka_settings(args), args.timeout_ms)
