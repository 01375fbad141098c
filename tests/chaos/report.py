"""The suite's tables: faults by kind and point, anomalies, runtime."""

from __future__ import annotations

import statistics
from collections import Counter, defaultdict
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.table import Table

if TYPE_CHECKING:
    from tests.chaos.suite import Outcome


def print_report(outcome: Outcome, console: Console) -> None:
    console.print(faults_table(outcome))
    console.print(anomalies_table(outcome))
    console.print(summary_table(outcome))


def faults_table(outcome: Outcome) -> Table:
    planned = Counter(row_of(f.to_json()) for f in outcome.schedule)
    done: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
    for result in outcome.all_results:
        done[row_of(result)].append(result)
    table = Table(title=f"faults (seed {outcome.seed})")
    columns = ("kind", "failpoint", "planned", "done", "struck", "query afterwards", "retried")
    for column in (*columns, "s/trial"):
        table.add_column(column, justify="left" if column in ("kind", "failpoint") else "right")
    for kind, point in sorted(planned):
        results = done.get((kind, point), [])
        struck = sum(1 for r in results if r["fired"])
        table.add_row(
            kind,
            point,
            str(planned[(kind, point)]),
            str(len(results)),
            str(struck) if struck == len(results) else f"[red]{struck}[/red]",
            outcomes(results),
            retried(results) if kind in RETRYING else "",
            f"{statistics.mean(r['seconds'] for r in results):.0f}" if results else "",
        )
    return table


def row_of(fault: dict[str, Any]) -> tuple[str, str]:
    """(kind, where) of a fault's row: an inflight trial's order says where its PUT went."""
    if fault["kind"] == "inflight":
        return fault["kind"], f"{fault['point']} {fault['order']}"
    return fault["kind"], fault["point"]


RETRYING = ("worker", "s3")  # faults after which a task may run again: counted per trial


def retried(results: list[dict[str, Any]]) -> str:
    """E.g. `3/5`: of the trials whose batch was decided, those decided with a task's retry."""
    known = [r["task_retried"] for r in results if r.get("task_retried") is not None]
    return f"{sum(known)}/{len(known)}" if known else ""


def outcomes(results: list[dict[str, Any]]) -> str:
    """E.g. `killed 12` or `drained 3, failed 1`: how the query ended after each fault."""
    kinds = Counter(str(r.get("outcome", "did not strike")).split(":")[0] for r in results)
    return ", ".join(f"{name} {n}" for name, n in sorted(kinds.items()))


def anomalies_table(outcome: Outcome) -> Table:
    report = outcome.report
    table = Table(
        title=f"oracle: {report.input_ids} input ids, {report.decided_batches} decided batches"
    )
    table.add_column("anomaly")
    table.add_column("count", justify="right")
    table.add_column("examples")
    for name, items in report.anomalies().items():
        count = f"[red]{len(items)}[/red]" if items else "0"
        table.add_row(name, count, ", ".join(items[:3]))
    table.add_row("orphan files (failed attempts; expected)", str(report.orphan_files), "")
    table.add_row(
        "batches held beyond the bound on purpose, repaired by the replay",
        str(len(report.excused_batches)),
        ", ".join(map(str, report.excused_batches)),
    )
    return table


def failed_starts(results: list[dict[str, Any]]) -> str:
    """E.g. `2 (TransactionLostError 2)`: the first start of a trial failed, the second ran."""
    errors = Counter(e.split(":")[0] for r in results for e in r.get("failed_starts", []))
    detail = ", ".join(f"{name} {n}" for name, n in sorted(errors.items()))
    return f"{sum(errors.values())}" + (f" ({detail})" if detail else "")


def summary_table(outcome: Outcome) -> Table:
    results = outcome.all_results
    seconds = [r["seconds"] for r in results]
    table = Table(title="run", show_header=False)
    table.add_column("what")
    table.add_column("value")
    table.add_row("seed", str(outcome.seed))
    table.add_row("trials done / planned", f"{len(results)} / {len(outcome.schedule)}")
    table.add_row("trials in this run", str(len(outcome.ran)))
    table.add_row("faults that did not strike", str(sum(1 for r in results if not r["fired"])))
    table.add_row("query starts that failed (then started again)", failed_starts(results))
    if seconds:
        table.add_row(
            "seconds per trial",
            f"mean {statistics.mean(seconds):.0f}, median {statistics.median(seconds):.0f}, "
            f"max {max(seconds):.0f}",
        )
        estimate = statistics.mean(seconds) * len(outcome.schedule) / 60
        table.add_row(f"estimate for {len(outcome.schedule)} trials", f"{estimate:.0f} min")
    table.add_row("final drain", ", ".join(outcome.drain["runs"]))
    verified = outcome.verified
    table.add_row(
        "kafka-txn-sink verify",
        f"exit {verified.get('exit')}, anomalies {verified.get('anomalies') or 'none'}",
    )
    table.add_row("this run took", f"{outcome.seconds / 60:.1f} min")
    verdict = "[green]exactly once[/green]" if outcome.ok else "[red]NOT OK[/red]"
    table.add_row("verdict", verdict)
    return table
