"""`kafka-txn-sink`: read a sink's commit log, show its transactions on the brokers, recover.

    kafka-txn-sink log list --log URI
    kafka-txn-sink log show BATCH --log URI
    kafka-txn-sink status --log URI --bootstrap HOST:PORT [--sink-id ID]
    kafka-txn-sink recover --log URI --bootstrap HOST:PORT [--sink-id ID] [--execute [--force]]
        [--path PATH --references-topic R]
    kafka-txn-sink vacuum --log URI --path PATH [--retention-hours H] [--execute]
    kafka-txn-sink verify --bootstrap HOST:PORT --input-topic T [--checkpoint DIR]
        [--output-topic O] [--log URI] [--references-topic R] [--path PATH]

Tables by default, `--json` for scripts. Exit codes: 0 done (verify: exact); 1 not found,
refused, recovery left something unsettled, or verify found an anomaly; 2 cannot run (bad
arguments, no commit log at the location, brokers unreachable). The commit log is read from a
local path, `file://` or `s3://` (credentials from the usual AWS environment variables), in
either format (`--log-format`, found out by default); Kafka client settings (TLS, SASL) go in
`--kafka KEY=VALUE`.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from kafka_txn_sink.cli import verify as cli_verify
from kafka_txn_sink.commit_log import LOG_FORMATS, CommitLog, detect_format, open_commit_log
from kafka_txn_sink.errors import KafkaTxnSinkError, StagingError, TransactionCompletionError
from kafka_txn_sink.files.republish import Republisher
from kafka_txn_sink.files.vacuum import (
    VacuumPlan,
    check_retention,
    plan_vacuum,
    referenced_locations,
)
from kafka_txn_sink.kafka.cluster import Cluster
from kafka_txn_sink.kafka.txn_admin import ONGOING, TxnAdmin, TxnState
from kafka_txn_sink.options import DEFAULT_SCHEMA_INLINE_MAX_BYTES, is_secret
from kafka_txn_sink.protocol.complete import Settler
from kafka_txn_sink.protocol.messages import Completion, Decision, Triple
from kafka_txn_sink.protocol.txn_ids import owns, transactional_id, validate_sink_id
from kafka_txn_sink.storage import S3Settings
from kafka_txn_sink.storage.files import FileSink, PendingUpload, S3FileSink, open_file_sink

PROG = "kafka-txn-sink"
OK, REFUSED, CANNOT_RUN = 0, 1, 2
DEFAULT_TIMEOUT_MS = 5_000
DEFAULT_TRANSACTION_TIMEOUT_MS = 900_000
END_TXN_DEADLINE_S = 30.0
DEFAULT_LIST_LIMIT = 20
DEFAULT_RETENTION_HOURS = 24.0

Payload = dict[str, Any]


class CliError(Exception):
    """A one-line reason the command cannot do what was asked."""

    def __init__(self, message: str, code: int = CANNOT_RUN) -> None:
        super().__init__(message)
        self.code = code


# -- arguments ---------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", action="store_true", help="print JSON instead of tables")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    log_parser = commands.add_parser("log", help="read the commit log")
    log_commands = log_parser.add_subparsers(dest="log_command", required=True, metavar="ACTION")
    listing = log_commands.add_parser(
        "list", parents=[_log_options()], help="decided batches, newest last"
    )
    listing.add_argument(
        "--limit",
        type=int,
        default=DEFAULT_LIST_LIMIT,
        help=f"show the newest N batches (default {DEFAULT_LIST_LIMIT}; 0 shows all)",
    )
    listing.set_defaults(func=cmd_log_list)
    show = log_commands.add_parser(
        "show", parents=[_log_options()], help="one batch's decision and completion"
    )
    show.add_argument("batch", type=int, metavar="BATCH")
    show.set_defaults(func=cmd_log_show)

    status = commands.add_parser(
        "status",
        parents=[_log_options(), _kafka_options()],
        help="decided, completed and incomplete batches; this sink's open transactions",
    )
    status.set_defaults(func=cmd_status)

    recover = commands.add_parser(
        "recover",
        parents=[_log_options(), _kafka_options()],
        help="roll decided batches forward and abort undecided transactions (dry run by default)",
    )
    recover.add_argument("--execute", action="store_true", help="do it (default: only show)")
    recover.add_argument(
        "--force", action="store_true", help="execute even though the query may still be running"
    )
    recover.add_argument(
        "--transaction-timeout-ms",
        type=int,
        default=DEFAULT_TRANSACTION_TIMEOUT_MS,
        help="the sink's transaction timeout: activity younger than this means the query may be "
        f"alive (default {DEFAULT_TRANSACTION_TIMEOUT_MS})",
    )
    recover.add_argument(
        "--path", metavar="PATH", help="files mode: the sink's path option (to republish)"
    )
    recover.add_argument(
        "--references-topic",
        metavar="TOPIC",
        help="files mode: the sink's referencesTopic option; with --path, file references of "
        "decided transactions the broker aborted are published again",
    )
    recover.set_defaults(func=cmd_recover)

    vacuum = commands.add_parser(
        "vacuum",
        parents=[_log_options()],
        help="delete data files no decided batch references, once older than the retention "
        "(dry run by default)",
    )
    vacuum.add_argument("--path", required=True, metavar="PATH", help="the sink's path option")
    vacuum.add_argument(
        "--retention-hours",
        type=float,
        default=DEFAULT_RETENTION_HOURS,
        help="keep unreferenced files younger than this; never shorter than the transaction "
        f"timeout (default {DEFAULT_RETENTION_HOURS:g})",
    )
    vacuum.add_argument(
        "--transaction-timeout-ms",
        type=int,
        default=DEFAULT_TRANSACTION_TIMEOUT_MS,
        help="the longest transaction timeout the sink has used "
        f"(default {DEFAULT_TRANSACTION_TIMEOUT_MS})",
    )
    vacuum.add_argument("--execute", action="store_true", help="delete (default: only show)")
    vacuum.add_argument(
        "--limit",
        type=int,
        default=DEFAULT_LIST_LIMIT,
        help=f"list at most N files (default {DEFAULT_LIST_LIMIT}; 0 lists all)",
    )
    # Tests only: S3 servers do not let a client set LastModified, so the clock moves instead.
    vacuum.add_argument("--now-ms", type=int, help=argparse.SUPPRESS)
    vacuum.set_defaults(func=cmd_vacuum)

    cli_verify.add_parser(commands, _json_option()).set_defaults(func=cmd_verify)
    return parser


def _json_option() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    # SUPPRESS: a --json after the command must not reset one given before it.
    common.add_argument("--json", action="store_true", default=argparse.SUPPRESS, help="JSON out")
    return common


def _log_options() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False, parents=[_json_option()])
    common.add_argument("--log", required=True, metavar="URI", help="the sink's commitLog option")
    common.add_argument("--s3-endpoint", metavar="URL", help="S3-compatible endpoint")
    common.add_argument("--s3-region", metavar="REGION", help="S3 region")
    common.add_argument(
        "--log-format",
        choices=["auto", *LOG_FORMATS],
        default="auto",
        help="the sink's commitLogFormat (default: delta where the log has a _delta_log folder)",
    )
    return common


def _kafka_options() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--bootstrap", required=True, metavar="HOST:PORT", help="Kafka brokers")
    common.add_argument(
        "--sink-id", metavar="ID", help="the sink's sinkId (default: the one the log names)"
    )
    common.add_argument(
        "--kafka",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="librdkafka client setting, e.g. security.protocol=SASL_SSL (repeatable)",
    )
    common.add_argument(
        "--timeout-ms",
        type=int,
        default=DEFAULT_TIMEOUT_MS,
        help=f"Kafka connection and request timeout (default {DEFAULT_TIMEOUT_MS})",
    )
    return common


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exit_:  # argparse exits on --help and on usage errors
        return int(exit_.code or 0)
    _quiet_client_logs()
    out = Output(json_mode=args.json)
    try:
        code: int = args.func(args, out)
        return code
    except CliError as exc:
        return _fail(exc.code, str(exc), args)
    except KafkaTxnSinkError as exc:
        return _fail(CANNOT_RUN, str(exc), args)


def _fail(code: int, message: str, args: argparse.Namespace) -> int:
    print(f"{PROG}: error: {_scrub(message, args)}", file=sys.stderr)
    return code


def _scrub(message: str, args: argparse.Namespace) -> str:
    for key, value in _kafka_settings(args, strict=False).items():
        if value and is_secret(key):
            message = message.replace(value, "***")
    return message.splitlines()[0] if message else message


def _quiet_client_logs() -> None:
    # kafka-python logs every refused connection; the CLI reports the one error that matters.
    logging.getLogger("kafka").setLevel(logging.CRITICAL)
    ours = logging.getLogger("kafka_txn_sink")
    if not ours.handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter(f"{PROG}: %(levelname)s: %(message)s"))
        ours.addHandler(handler)
        ours.setLevel(logging.WARNING)


# -- output ------------------------------------------------------------------------------------


class Output:
    """Either one JSON document on stdout, or rich tables and lines."""

    def __init__(self, json_mode: bool) -> None:
        self.json_mode = json_mode
        self.console = Console(highlight=False)
        if not self.console.is_terminal:
            # Piped or captured: rich would assume 80 columns and fold the tables.
            self.console.width = 160

    def emit(self, payload: Payload, render: Callable[[Payload, Console], None]) -> None:
        if self.json_mode:
            print(json.dumps(payload, indent=2, sort_keys=True))
        else:
            render(payload, self.console)


def iso(ms: int | None) -> str:
    if ms is None or ms < 0:
        return "-"
    return datetime.fromtimestamp(ms / 1000, tz=timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _now_ms() -> int:
    return int(time.time() * 1000)


def _age_s(since_ms: int, now_ms: int) -> float | None:
    return round((now_ms - since_ms) / 1000, 1) if since_ms >= 0 else None


# -- commit log --------------------------------------------------------------------------------


def open_log(args: argparse.Namespace) -> tuple[CommitLog, str]:
    """The commit log at `--log` and the sink it belongs to.

    Raises:
        CliError: nothing at the location is a commit log (no `_sink.json`, no Delta sink row).
    """
    s3 = _s3_settings(args)
    fmt = detect_format(args.log, s3) if args.log_format == "auto" else args.log_format
    commit_log = open_commit_log(args.log, s3, fmt)
    meta = commit_log.sink_meta()
    if meta is None:
        where = "has no _sink.json" if fmt == "json" else "has no sink row in its Delta table"
        raise CliError(
            f"no commit log at {args.log} ({commit_log.uri} {where}); "
            "pass the sink's commitLog option"
        )
    return commit_log, meta.sink_id


def _s3_settings(args: argparse.Namespace) -> S3Settings | None:
    if not (args.s3_endpoint or args.s3_region):
        return None
    return S3Settings(endpoint_url=args.s3_endpoint, region=args.s3_region)


def batch_row(commit_log: CommitLog, batch_id: int) -> Payload:
    """One line of `log list`: what was decided, and whether it was completed."""
    decision = commit_log.decision(batch_id)
    if decision is None:
        raise CliError(f"batch {batch_id} has no decision in {commit_log.uri}", REFUSED)
    completion = commit_log.completion(batch_id)
    return {
        "batch": batch_id,
        "decided_at_ms": decision.decided_at_ms,
        "rows": decision.rows,
        "tasks": decision.tasks,
        "participants": len(decision.participants),
        "completed": completion is not None,
        "completed_at_ms": completion.completed_at_ms if completion else None,
        "lost_rows": sum(x.rows for x in completion.lost) if completion else 0,
    }


def batch_rows(commit_log: CommitLog, limit: int = 0) -> tuple[list[Payload], int]:
    """The newest `limit` batches (all when 0), oldest first, and how many are decided."""
    batches = commit_log.decided_batches()
    shown = batches[-limit:] if limit > 0 else batches
    return [batch_row(commit_log, b) for b in shown], len(batches)


def batches_table(rows: Sequence[Payload], title: str | None = None) -> Table:
    table = Table(title=title, title_justify="left")
    for name in ("batch", "decided at", "rows", "participants", "completed", "lost rows"):
        table.add_column(name, justify="right" if name != "decided at" else "left")
    for row in rows:
        table.add_row(
            str(row["batch"]),
            iso(row["decided_at_ms"]),
            str(row["rows"]),
            f"{row['participants']}/{row['tasks']}",
            "yes" if row["completed"] else "[bold red]no[/]",
            str(row["lost_rows"]) if row["lost_rows"] else "-",
        )
    return table


def cmd_log_list(args: argparse.Namespace, out: Output) -> int:
    commit_log, sink_id = open_log(args)
    rows, total = batch_rows(commit_log, args.limit)
    payload = {"log": commit_log.uri, "sink_id": sink_id, "decided": total, "batches": rows}
    out.emit(payload, _render_log_list)
    return OK


def _render_log_list(payload: Payload, console: Console) -> None:
    shown, total = len(payload["batches"]), payload["decided"]
    title = f"sink {payload['sink_id']}: {total} decided batch(es) in {escape(payload['log'])}"
    if shown < total:
        title += f" (newest {shown} shown; --limit 0 shows all)"
    console.print(batches_table(payload["batches"], title))


def cmd_log_show(args: argparse.Namespace, out: Output) -> int:
    commit_log, _ = open_log(args)
    decision = commit_log.decision(args.batch)
    if decision is None:
        raise CliError(f"batch {args.batch} has no decision in {commit_log.uri}", REFUSED)
    completion = commit_log.completion(args.batch)
    payload = {
        "log": commit_log.uri,
        "decision": _record_json(decision),
        "completion": _record_json(completion) if completion else None,
    }
    out.emit(payload, _render_log_show)
    return OK


def _record_json(record: Decision | Completion) -> Payload:
    body: Payload = json.loads(record.to_json())
    return body


def _render_log_show(payload: Payload, console: Console) -> None:
    decision, completion = payload["decision"], payload["completion"]
    summary = Table(
        title=f"batch {decision['batch_id']} of sink {decision['sink_id']}",
        title_justify="left",
        show_header=False,
    )
    summary.add_column("field")
    summary.add_column("value")
    summary.add_row("query id", decision["query_id"])
    summary.add_row("decided at", iso(decision["decided_at_ms"]))
    summary.add_row(
        "tasks / participants", f"{decision['tasks']} / {len(decision['participants'])}"
    )
    summary.add_row("rows", str(decision["rows"]))
    summary.add_row("completed at", iso(completion["completed_at_ms"]) if completion else "no")
    console.print(summary)
    console.print(_participants_table(decision["participants"], "participants"))
    if completion and completion["lost"]:
        console.print(_participants_table(completion["lost"], "[bold red]lost[/]"))


def _participants_table(rows: Sequence[Payload], title: str) -> Table:
    table = Table(title=title, title_justify="left")
    for name in ("partition", "transactional id", "producer id", "epoch", "rows", "offsets"):
        table.add_column(name)
    for row in rows:
        table.add_row(
            str(row["partition"]),
            row["transactional_id"],
            str(row["producer_id"]),
            str(row["producer_epoch"]),
            str(row["rows"]),
            _offsets_text(row["offsets"]),
        )
    return table


def _offsets_text(offsets: Mapping[str, Mapping[str, Sequence[int]]]) -> str:
    return escape(
        ", ".join(
            f"{topic}[{p}] {r[0]}-{r[1]}"
            for topic, parts in offsets.items()
            for p, r in parts.items()
        )
    )


# -- brokers -----------------------------------------------------------------------------------


def _kafka_settings(args: argparse.Namespace, strict: bool = True) -> dict[str, str]:
    settings: dict[str, str] = {}
    for item in getattr(args, "kafka", None) or []:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            if strict:
                raise CliError(f"--kafka takes KEY=VALUE, got {key.strip()!r} without a value")
            continue
        settings[key.strip()] = value
    return settings


def _sink_id(args: argparse.Namespace, log_sink_id: str) -> str:
    if args.sink_id is None:
        return log_sink_id
    wanted = validate_sink_id(args.sink_id)
    if wanted != log_sink_id:
        raise CliError(f"commit log {args.log} belongs to sink {log_sink_id}, not {wanted}")
    return wanted


@contextmanager
def brokers(args: argparse.Namespace) -> Iterator[TxnAdmin]:
    txn_admin = TxnAdmin(args.bootstrap, _kafka_settings(args), args.timeout_ms)
    try:
        yield txn_admin
    finally:
        txn_admin.close()


def open_transactions(
    txn_admin: TxnAdmin, commit_log: CommitLog, sink_id: str
) -> list[TxnState]:
    """This sink's Ongoing transactions, ordered by transactional id."""
    try:
        ids = [i for i in txn_admin.list_ids([ONGOING]) if owns(sink_id, i)]
    except KafkaTxnSinkError:
        # No DESCRIBE on the cluster: ask for the ids the log says this sink has used.
        ids = [transactional_id(sink_id, p) for p in range(commit_log.max_partition_count())]
    states = txn_admin.describe(ids).values()
    return sorted((s for s in states if s.state == ONGOING), key=lambda s: s.transactional_id)


def incomplete_decisions(commit_log: CommitLog) -> list[Decision]:
    found = (commit_log.decision(b) for b in commit_log.incomplete_batches())
    return [d for d in found if d is not None]


def holders(decisions: Sequence[Decision]) -> dict[Triple, int]:
    """Which incomplete batch holds each participant: those must be committed, never aborted."""
    return {p.triple: d.batch_id for d in decisions for p in d.participants}


def last_completed(
    commit_log: CommitLog, latest: Decision | None, incomplete: list[int]
) -> int | None:
    if latest is None:
        return None
    if latest.batch_id not in incomplete:
        return latest.batch_id
    # Rare: the newest batch is incomplete, so look through the whole log.
    done = [b for b in commit_log.decided_batches() if b not in set(incomplete)]
    return done[-1] if done else None


def _txn_json(state: TxnState, held: Mapping[Triple, int], now_ms: int) -> Payload:
    return {
        "transactional_id": state.transactional_id,
        "producer_id": state.producer_id,
        "producer_epoch": state.producer_epoch,
        "started_at_ms": state.start_ms,
        "age_s": _age_s(state.start_ms, now_ms),
        "timeout_ms": state.timeout_ms,
        "held_by_batch": held.get(state.triple),
    }


def cmd_status(args: argparse.Namespace, out: Output) -> int:
    commit_log, log_sink_id = open_log(args)
    sink_id = _sink_id(args, log_sink_id)
    with brokers(args) as txn_admin:
        latest = commit_log.latest_decision()
        pending = incomplete_decisions(commit_log)
        incomplete = [d.batch_id for d in pending]
        now = _now_ms()
        txns = open_transactions(txn_admin, commit_log, sink_id)
    held = holders(pending)
    payload = {
        "sink_id": sink_id,
        "log": commit_log.uri,
        "bootstrap": args.bootstrap,
        "last_decided": _decided_json(latest, now),
        "last_completed": last_completed(commit_log, latest, incomplete),
        "incomplete": incomplete,
        "open_transactions": [_txn_json(t, held, now) for t in txns],
    }
    out.emit(payload, _render_status)
    return OK


def _decided_json(latest: Decision | None, now_ms: int) -> Payload | None:
    if latest is None:
        return None
    return {
        "batch": latest.batch_id,
        "decided_at_ms": latest.decided_at_ms,
        "age_s": _age_s(latest.decided_at_ms, now_ms),
    }


def _render_status(payload: Payload, console: Console) -> None:
    latest = payload["last_decided"]
    summary = Table(title=f"sink {payload['sink_id']}", title_justify="left", show_header=False)
    summary.add_column("field")
    summary.add_column("value")
    summary.add_row("commit log", escape(payload["log"]))
    summary.add_row("brokers", payload["bootstrap"])
    summary.add_row(
        "last decided batch",
        f"{latest['batch']} ({iso(latest['decided_at_ms'])}, {latest['age_s']} s ago)"
        if latest
        else "none",
    )
    last = payload["last_completed"]
    summary.add_row("last completed batch", "none" if last is None else str(last))
    incomplete = payload["incomplete"]
    summary.add_row(
        "incomplete batches",
        ", ".join(map(str, incomplete)) if incomplete else "none",
    )
    summary.add_row("open transactions", str(len(payload["open_transactions"])))
    console.print(summary)
    if payload["open_transactions"]:
        console.print(_transactions_table(payload["open_transactions"], "open transactions"))


def _transactions_table(rows: Sequence[Payload], title: str) -> Table:
    table = Table(title=title, title_justify="left")
    for name in ("transactional id", "producer id", "epoch", "age s", "held by batch"):
        table.add_column(name)
    for row in rows:
        held = row.get("held_by_batch")
        table.add_row(
            row["transactional_id"],
            str(row["producer_id"]),
            str(row["producer_epoch"]),
            "-" if row["age_s"] is None else str(row["age_s"]),
            "undecided" if held is None else str(held),
        )
    return table


# -- recover -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Plan:
    roll_forward: list[Decision]
    abort: list[TxnState]
    alive_because: str | None


def plan_recovery(
    commit_log: CommitLog, txn_admin: TxnAdmin, sink_id: str, timeout_ms: int, now_ms: int
) -> Plan:
    pending = incomplete_decisions(commit_log)
    held = holders(pending)
    txns = open_transactions(txn_admin, commit_log, sink_id)
    stale = [t for t in txns if t.triple not in held]
    return Plan(
        pending, stale, alive_because(commit_log.latest_decision(), txns, timeout_ms, now_ms)
    )


def alive_because(
    latest: Decision | None, txns: Sequence[TxnState], timeout_ms: int, now_ms: int
) -> str | None:
    """Why the query may still be running, or None when nothing is younger than the timeout.

    An open transaction counts too: a query with sparse triggers can be in the middle of a batch
    long after its last decision.
    """
    if latest is not None and now_ms - latest.decided_at_ms < timeout_ms:
        age = _age_s(latest.decided_at_ms, now_ms)
        return f"batch {latest.batch_id} was decided {age} s ago"
    young = [t for t in txns if t.start_ms >= 0 and now_ms - t.start_ms < timeout_ms]
    if young:
        age = _age_s(young[0].start_ms, now_ms)
        return f"transaction {young[0].transactional_id} started {age} s ago"
    return None


def cmd_recover(args: argparse.Namespace, out: Output) -> int:
    commit_log, log_sink_id = open_log(args)
    sink_id = _sink_id(args, log_sink_id)
    republisher = _republisher(args, sink_id)
    with brokers(args) as txn_admin:
        now = _now_ms()
        plan = plan_recovery(commit_log, txn_admin, sink_id, args.transaction_timeout_ms, now)
        payload = _plan_json(plan, sink_id, args, now)
        if not args.execute or (plan.alive_because and not args.force):
            out.emit(payload, _render_recover)
            return REFUSED if args.execute else OK
        cluster = Cluster(args.bootstrap, _kafka_settings(args), args.timeout_ms)
        settler = Settler(
            sink_id, commit_log, txn_admin, cluster, END_TXN_DEADLINE_S, republisher
        )
        payload["result"] = execute(plan, commit_log, settler)
    out.emit(payload, _render_recover)
    return OK if payload["result"]["ok"] else REFUSED


def _republisher(args: argparse.Namespace, sink_id: str) -> Republisher | None:
    if not (args.path and args.references_topic):
        if args.path or args.references_topic:
            raise CliError("--path and --references-topic go together (files mode)")
        return None
    return Republisher(
        sink_id=sink_id,
        bootstrap_servers=args.bootstrap,
        kafka=_kafka_settings(args),
        transaction_timeout_ms=args.transaction_timeout_ms,
        client_timeout_s=args.timeout_ms / 1000,
        references_topic=args.references_topic,
        path=args.path,
        s3=_s3_settings(args),
        inline_max_bytes=DEFAULT_SCHEMA_INLINE_MAX_BYTES,
    )


def _plan_json(plan: Plan, sink_id: str, args: argparse.Namespace, now_ms: int) -> Payload:
    return {
        "sink_id": sink_id,
        "log": args.log,
        "mode": "execute" if args.execute else "dry-run",
        "alive_because": plan.alive_because,
        "forced": bool(args.force),
        "transaction_timeout_ms": args.transaction_timeout_ms,
        "roll_forward": [
            {
                "batch": d.batch_id,
                "rows": d.rows,
                "participants": [str(p.triple) for p in d.participants],
            }
            for d in plan.roll_forward
        ],
        "abort": [_txn_json(t, {}, now_ms) for t in plan.abort],
    }


def execute(plan: Plan, commit_log: CommitLog, settler: Settler) -> Payload:
    """Roll forward in batch order, then abort what is still undecided; report every step."""
    completed: list[Payload] = []
    for decision in plan.roll_forward:
        try:
            settled = settler.complete(decision)
        except TransactionCompletionError as exc:
            return {"ok": False, "completed": completed, "aborted": [], "error": str(exc)}
        lost = sum(x.rows for x in settled.completion.lost)
        completed.append({"batch": decision.batch_id, "lost_rows": lost})
    if plan.roll_forward:
        commit_log.write_hint(plan.roll_forward[-1].batch_id)
    # Re-read just before aborting: a participant decided meanwhile must never be aborted.
    held = holders(incomplete_decisions(commit_log))
    triples = [t.triple for t in plan.abort if t.triple not in held]
    aborted = [{"transaction": str(r.triple), "error": r.error} for r in settler.abort(triples)]
    ok = all(r["error"] is None for r in aborted)
    return {"ok": ok, "completed": completed, "aborted": aborted, "error": None}


def _render_recover(payload: Payload, console: Console) -> None:
    result = payload.get("result")
    verb = "rolled forward" if result else "would roll forward"
    if payload["roll_forward"]:
        table = Table(title=f"{verb} (decided, not completed)", title_justify="left")
        for name in ("batch", "rows", "participants"):
            table.add_column(name)
        for row in payload["roll_forward"]:
            table.add_row(str(row["batch"]), str(row["rows"]), "\n".join(row["participants"]))
        console.print(table)
    else:
        console.print("nothing to roll forward: every decided batch is complete")
    verb = "aborted" if result else "would abort"
    if payload["abort"]:
        console.print(_transactions_table(payload["abort"], f"{verb} (open, in no decision)"))
    else:
        console.print("nothing to abort: no open transaction of the sink outside a decision")
    _render_outcome(payload, console)


def _render_outcome(payload: Payload, console: Console) -> None:
    result = payload.get("result")
    alive = payload["alive_because"]
    if result is None and payload["mode"] == "execute":
        console.print(
            f"[bold red]refused[/]: the query may still be running ({alive}; "
            f"--transaction-timeout-ms is {payload['transaction_timeout_ms']}); stop it, or "
            "pass --force if it is dead"
        )
    elif result is None:
        note = (
            f" (the query may still be running: {alive}; --execute needs --force)" if alive else ""
        )
        console.print(f"dry run: nothing changed; --execute does it{note}")
    elif result["ok"]:
        for batch in result["completed"]:
            if batch["lost_rows"]:
                console.print(
                    f"[bold red]batch {batch['batch']} lost {batch['lost_rows']} rows[/]: the "
                    f"broker had aborted a participant; see `log show {batch['batch']}`"
                )
        console.print("[bold green]done[/]")
    else:
        failed = [a for a in result["aborted"] if a["error"]]
        reason = result["error"] or f"{len(failed)} abort(s) failed: {failed}"
        console.print(f"[bold red]not settled[/]: {reason}")


# -- vacuum ------------------------------------------------------------------------------------


def cmd_vacuum(args: argparse.Namespace, out: Output) -> int:
    retention_s = args.retention_hours * 3600
    now_ms = args.now_ms if args.now_ms is not None else _now_ms()
    check_retention(retention_s, args.transaction_timeout_ms)  # before touching anything
    commit_log, sink_id = open_log(args)
    sink = open_file_sink(args.path, _s3_settings(args))
    # Listed before the log is read: a batch decided in between is still seen as referencing.
    stored = sink.list()
    pending = sink.pending_uploads() if isinstance(sink, S3FileSink) else []
    referenced = referenced_locations(commit_log)
    plan = plan_vacuum(
        referenced,
        stored,
        sink.location,
        now_s=now_ms / 1000,
        retention_s=retention_s,
        transaction_timeout_ms=args.transaction_timeout_ms,
        pending=pending,
    )
    payload = _vacuum_json(plan, sink_id, sink, args, now_ms)
    if referenced and not plan.referenced and plan.delete:
        payload["warning"] = (
            f"none of the {len(referenced)} files the log references is under {sink.uri}: "
            "is --path the sink's path option?"
        )
        if args.execute:
            # A wrong --path would make every old file look orphaned: delete nothing.
            out.emit(payload, _render_vacuum)
            return REFUSED
    if args.execute:
        payload["result"] = _vacuum_execute(plan, sink)
    out.emit(payload, _render_vacuum)
    return OK if payload.get("result", {"ok": True})["ok"] else REFUSED


def _vacuum_json(
    plan: VacuumPlan, sink_id: str, sink: FileSink, args: argparse.Namespace, now_ms: int
) -> Payload:
    shown = plan.delete[: args.limit] if args.limit > 0 else plan.delete
    return {
        "sink_id": sink_id,
        "log": args.log,
        "path": sink.uri,
        "mode": "execute" if args.execute else "dry-run",
        "now_ms": now_ms,
        "retention_hours": args.retention_hours,
        "kept": {"referenced": plan.referenced, "young": plan.young, "other": plan.other},
        "delete": {
            "count": len(plan.delete),
            "bytes": plan.delete_bytes,
            "files": [
                {"name": f.name, "bytes": f.bytes, "modified_ms": int(f.modified_s * 1000)}
                for f in shown
            ],
        },
        "abort_uploads": [_upload_json(u) for u in plan.abort],
    }


def _upload_json(upload: PendingUpload) -> Payload:
    return {
        "name": upload.name,
        "upload_id": upload.upload_id,
        "initiated_ms": int(upload.initiated_s * 1000),
    }


def _vacuum_execute(plan: VacuumPlan, sink: FileSink) -> Payload:
    """Delete and abort everything planned; a failure is reported, the rest still done."""
    errors: list[str] = []
    deleted = aborted = 0
    for item in plan.delete:
        try:
            sink.delete(item.name)
            deleted += 1
        except StagingError as exc:
            errors.append(str(exc))
    for upload in plan.abort:
        try:
            if isinstance(sink, S3FileSink):
                sink.abort_upload(upload)
                aborted += 1
        except StagingError as exc:
            errors.append(str(exc))
    return {"ok": not errors, "deleted": deleted, "aborted": aborted, "errors": errors}


def _render_vacuum(payload: Payload, console: Console) -> None:
    delete, kept = payload["delete"], payload["kept"]
    verb = "deleted" if "result" in payload else "would delete"
    console.print(
        f"{escape(payload['path'])}: {verb} {delete['count']} unreferenced file(s), "
        f"{delete['bytes']} bytes, older than {payload['retention_hours']:g} h; kept "
        f"{kept['referenced']} referenced, {kept['young']} younger, {kept['other']} other"
    )
    if delete["files"]:
        table = Table(title=verb, title_justify="left")
        for name in ("file", "bytes", "modified at"):
            table.add_column(name)
        for row in delete["files"]:
            table.add_row(escape(row["name"]), str(row["bytes"]), iso(row["modified_ms"]))
        console.print(table)
        if len(delete["files"]) < delete["count"]:
            console.print(f"... and {delete['count'] - len(delete['files'])} more (--limit 0)")
    if payload["abort_uploads"]:
        verb_uploads = "aborted" if "result" in payload else "would abort"
        console.print(f"{verb_uploads} {len(payload['abort_uploads'])} stale multipart upload(s)")
    if "warning" in payload:
        console.print(f"[bold yellow]warning[/]: {escape(payload['warning'])}")
    result = payload.get("result")
    if result is None and payload["mode"] == "execute":
        console.print("[bold red]refused[/]: nothing deleted")
    elif result is None:
        console.print("dry run: nothing changed; --execute does it")
    elif result["ok"]:
        console.print("[bold green]done[/]")
    else:
        console.print(f"[bold red]{len(result['errors'])} failure(s)[/]: {result['errors'][0]}")


# -- verify ------------------------------------------------------------------------------------


def cmd_verify(args: argparse.Namespace, out: Output) -> int:
    return cli_verify.run(args, _kafka_settings(args), out.json_mode)
