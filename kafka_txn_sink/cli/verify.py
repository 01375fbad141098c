"""`kafka-txn-sink verify`: the command line of the verifier (kafka_txn_sink.verify).

    kafka-txn-sink verify --bootstrap HOST:PORT --input-topic T [--checkpoint DIR]
        [--output-topic O] [--log URI [--references-topic R] [--path P]] [--json]

Exit codes: 0 exact, 1 any anomaly, 2 cannot run (bad arguments, unreachable brokers, no
checkpoint or commit log at the location).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn
from rich.progress import Progress as RichProgress
from rich.table import Table

from kafka_txn_sink import extras
from kafka_txn_sink.cli.common import (
    PROG,
    add_kafka_option,
    add_s3_options,
    json_option,
    kafka_settings,
    s3_settings,
)
from kafka_txn_sink.cli.render import Output
from kafka_txn_sink.commit_log import LOG_FORMATS
from kafka_txn_sink.errors import ConfigError
from kafka_txn_sink.files_options import PATH, REFERENCES_TOPIC
from kafka_txn_sink.options import COMMIT_LOG, COMMIT_LOG_FORMAT

if TYPE_CHECKING:
    from kafka_txn_sink.verify import VerifySpec
    from kafka_txn_sink.verify.kafka import Progress, ProgressTask
    from kafka_txn_sink.verify.report import Payload, VerifyReport

DEFAULT_MAX_PRINT = 20
DEFAULT_TIMEOUT_MS = 10_000
DEFAULT_STALL_TIMEOUT_S = 60.0
EXACT, ANOMALIES = 0, 1


def add_parser(commands: Any) -> None:
    """Register `verify` on the CLI's subcommands."""
    verify_parser: argparse.ArgumentParser = commands.add_parser(
        "verify",
        parents=[json_option()],
        help="compare the input ids with what the sink's outputs show read_committed",
        description="Exit 0 when every input id is in each output exactly once and nothing "
        "else is wrong, 1 on any anomaly, 2 when it cannot run.",
    )
    _input_options(verify_parser.add_argument_group("input"))
    _output_options(verify_parser.add_argument_group("records mode"))
    _files_options(verify_parser.add_argument_group("files mode and the commit log"))
    _client_options(verify_parser.add_argument_group("clients and output"))
    verify_parser.set_defaults(func=run)


def _input_options(group: Any) -> None:
    group.add_argument(
        "--bootstrap", "--bootstrap-servers", required=True, metavar="HOST:PORT", help="brokers"
    )
    group.add_argument(
        "--input-topic",
        action="append",
        required=True,
        metavar="TOPIC",
        help="a topic the query reads (repeatable)",
    )
    group.add_argument(
        "--input-id",
        default="key",
        metavar="key|json:FIELD|registry:FIELD",
        help="where an input record's id is: its key (default), a field of its JSON value, or "
        "of its value in a registry format",
    )
    group.add_argument(
        "--checkpoint",
        metavar="DIR",
        help="the query's checkpointLocation: the input ends where its last committed batch "
        "ends (default: at the topics' current end)",
    )


def _output_options(group: Any) -> None:
    group.add_argument(
        "--output-topic",
        action="append",
        default=[],
        metavar="TOPIC",
        help="the sink's topic (repeatable): read read_committed",
    )
    group.add_argument(
        "--output-id",
        default="key",
        metavar="key|json:FIELD|registry:FIELD",
        help="where an output id is: the key, a field of a JSON value, or a field of a value "
        "the sink wrote in a registry format (Avro or JSON Schema; needs --schema-registry-url)",
    )
    group.add_argument(
        "--schema-registry-url",
        metavar="URL",
        help="the Schema Registry of registry:FIELD ids (the sink's schema.registry.url)",
    )


def _files_options(group: Any) -> None:
    group.add_argument("--log", metavar="URI", help=f"the sink's {COMMIT_LOG} option")
    group.add_argument(
        "--log-format",
        choices=["auto", *LOG_FORMATS],
        default="auto",
        help=f"the sink's {COMMIT_LOG_FORMAT} (default: found out)",
    )
    group.add_argument("--references-topic", metavar="TOPIC", help=f"the sink's {REFERENCES_TOPIC}")
    group.add_argument("--path", metavar="PATH", help=f"the sink's {PATH} option (needs --log)")
    group.add_argument(
        "--file-id-field", default="id", metavar="FIELD", help="the Avro field holding the id"
    )


def _client_options(group: Any) -> None:
    add_s3_options(group)
    add_kafka_option(group)
    group.add_argument(
        "--timeout-ms",
        type=int,
        default=DEFAULT_TIMEOUT_MS,
        help=f"Kafka request timeout (default {DEFAULT_TIMEOUT_MS})",
    )
    group.add_argument(
        "--stall-timeout-s",
        type=float,
        default=DEFAULT_STALL_TIMEOUT_S,
        help="give up when a partition makes no progress this long, e.g. behind an open "
        f"transaction (default {DEFAULT_STALL_TIMEOUT_S:g})",
    )
    group.add_argument(
        "--max-print",
        type=int,
        default=DEFAULT_MAX_PRINT,
        metavar="N",
        help=f"print at most N items per anomaly (default {DEFAULT_MAX_PRINT}; --json lists all)",
    )


def spec_of(args: argparse.Namespace) -> VerifySpec:
    """What to verify, from the command line."""
    from kafka_txn_sink.verify import VerifySpec

    return VerifySpec(
        bootstrap=args.bootstrap,
        input_topics=tuple(args.input_topic),
        input_id=args.input_id,
        checkpoint=args.checkpoint,
        output_topics=tuple(args.output_topic),
        output_id=args.output_id,
        log=args.log,
        log_format=args.log_format,
        references_topic=args.references_topic,
        path=args.path,
        file_id_field=args.file_id_field,
        s3=s3_settings(args),
        kafka=kafka_settings(args),
        schema_registry={"url": args.schema_registry_url} if args.schema_registry_url else {},
        timeout_s=args.timeout_ms / 1000,
        stall_timeout_s=args.stall_timeout_s,
    )


def run(args: argparse.Namespace, out: Output) -> int:
    """`verify`: verify, print the report, and return the exit code (errors propagate).

    Raises:
        MissingExtraError: the verifier's extra is not installed.
    """
    extras.require(f"{PROG} verify", "verify")
    from kafka_txn_sink.verify import verify  # numpy, fastavro, boto3: the verify extra

    if args.max_print < 0:
        raise ConfigError(f"--max-print must not be negative, got {args.max_print}")
    spec = spec_of(args)
    with _progress(enabled=not out.json_mode and sys.stderr.isatty()) as progress:
        report = verify(spec, progress)
    if out.json_mode:
        report.write_json(sys.stdout)
        sys.stdout.flush()
    else:
        render(report, args.max_print, out.console)
    return EXACT if report.exact else ANOMALIES


# -- progress ------------------------------------------------------------------------------


class _Bar:
    """One rich progress bar, as the verifier's `ProgressTask`."""

    def __init__(self, progress: RichProgress, task_id: Any) -> None:
        self._progress = progress
        self._task_id = task_id

    def advance(self, amount: int) -> None:
        """Move the bar on by `amount`."""
        self._progress.advance(self._task_id, amount)

    def finish(self) -> None:
        """Fill the bar."""
        total = self._progress.tasks[self._task_id].total
        self._progress.update(self._task_id, completed=total)


class _Bars:
    """Rich progress bars, as the verifier's `Progress`."""

    def __init__(self, progress: RichProgress) -> None:
        self._progress = progress

    def task(self, description: str, total: int | None) -> ProgressTask:
        """A new bar of `total` steps (None: unknown)."""
        return _Bar(self._progress, self._progress.add_task(description, total=total))


@contextmanager
def _progress(enabled: bool) -> Iterator[Progress]:
    if not enabled:
        from kafka_txn_sink.verify.kafka import NoProgress

        yield NoProgress()
        return
    bars = RichProgress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=Console(stderr=True),
        transient=True,
    )
    with bars:
        yield _Bars(bars)


# -- the human report ----------------------------------------------------------------------


_Row = tuple[str, str, Callable[["Payload"], list[str]]]


def _position(item: Payload) -> str:
    value = item.get("id", item.get("location", item.get("value")))
    where = f"{item['topic']}[{item['partition']}]@{item['offset']}"
    return f"{where} {value}" if value is not None else where


def _ids(section: str, key: str) -> Callable[[Payload], list[str]]:
    return lambda p: [str(i) for i in p[section][key]]


def _positions(section: str, key: str) -> Callable[[Payload], list[str]]:
    return lambda p: [_position(i) for i in p[section][key]]


def _each(section: str, key: str, text: Callable[[Payload], str]) -> Callable[[Payload], list[str]]:
    return lambda p: [text(i) for i in p[section][key]]


def _duplicated(section: str) -> Callable[[Payload], list[str]]:
    return lambda p: [f"{i} x{n}" for i, n in p[section]["duplicated"].items()]


def _mode_rows(mode: str, without_id: Callable[[Payload], list[str]]) -> list[_Row]:
    return [
        (f"{mode}.lost", f"{mode}: lost ids", _ids(mode, "lost")),
        (f"{mode}.duplicated", f"{mode}: duplicated ids", _duplicated(mode)),
        (f"{mode}.unexpected", f"{mode}: unexpected ids", _ids(mode, "unexpected")),
        (f"{mode}.without_id", f"{mode}: without an id", without_id),
        (f"{mode}.aborted_reads", f"{mode}: aborted reads", _positions(mode, "aborted_reads")),
    ]


def _rows() -> list[_Row]:
    """Every check of the table: its key in `anomalies`, its label, how to show its items."""
    files: list[_Row] = [
        ("files.not_references", "files: no reference", _positions("files", "not_references")),
        (
            "files.undecided_references",
            "files: references of undecided batches",
            _each("files", "undecided_references", lambda i: f"{i['location']} ({i['batch']})"),
        ),
        (
            "files.duplicate_references",
            "files: references listed more than once",
            _each("files", "duplicate_references", lambda i: f"{i['location']} x{i['count']}"),
        ),
        ("files.missing_files", "files: referenced files missing", _ids("files", "missing_files")),
        (
            "files.unreferenced_files",
            "files: listed by the log, not referenced",
            _each("files", "unreferenced_files", lambda i: str(i["location"])),
        ),
        (
            "files.orphan_files",
            "files: orphans (under --path, in no decision)",
            _each("files", "orphan_files", lambda i: str(i["name"])),
        ),
        (
            "files.record_count_mismatches",
            "files: record counts differ",
            _each("files", "record_count_mismatches", str),
        ),
    ]
    log: list[_Row] = [
        (
            "log.count_mismatches",
            "log: batches whose counts differ",
            _each(
                "log",
                "count_mismatches",
                lambda i: f"batch {i['batch']}: decided {i['expected']}, seen {i['seen']}",
            ),
        ),
        (
            "log.recorded_losses",
            "log: losses recorded by completions",
            _each(
                "log",
                "recorded_losses",
                lambda i: f"batch {i['batch']}: {i['transactional_id']} {i['rows']} rows",
            ),
        ),
    ]
    return [
        ("input.without_id", "input: without an id", _positions("input", "without_id")),
        *_mode_rows("records", _positions("records", "without_id")),
        *_mode_rows(
            "files", _each("files", "without_id", lambda i: f"{i['location']} ({i['rows']})")
        ),
        *files,
        *log,
    ]


def render(report: VerifyReport, max_print: int, console: Console) -> None:
    """The human report: the verdict, what was read, and each check with its first items."""
    payload = report.payload(max_print)
    anomalies = payload["anomalies"]
    total = sum(anomalies.values())
    verdict = "[bold green]exact[/]" if not total else f"[bold red]NOT exact[/]: {total} anomalies"
    console.print(f"verify: {verdict} ({payload['elapsed_s']:.1f} s)")
    console.print(_summary(payload))
    table = Table(title="checks", title_justify="left")
    table.add_column("check")
    table.add_column("found", justify="right")
    table.add_column(f"items (first {max_print}; --json lists all)", overflow="fold")
    for key, label, items in _rows():
        if key not in anomalies:
            continue
        count = anomalies[key]
        shown = items(payload) if count else []
        more = f" … and {count - len(shown)} more" if count > len(shown) and shown else ""
        table.add_row(
            label,
            f"[bold red]{count}[/]" if count else "[green]0[/]",
            escape(", ".join(shown)) + more,
        )
    console.print(table)
    files = payload["files"]
    if files and files["left_by_failed_attempts"]["count"]:
        left = files["left_by_failed_attempts"]
        console.print(
            f"{left['count']} file(s), {left['bytes']} bytes, left by failed task attempts "
            "(not an anomaly: readers never see them; `kafka-txn-sink vacuum` deletes them)"
        )
    for note in payload["notes"]:
        console.print(f"note: {escape(note)}")


def _summary(payload: Payload) -> Table:
    table = Table(show_header=False, title="what was read", title_justify="left")
    table.add_column("what")
    table.add_column("detail")
    source = payload["input"]
    span = source["range"]
    if span["source"] == "checkpoint":
        where = f"up to batch {span['batch']} of {span['checkpoint']}"
    else:
        where = "up to the topics' end offsets at the start"
    table.add_row(
        "input",
        escape(
            f"{', '.join(source['topics'])} ({source['id']}): {source['records']} records, {where}"
        ),
    )
    if payload["records"]:
        records = payload["records"]
        table.add_row(
            "records mode",
            escape(
                f"{', '.join(records['topics'])} ({records['id']}): {records['records']} records"
            ),
        )
    if payload["files"]:
        files = payload["files"]
        table.add_row(
            "files mode",
            escape(
                f"{files['references']} references, {files['files_read']} files, "
                f"{files['rows']} rows (field {files['file_id_field']})"
            ),
        )
    if payload["log"]:
        log = payload["log"]
        table.add_row(
            "commit log",
            escape(
                f"{log['uri']}: {log['decided']} decided batches, "
                f"incomplete {log['incomplete'] or 'none'}"
            ),
        )
    return table
