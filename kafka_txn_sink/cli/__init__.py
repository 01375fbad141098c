"""`kafka-txn-sink`: read a sink's commit log, show its transactions on the brokers, recover.

    kafka-txn-sink log list --log URI
    kafka-txn-sink log show BATCH --log URI
    kafka-txn-sink status --log URI --bootstrap HOST:PORT [--sink-id ID]
    kafka-txn-sink recover --log URI --bootstrap HOST:PORT [--sink-id ID] [--execute [--force]]
        [--path PATH --references-topic R [--schema-inline-max-bytes N]]
    kafka-txn-sink vacuum --log URI --path PATH [--retention-hours H] [--execute]
    kafka-txn-sink verify --bootstrap HOST:PORT --input-topic T [--checkpoint DIR]
        [--output-topic O] [--log URI] [--references-topic R] [--path PATH]
    kafka-txn-sink group-offsets --bootstrap HOST:PORT --group G
    kafka-txn-sink metrics --log URI --bootstrap HOST:PORT [--listen HOST:PORT] [--once]

Tables by default, `--json` for scripts. Exit codes: 0 done (verify: exact); 1 not found,
refused, recovery left something unsettled, or verify found an anomaly; 2 cannot run (bad
arguments, no commit log at the location, brokers unreachable). The commit log is read from a
local path, `file://` or `s3://` (credentials from the usual AWS environment variables), in
either format (`--log-format`, found out by default); Kafka client settings (TLS, SASL) go in
`--kafka KEY=VALUE`.

One module per command group (log, transactions, vacuum, verify, groups, metrics), each
registering its own subcommands; common.py holds what they share, render.py how they print.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence
from typing import Any

from kafka_txn_sink.cli import groups, log, metrics, transactions, vacuum, verify
from kafka_txn_sink.cli.common import CANNOT_RUN, PROG, CliError, scrub
from kafka_txn_sink.cli.render import Output
from kafka_txn_sink.errors import KafkaTxnSinkError
from kafka_txn_sink.kafka.client_versions import check_clients


def build_parser() -> argparse.ArgumentParser:
    """The parser of every command; each sets `func(args, out) -> exit code`."""
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", action="store_true", help="print JSON instead of tables")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    log.add_parser(commands)
    transactions.add_parsers(commands)
    vacuum.add_parser(commands)
    verify.add_parser(commands)
    groups.add_parser(commands)
    metrics.add_parser(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command; its exit code (errors are one line on stderr, secrets masked)."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exit_:  # argparse exits on --help and on usage errors
        return int(exit_.code or 0)
    _quiet_client_logs()
    out = Output(json_mode=args.json)
    try:
        check_clients()  # the Kafka clients' internals the commands use are tested ones
        code: int = args.func(args, out)
        return code
    except CliError as exc:
        return _fail(exc.code, str(exc), args)
    except KafkaTxnSinkError as exc:
        return _fail(CANNOT_RUN, str(exc), args)


def _fail(code: int, message: str, args: argparse.Namespace) -> int:
    print(f"{PROG}: error: {scrub(message, args)}", file=sys.stderr)
    return code


class _StderrHandler(logging.StreamHandler):
    """Writes each record to the `sys.stderr` of that moment: one process may run the CLI
    several times (tests swap stderr for each run), and an earlier stderr may be closed."""

    @property
    def stream(self) -> Any:
        """The current standard error."""
        return sys.stderr

    @stream.setter
    def stream(self, _: Any) -> None:
        """Ignored: the stream is always the current standard error."""


_WARNINGS = _StderrHandler()
_WARNINGS.setFormatter(logging.Formatter(f"{PROG}: %(levelname)s: %(message)s"))


def _quiet_client_logs() -> None:
    # kafka-python logs every refused connection; the CLI reports the one error that matters.
    logging.getLogger("kafka").setLevel(logging.CRITICAL)
    ours = logging.getLogger("kafka_txn_sink")
    if not ours.handlers:
        ours.addHandler(_WARNINGS)
        ours.setLevel(logging.WARNING)
