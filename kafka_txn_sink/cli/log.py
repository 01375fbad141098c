"""`kafka-txn-sink log list | show`: a sink's commit log, batch by batch.

kafka-txn-sink log list --log URI [--limit N]
kafka-txn-sink log show BATCH --log URI
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Mapping, Sequence
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from kafka_txn_sink.cli.common import (
    DEFAULT_LIST_LIMIT,
    OK,
    REFUSED,
    CliError,
    log_options,
    open_log,
)
from kafka_txn_sink.cli.render import Output, Payload, iso
from kafka_txn_sink.commit_log import CommitLog
from kafka_txn_sink.protocol.messages import Abort, Completion, Decision
from kafka_txn_sink.protocol.repair import batch_levels


def add_parser(commands: Any) -> None:
    """Register `log list` and `log show` on the CLI's subcommands."""
    log_parser = commands.add_parser("log", help="read the commit log")
    log_commands = log_parser.add_subparsers(dest="log_command", required=True, metavar="ACTION")
    listing = log_commands.add_parser(
        "list", parents=[log_options()], help="decided batches, newest last"
    )
    listing.add_argument(
        "--limit",
        type=int,
        default=DEFAULT_LIST_LIMIT,
        help=f"show the newest N batches (default {DEFAULT_LIST_LIMIT}; 0 shows all)",
    )
    listing.set_defaults(func=cmd_log_list)
    show = log_commands.add_parser(
        "show", parents=[log_options()], help="one batch's decision and completion"
    )
    show.add_argument("batch", type=int, metavar="BATCH")
    show.set_defaults(func=cmd_log_show)


# -- log list ----------------------------------------------------------------------------------


def batch_row(commit_log: CommitLog, batch_id: int) -> Payload:
    """One line of `log list`: what was decided, and whether it was completed."""
    decision = commit_log.decision(batch_id)
    if decision is None:
        raise CliError(f"batch {batch_id} has no decision in {commit_log.uri}", REFUSED)
    completion = commit_log.completion(batch_id)
    # Only a batch with a recorded loss can have repairs: others cost no further read.
    levels = batch_levels(commit_log, decision) if completion and completion.lost else None
    return {
        "batch": batch_id,
        "run": decision.run,
        "decided_at_ms": decision.decided_at_ms,
        "rows": decision.rows,
        "tasks": decision.tasks,
        "participants": len(decision.participants),
        "completed": completion is not None,
        "completed_at_ms": completion.completed_at_ms if completion else None,
        "lost_rows": sum(x.rows for x in [*levels.waiting(), *levels.refused()]) if levels else 0,
        "repaired_rows": levels.repaired_rows() if levels else 0,
    }


def batch_rows(commit_log: CommitLog, limit: int = 0) -> tuple[list[Payload], int]:
    """The newest `limit` batches (all when 0), oldest first, and how many are decided."""
    batches = commit_log.decided_batches()
    shown = batches[-limit:] if limit > 0 else batches
    return [batch_row(commit_log, b) for b in shown], len(batches)


def batches_table(rows: Sequence[Payload], title: str | None = None) -> Table:
    """The table of `log list` for rows from `batch_rows`."""
    table = Table(title=title, title_justify="left")
    names = ("batch", "run", "decided at", "rows", "participants", "completed", "lost rows")
    for name in (*names, "repaired rows"):
        table.add_column(name, justify="right" if name != "decided at" else "left")
    for row in rows:
        table.add_row(
            str(row["batch"]),
            str(row["run"]) if row["run"] is not None else "-",
            iso(row["decided_at_ms"]),
            str(row["rows"]),
            f"{row['participants']}/{row['tasks']}",
            "yes" if row["completed"] else "[bold red]no[/]",
            str(row["lost_rows"]) if row["lost_rows"] else "-",
            str(row.get("repaired_rows") or "-"),
        )
    return table


def cmd_log_list(args: argparse.Namespace, out: Output) -> int:
    """`log list`: the newest decided batches, and whether each was completed."""
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


# -- log show ----------------------------------------------------------------------------------


def cmd_log_show(args: argparse.Namespace, out: Output) -> int:
    """`log show BATCH`: one batch's decision, its participants and its completion."""
    commit_log, _ = open_log(args)
    decision, round_ = commit_log.settled(args.batch)
    aborted = [commit_log.outcome(args.batch, r) for r in range(round_)]
    if decision is None:
        closed = f"; round(s) 0-{round_ - 1} were aborted" if round_ else ""
        raise CliError(f"batch {args.batch} has no decision in {commit_log.uri}{closed}", REFUSED)
    completion = commit_log.completion(args.batch)
    levels = batch_levels(commit_log, decision)
    payload = {
        "log": commit_log.uri,
        "decision": _record_json(decision),
        "aborted_rounds": [_record_json(a) for a in aborted if a is not None],
        "completion": _record_json(completion) if completion else None,
        "repairs": [
            {"repair": _record_json(r), "completion": _record_json(c) if c else None}
            for r, c in zip(levels.levels[1:], levels.completions[1:], strict=True)
        ],
    }
    out.emit(payload, _render_log_show)
    return OK


def _record_json(record: Decision | Abort | Completion) -> Payload:
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
    summary.add_row("run", str(decision.get("run", "-")))
    summary.add_row("decided at", iso(decision["decided_at_ms"]))
    summary.add_row(
        "tasks / participants", f"{decision['tasks']} / {len(decision['participants'])}"
    )
    summary.add_row("rows", str(decision["rows"]))
    for used in decision.get("schemas", ()):
        summary.add_row(
            f"{used['column']} schema",
            f"{used['format']}, subject {used['subject']}, id {used['schema_id']}",
        )
    if payload["aborted_rounds"]:
        rounds = ", ".join(
            f"{a['round']} (run {a.get('run', '-')}, {iso(a['recorded_at_ms'])})"
            for a in payload["aborted_rounds"]
        )
        summary.add_row("aborted rounds before it", rounds)
    summary.add_row("completed at", iso(completion["completed_at_ms"]) if completion else "no")
    console.print(summary)
    console.print(_participants_table(decision["participants"], "participants"))
    if completion and completion["lost"]:
        console.print(_participants_table(completion["lost"], "[bold red]lost[/]"))
    for level in payload.get("repairs", ()):
        _render_repair(level["repair"], level["completion"], console)


def _render_repair(repair: Payload, completion: Payload | None, console: Console) -> None:
    done = f"completed at {iso(completion['completed_at_ms'])}" if completion else "not completed"
    console.print(
        f"repair {repair['level']} (run {repair.get('run', '-')}, "
        f"{iso(repair['decided_at_ms'])}, {done}): {len(repair['repaired'])} lost "
        f"transaction(s) written again, {len(repair['refused'])} refused"
    )
    console.print(_participants_table(repair["participants"], f"repair {repair['level']}"))
    if repair["refused"]:
        title = f"[bold red]refused by repair {repair['level']}: lost for good[/]"
        console.print(_participants_table(repair["refused"], title))
    if completion and completion["lost"]:
        console.print(_participants_table(completion["lost"], "[bold red]lost again[/]"))


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
