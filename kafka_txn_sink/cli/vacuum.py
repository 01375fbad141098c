"""`kafka-txn-sink vacuum`: delete the data files of decided batches that their decisions do not
list (files mode).

    kafka-txn-sink vacuum --log URI --path PATH [--retention-hours H] [--execute]

What may be deleted is planned by kafka_txn_sink.files.vacuum; this module lists, shows and,
with `--execute`, deletes.
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from kafka_txn_sink.cli.common import (
    DEFAULT_LIST_LIMIT,
    DEFAULT_TRANSACTION_TIMEOUT_MS,
    OK,
    REFUSED,
    log_options,
    open_log,
    s3_settings,
)
from kafka_txn_sink.cli.render import Output, Payload, iso
from kafka_txn_sink.errors import StagingError
from kafka_txn_sink.files.vacuum import (
    VacuumPlan,
    check_retention,
    decided_files,
    plan_vacuum,
)
from kafka_txn_sink.files_options import PATH
from kafka_txn_sink.protocol.messages import now_ms
from kafka_txn_sink.storage import open_file_sink
from kafka_txn_sink.storage.files import FileSink, PendingUpload

if TYPE_CHECKING:
    from kafka_txn_sink.storage.s3 import S3FileSink

DEFAULT_RETENTION_HOURS = 24.0


def add_parser(commands: Any) -> None:
    """Register `vacuum` on the CLI's subcommands."""
    vacuum = commands.add_parser(
        "vacuum",
        parents=[log_options()],
        help="delete data files of decided batches that their decisions do not list, once older "
        "than the retention (dry run by default)",
    )
    vacuum.add_argument("--path", required=True, metavar="PATH", help=f"the sink's {PATH} option")
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


def cmd_vacuum(args: argparse.Namespace, out: Output) -> int:
    """`vacuum`: show (or with `--execute` delete) the unreferenced files past the retention."""
    retention_s = args.retention_hours * 3600
    now = args.now_ms if args.now_ms is not None else now_ms()
    check_retention(retention_s, args.transaction_timeout_ms)  # before touching anything
    commit_log, sink_id = open_log(args)
    sink = open_file_sink(args.path, s3_settings(args))
    # Listed before the log is read: a batch decided in between is seen with its files, and
    # one decided after the read is seen as undecided, so its files stay.
    stored = sink.list()
    s3_sink = _s3_sink(sink)
    pending = s3_sink.pending_uploads() if s3_sink is not None else []
    decided = decided_files(commit_log)
    referenced = decided.locations
    plan = plan_vacuum(
        decided,
        stored,
        sink.location,
        now_s=now / 1000,
        retention_s=retention_s,
        transaction_timeout_ms=args.transaction_timeout_ms,
        pending=pending,
    )
    payload = _vacuum_json(plan, sink_id, sink, args, now)
    if referenced and not plan.referenced and plan.delete:
        payload["warning"] = (
            f"none of the {len(referenced)} files the log references is under {sink.uri}: "
            f"is --path the sink's {PATH} option?"
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
    plan: VacuumPlan, sink_id: str, sink: FileSink, args: argparse.Namespace, now: int
) -> Payload:
    shown = plan.delete[: args.limit] if args.limit > 0 else plan.delete
    return {
        "sink_id": sink_id,
        "log": args.log,
        "path": sink.uri,
        "mode": "execute" if args.execute else "dry-run",
        "now_ms": now,
        "retention_hours": args.retention_hours,
        "kept": {
            "referenced": plan.referenced,
            "undecided": plan.undecided,
            "young": plan.young,
            "other": plan.other,
        },
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
            s3_sink = _s3_sink(sink)
            if s3_sink is not None:
                s3_sink.abort_upload(upload)
                aborted += 1
        except StagingError as exc:
            errors.append(str(exc))
    return {"ok": not errors, "deleted": deleted, "aborted": aborted, "errors": errors}


def _s3_sink(sink: FileSink) -> S3FileSink | None:
    """`sink` when it is on S3 (storage.s3, and boto3, loaded only then), else None."""
    if not sink.uri.startswith("s3://"):
        return None
    from kafka_txn_sink.storage.s3 import S3FileSink

    return sink if isinstance(sink, S3FileSink) else None


def _render_vacuum(payload: Payload, console: Console) -> None:
    delete, kept = payload["delete"], payload["kept"]
    verb = "deleted" if "result" in payload else "would delete"
    console.print(
        f"{escape(payload['path'])}: {verb} {delete['count']} unreferenced file(s), "
        f"{delete['bytes']} bytes, older than {payload['retention_hours']:g} h; kept "
        f"{kept['referenced']} referenced, {kept['undecided']} of batches not decided yet, "
        f"{kept['young']} younger, {kept['other']} other"
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
