"""`kafka-txn-sink status | recover`: a sink's transactions on the brokers, and settling them.

    kafka-txn-sink status --log URI --bootstrap HOST:PORT [--sink-id ID]
    kafka-txn-sink recover --log URI --bootstrap HOST:PORT [--sink-id ID] [--execute [--force]]
        [--path PATH --references-topic R [--schema-inline-max-bytes N]]

Which transactions the sink holds, and which of the rest a run may still decide ("live"), is
answered by kafka_txn_sink.protocol.recover (`sink_holdings`), from each transaction's own
timeout and the commit log's owner records; batches are completed and transactions aborted by
the protocol's `Settler`. This module shows the answer; `recover --execute` leaves live
transactions alone unless `--force` says the query is stopped.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from kafka_txn_sink import extras
from kafka_txn_sink.cli.common import (
    DEFAULT_TRANSACTION_TIMEOUT_MS,
    OK,
    REFUSED,
    CliError,
    brokers,
    kafka_options,
    kafka_settings,
    log_options,
    open_log,
    s3_settings,
    sink_id_of,
)
from kafka_txn_sink.cli.render import Output, Payload, age_s, iso
from kafka_txn_sink.commit_log import CommitLog
from kafka_txn_sink.errors import KafkaTxnSinkError, TransactionCompletionError
from kafka_txn_sink.files_options import (
    DEFAULT_SCHEMA_INLINE_MAX_BYTES,
    PATH,
    REFERENCES_TOPIC,
    SCHEMA_INLINE_MAX_BYTES,
)
from kafka_txn_sink.kafka.admin_api import TransactionAdmin, TxnState
from kafka_txn_sink.kafka.cluster import Cluster
from kafka_txn_sink.protocol.complete import Settler
from kafka_txn_sink.protocol.messages import Decision, Triple, now_ms
from kafka_txn_sink.protocol.recover import (
    DEFAULT_CLOCK_SKEW_MS,
    Holdings,
    incomplete_decisions,
    sink_holdings,
)
from kafka_txn_sink.protocol.repair import batch_levels
from kafka_txn_sink.protocol.stuck import HeldBack, decision_partitions, held_back

if TYPE_CHECKING:
    from kafka_txn_sink.files.republish import Republisher

END_TXN_DEADLINE_S = 30.0


def add_parsers(commands: Any) -> None:
    """Register `status` and `recover` on the CLI's subcommands."""
    status = commands.add_parser(
        "status",
        parents=[log_options(), kafka_options()],
        help="decided, completed and incomplete batches; this sink's open transactions",
    )
    status.set_defaults(func=cmd_status)

    recover = commands.add_parser(
        "recover",
        parents=[log_options(), kafka_options()],
        help="roll decided batches forward and abort undecided transactions no run can still "
        "decide (dry run by default)",
    )
    recover.add_argument("--execute", action="store_true", help="do it (default: only show)")
    recover.add_argument(
        "--force",
        action="store_true",
        help="also abort live transactions (of a run that may still decide them): only for a "
        "query known to be stopped",
    )
    recover.add_argument(
        "--transaction-timeout-ms",
        type=int,
        default=DEFAULT_TRANSACTION_TIMEOUT_MS,
        help="files mode: the transaction timeout of republished references (default "
        f"{DEFAULT_TRANSACTION_TIMEOUT_MS}); liveness is judged by each transaction's own "
        "timeout, not this",
    )
    recover.add_argument(
        "--clock-skew-ms",
        type=int,
        default=DEFAULT_CLOCK_SKEW_MS,
        help="a transaction counts as timed out this long after its own timeout passed, as the "
        f"brokers' clocks may differ from this one (default {DEFAULT_CLOCK_SKEW_MS})",
    )
    recover.add_argument(
        "--path", metavar="PATH", help=f"files mode: the sink's {PATH} option (to republish)"
    )
    recover.add_argument(
        "--references-topic",
        metavar="TOPIC",
        help=f"files mode: the sink's {REFERENCES_TOPIC} option; with --path, file references "
        "of decided transactions the broker aborted are published again",
    )
    recover.add_argument(
        "--schema-inline-max-bytes",
        type=int,
        default=DEFAULT_SCHEMA_INLINE_MAX_BYTES,
        metavar="N",
        help=f"files mode: the sink's {SCHEMA_INLINE_MAX_BYTES} option, for republished "
        f"references (default {DEFAULT_SCHEMA_INLINE_MAX_BYTES})",
    )
    recover.set_defaults(func=cmd_recover)


# -- status ------------------------------------------------------------------------------------


def cmd_status(args: argparse.Namespace, out: Output) -> int:
    """`status`: the last decided and completed batches, and the sink's open transactions."""
    commit_log, log_sink_id = open_log(args)
    sink_id = sink_id_of(args, log_sink_id)
    with brokers(args) as txn_admin:
        latest = commit_log.latest_decision()
        incomplete = [d.batch_id for d in incomplete_decisions(commit_log)]
        now = now_ms()
        holdings = sink_holdings(sink_id, commit_log, txn_admin)
    held, held_error = _held_back(args, holdings.open, decision_partitions(latest))
    payload = {
        "sink_id": sink_id,
        "log": commit_log.uri,
        "bootstrap": args.bootstrap,
        "last_decided": _decided_json(latest, now),
        "last_completed": last_completed(commit_log, latest, incomplete),
        "incomplete": incomplete,
        "last_batch_repairs": _repairs_json(commit_log, latest),
        "open_transactions": [_open_json(t, holdings, now) for t in holdings.open],
        "held_back": [_held_json(h, now) for h in held if h.behind],
        "held_back_error": held_error,
    }
    out.emit(payload, _render_status)
    return OK


def last_completed(
    commit_log: CommitLog, latest: Decision | None, incomplete: list[int]
) -> int | None:
    """The newest batch with a completion marker, given the newest decision and the incomplete."""
    if latest is None:
        return None
    if latest.batch_id not in incomplete:
        return latest.batch_id
    # Rare: the newest batch is incomplete, so look through the whole log.
    done = [b for b in commit_log.decided_batches() if b not in set(incomplete)]
    return done[-1] if done else None


def _repairs_json(commit_log: CommitLog, latest: Decision | None) -> Payload | None:
    """The last decided batch's repairs (protocol/repair.py) and the rows still lost."""
    if latest is None:
        return None
    levels = batch_levels(commit_log, latest)
    return {
        "repairs": len(levels.levels) - 1,
        "repaired_rows": levels.repaired_rows(),
        "waiting_rows": sum(x.rows for x in levels.waiting()),
        "refused_rows": sum(x.rows for x in levels.refused()),
    }


def _decided_json(latest: Decision | None, now: int) -> Payload | None:
    if latest is None:
        return None
    return {
        "batch": latest.batch_id,
        "decided_at_ms": latest.decided_at_ms,
        "age_s": age_s(latest.decided_at_ms, now),
    }


def _txn_json(state: TxnState, held: Mapping[Triple, int], now: int) -> Payload:
    return {
        "transactional_id": state.transactional_id,
        "producer_id": state.producer_id,
        "producer_epoch": state.producer_epoch,
        "started_at_ms": state.start_ms,
        "age_s": age_s(state.start_ms, now),
        "timeout_ms": state.timeout_ms,
        "held_by_batch": held.get(state.triple),
        "partitions": [f"{topic}-{partition}" for topic, partition in state.partitions],
    }


def _held_back(
    args: argparse.Namespace, open_: Sequence[TxnState], also: Sequence[tuple[str, int]]
) -> tuple[list[HeldBack], str | None]:
    """The partitions the open transactions hold back; when their ends cannot be read (a
    leader down, a topic deleted, no Describe), none and why: status still shows the rest."""
    try:
        cluster = Cluster(args.bootstrap, kafka_settings(args), args.timeout_ms)
        return held_back(open_, cluster, also), None
    except KafkaTxnSinkError as exc:
        return [], str(exc)


def _held_json(held: HeldBack, now: int) -> Payload:
    """A partition whose read_committed consumers an open transaction of the sink holds back."""
    return {
        "topic": held.topic,
        "partition": held.partition,
        "high_watermark": held.high_watermark,
        "last_stable_offset": held.last_stable,
        "behind": held.behind,
        "since_ms": held.since_ms,
        "age_s": age_s(held.since_ms, now) if held.since_ms is not None else None,
        "transactional_ids": list(held.transactional_ids),
    }


def _open_json(state: TxnState, holdings: Holdings, now: int) -> Payload:
    """An open transaction as status shows it: held by a batch, or live or abortable, and why."""
    row = _txn_json(state, holdings.held, now)
    undecided = state.triple not in holdings.held
    live = undecided and state.triple not in holdings.abortable
    why = holdings.why.get(state.triple)
    row["live"] = why if live else None
    row["abortable"] = why if undecided and not live else None
    return row


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
    repairs = payload.get("last_batch_repairs")
    if repairs and (repairs["repairs"] or repairs["waiting_rows"]):
        summary.add_row(
            "last batch's repairs",
            f"{repairs['repairs']} ({repairs['repaired_rows']} rows written again; "
            f"{repairs['waiting_rows']} rows wait for a replay; {repairs['refused_rows']} rows "
            "refused, lost)",
        )
    summary.add_row("open transactions", str(len(payload["open_transactions"])))
    console.print(summary)
    if payload["open_transactions"]:
        _print_transactions(console, payload["open_transactions"], "open transactions")
    if payload["held_back"]:
        console.print(_held_table(payload["held_back"]))
    if payload["held_back_error"]:
        console.print(f"partitions held back: not read ({escape(payload['held_back_error'])})")


def _held_table(rows: Sequence[Payload]) -> Table:
    title = "partitions held back (read_committed consumers stop at the last stable offset)"
    table = Table(title=title, title_justify="left")
    for name in ("partition", "high watermark", "last stable", "behind", "since", "by"):
        table.add_column(name)
    for row in rows:
        table.add_row(
            f"{row['topic']}-{row['partition']}",
            str(row["high_watermark"]),
            str(row["last_stable_offset"]),
            str(row["behind"]),
            f"{iso(row['since_ms'])} ({row['age_s']} s ago)",
            ", ".join(row["transactional_ids"]),
        )
    return table


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


def _print_transactions(console: Console, rows: Sequence[Payload], title: str) -> None:
    """The table, then why each undecided transaction is live or may be aborted."""
    console.print(_transactions_table(rows, title))
    for row in rows:
        live, why = row.get("live"), row.get("why") or row.get("abortable")
        if live:
            console.print(f"  {row['transactional_id']}: live, {escape(live)}")
        elif why:
            console.print(f"  {row['transactional_id']}: {escape(why)}")


# -- recover -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Plan:
    """What `recover` would do: batches to roll forward, transactions to abort, and the live
    ones it leaves alone unless `--force` (with why, for each transaction)."""

    roll_forward: list[Decision]
    abort: list[TxnState]
    live: list[TxnState]
    why: Mapping[Triple, str]

    @property
    def alive_because(self) -> str | None:
        """Why the query may still be running (its first live transaction), or None."""
        if not self.live:
            return None
        first = self.live[0]
        more = f" (and {len(self.live) - 1} more)" if len(self.live) > 1 else ""
        return f"transaction {first.transactional_id}{more} is live: {self.why[first.triple]}"


def plan_recovery(
    commit_log: CommitLog, txn_admin: TransactionAdmin, sink_id: str, clock_skew_ms: int
) -> Plan:
    """Roll forward every incomplete decision and the latest batch's repairs without their
    completion; abort every open transaction nothing holds and no run can still decide; list
    the live rest."""
    holdings = sink_holdings(sink_id, commit_log, txn_admin, clock_skew_ms=clock_skew_ms)
    latest = commit_log.latest_decision()
    repairs = [] if latest is None else batch_levels(commit_log, latest).unsettled()
    forward = [*incomplete_decisions(commit_log), *(r for r in repairs if r.level)]
    return Plan(forward, holdings.stale(), holdings.live(), holdings.why)


def cmd_recover(args: argparse.Namespace, out: Output) -> int:
    """`recover`: show (or with `--execute` do) the roll-forward and the aborts; live
    transactions are aborted only with `--force`."""
    commit_log, log_sink_id = open_log(args)
    sink_id = sink_id_of(args, log_sink_id)
    republisher = _republisher(args, sink_id)
    with brokers(args) as txn_admin:
        now = now_ms()
        plan = plan_recovery(commit_log, txn_admin, sink_id, args.clock_skew_ms)
        payload = _plan_json(plan, sink_id, args, now)
        if not args.execute:
            out.emit(payload, _render_recover)
            return OK
        cluster = Cluster(args.bootstrap, kafka_settings(args), args.timeout_ms)
        settler = Settler(sink_id, commit_log, txn_admin, cluster, END_TXN_DEADLINE_S, republisher)
        aborting = [*plan.abort, *plan.live] if args.force else plan.abort
        payload["result"] = execute(plan, aborting, sink_id, commit_log, txn_admin, settler)
    out.emit(payload, _render_recover)
    settled = payload["result"]["ok"] and (args.force or not plan.live)
    return OK if settled else REFUSED


def _republisher(args: argparse.Namespace, sink_id: str) -> Republisher | None:
    """Files mode's republisher from `--path` and `--references-topic`; None without them.

    Raises:
        CliError: only one of the two is given.
        MissingExtraError: files mode's extra is not installed.
    """
    if not (args.path and args.references_topic):
        if args.path or args.references_topic:
            raise CliError("--path and --references-topic go together (files mode)")
        return None
    extras.require("--path (files mode)", "files")
    from kafka_txn_sink.files.republish import Republisher  # fastavro: files mode only

    return Republisher(
        sink_id=sink_id,
        bootstrap_servers=args.bootstrap,
        kafka=kafka_settings(args),
        transaction_timeout_ms=args.transaction_timeout_ms,
        client_timeout_s=args.timeout_ms / 1000,
        references_topic=args.references_topic,
        path=args.path,
        s3=s3_settings(args),
        inline_max_bytes=args.schema_inline_max_bytes,
    )


def execute(
    plan: Plan,
    aborting: Sequence[TxnState],
    sink_id: str,
    commit_log: CommitLog,
    txn_admin: TransactionAdmin,
    settler: Settler,
) -> Payload:
    """Roll forward in batch order, then abort those of `aborting` that are still undecided;
    report every step."""
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
    triples = _still_stale(aborting, sink_holdings(sink_id, commit_log, txn_admin))
    aborted = [{"transaction": str(r.triple), "error": r.error} for r in settler.abort(triples)]
    ok = all(r["error"] is None for r in aborted)
    return {"ok": ok, "completed": completed, "aborted": aborted, "error": None}


def _still_stale(planned: Sequence[TxnState], now: Holdings) -> list[Triple]:
    # Asked again just before aborting: a participant decided meanwhile must never be aborted.
    return [t.triple for t in planned if t.triple not in now.held]


def _plan_json(plan: Plan, sink_id: str, args: argparse.Namespace, now: int) -> Payload:
    return {
        "sink_id": sink_id,
        "log": args.log,
        "mode": "execute" if args.execute else "dry-run",
        "alive_because": plan.alive_because,
        "forced": bool(args.force),
        "roll_forward": [
            {
                "batch": d.batch_id,
                "level": d.level,
                "rows": d.rows,
                "participants": [str(p.triple) for p in d.participants],
            }
            for d in plan.roll_forward
        ],
        "abort": [_txn_json(t, {}, now) | {"why": plan.why.get(t.triple)} for t in plan.abort],
        "live": [_txn_json(t, {}, now) | {"why": plan.why.get(t.triple)} for t in plan.live],
    }


def _render_recover(payload: Payload, console: Console) -> None:
    result = payload.get("result")
    verb = "rolled forward" if result else "would roll forward"
    if payload["roll_forward"]:
        table = Table(title=f"{verb} (decided, not completed)", title_justify="left")
        for name in ("batch", "rows", "participants"):
            table.add_column(name)
        for row in payload["roll_forward"]:
            batch = f"{row['batch']} (repair {row['level']})" if row.get("level") else row["batch"]
            table.add_row(str(batch), str(row["rows"]), "\n".join(row["participants"]))
        console.print(table)
    else:
        console.print("nothing to roll forward: every decided batch is complete")
    verb = "aborted" if result else "would abort"
    if payload["abort"]:
        title = f"{verb} (open, in no decision, no run can still decide them)"
        _print_transactions(console, payload["abort"], title)
    else:
        console.print("nothing to abort: no open transaction of the sink no run can still decide")
    if payload["live"]:
        verb = "aborted (--force)" if result and payload["forced"] else "left alone"
        title = f"live, {verb} (open, undecided, a run may still decide them)"
        _print_transactions(console, payload["live"], title)
    _render_outcome(payload, console)


def _render_outcome(payload: Payload, console: Console) -> None:
    result = payload.get("result")
    alive = payload["alive_because"]
    if result is None:
        note = f" (the query may still be running: {escape(alive)})" if alive else ""
        console.print(f"dry run: nothing changed; --execute does it{note}")
        return
    for batch in result["completed"]:
        if batch["lost_rows"]:
            console.print(
                f"[bold red]batch {batch['batch']} lost {batch['lost_rows']} rows[/]: the "
                f"broker had aborted a participant; the query's next run replays the batch "
                f"and writes them again (repair); see `log show {batch['batch']}`"
            )
    if not result["ok"]:
        failed = [a for a in result["aborted"] if a["error"]]
        reason = result["error"] or f"{len(failed)} abort(s) failed: {failed}"
        console.print(f"[bold red]not settled[/]: {reason}")
    elif alive and not payload["forced"]:
        console.print(
            f"[bold yellow]not settled[/]: {escape(alive)}. Left alone; wait for the query, "
            "or stop it and pass --force if it is dead"
        )
    else:
        console.print("[bold green]done[/]")
