"""Command line: explore one configuration and print the states, the result and, on a
violation, the shortest trace to it.

    python -m model.txn_model --variant current --drivers 2 --batches 2 --partitions 2
"""

from __future__ import annotations

import argparse
import sys

from model.txn_model.config import OFFSETS, REPAIR_FLAWS, TXN_IDS, Config, Variant
from model.txn_model.explore import Result, StateCapExceeded, explore


def parse(argv: list[str]) -> Config:
    """The configuration the arguments name."""
    parser = argparse.ArgumentParser(
        prog="python -m model.txn_model",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--variant", choices=[v.value for v in Variant], default="current")
    parser.add_argument("--batches", type=int, default=2)
    parser.add_argument("--partitions", type=int, default=2)
    parser.add_argument(
        "--drivers",
        type=int,
        default=2,
        help="runs that may start in all (first, restarts, a second driver)",
    )
    parser.add_argument(
        "--sequential",
        action="store_true",
        help="start a run only when every earlier run crashed or stopped",
    )
    parser.add_argument("--crashes", type=int, default=0)
    parser.add_argument("--timeouts", type=int, default=0)
    parser.add_argument("--late-attempts", type=int, default=0)
    parser.add_argument("--retries", type=int, default=0)
    parser.add_argument("--zombies", type=int, default=0)
    parser.add_argument("--slots", type=int, default=2, help="size of the slot pool (owned)")
    parser.add_argument(
        "--cleanup-reads-log-first",
        action="store_true",
        help="the clean-up reads the log before describing (the wrong order of owned rule 8)",
    )
    parser.add_argument(
        "--keyed-fixes",
        action="store_true",
        help="keyed with the changes README.md proposes (superseded runs stop for good)",
    )
    parser.add_argument(
        "--commit-without-start",
        action="store_true",
        help="keyed: the commit worker's streamWriter() does no start; commit() takes the "
        "planner's run from the messages (issue 43 item 3)",
    )
    parser.add_argument(
        "--late-writes",
        type=int,
        default=0,
        help="commit-log writes whose outcome is unknown to the writer (they may land later)",
    )
    parser.add_argument(
        "--outcome-register",
        action="store_true",
        help="keyed: abort() races commit() for the decision key; nothing aborted in doubt",
    )
    parser.add_argument(
        "--progress",
        action="store_true",
        help="require that some run finishes unless a driver crashed or a transaction timed out",
    )
    parser.add_argument(
        "--repair",
        action="store_true",
        help="keyed with the outcome register: a replay repairs the partitions recorded lost",
    )
    parser.add_argument(
        "--repair-flaw",
        choices=[f for f in REPAIR_FLAWS if f],
        default="",
        help="with --repair: a rejected repair design, to show its counterexample",
    )
    parser.add_argument(
        "--reorder",
        type=int,
        default=0,
        help="with --repair: task attempts (replays included) that produce their partition's "
        "rows in another order; a repair matches by digest (flaw ordered-digest: order counts)",
    )
    parser.add_argument(
        "--regroup",
        type=int,
        default=0,
        help="with --repair: replays that assign the batch's rows to tasks otherwise (renumbered, "
        "moved between tasks, all in one); a repair takes the replayed tasks left together for "
        "the lost participants left when their digests add up (flaws per-task-only, "
        "union-partial)",
    )
    parser.add_argument(
        "--offsets",
        choices=[o for o in OFFSETS if o],
        default="",
        help="with --repair: commit each batch's end offsets to a consumer group with a "
        "progress participant, by a fenced transaction after the completion (a group on another "
        "cluster), or by a rejected design (plain, first, blind)",
    )
    parser.add_argument(
        "--abort-leaves-progress",
        action="store_true",
        help="with --offsets participant: the product before review N8: abort() after a "
        "decision in doubt returns without ending the progress transaction",
    )
    parser.add_argument(
        "--txn-ids",
        choices=TXN_IDS,
        default="pool",
        help="owned/keyed: ids per slot and partition (pool), per attempt number too "
        "(attempt), or per batch and attempt (unique)",
    )
    parser.add_argument("--max-states", type=int, default=2_000_000)
    args = parser.parse_args(argv)
    keyed_register = args.variant == "keyed" and args.outcome_register
    if (args.repair or args.repair_flaw) and not keyed_register:
        parser.error("--repair needs --variant keyed --outcome-register")
    if args.offsets and not (args.repair or args.repair_flaw):
        parser.error("--offsets needs --repair")
    if args.reorder and not (args.repair or args.repair_flaw):
        parser.error("--reorder needs --repair (the order matters only to a repair's digest)")
    if args.regroup and not (args.repair or args.repair_flaw):
        parser.error("--regroup needs --repair")
    if args.regroup and args.partitions < 2:
        parser.error("--regroup needs --partitions 2 or more (one task has every row)")
    if args.regroup and args.offsets:
        parser.error("--regroup with --offsets is not modelled")
    if args.repair_flaw in ("per-task-only", "union-partial") and not args.regroup:
        parser.error(f"--repair-flaw {args.repair_flaw} needs --regroup")
    if args.abort_leaves_progress and args.offsets not in ("participant", "first"):
        parser.error("--abort-leaves-progress needs --offsets participant")
    if args.slots < 2:
        parser.error("--slots must be at least 2 (a new run never takes the owner's slot)")
    return Config(
        variant=Variant(args.variant),
        batches=args.batches,
        partitions=args.partitions,
        drivers=args.drivers,
        concurrent=not args.sequential,
        crashes=args.crashes,
        timeouts=args.timeouts,
        late_attempts=args.late_attempts,
        retries=args.retries,
        zombies=args.zombies,
        slots=args.slots,
        cleanup_reads_log_first=args.cleanup_reads_log_first,
        keyed_fixes=args.keyed_fixes,
        late_writes=args.late_writes,
        outcome_register=args.outcome_register,
        progress=args.progress,
        txn_ids=args.txn_ids,
        repair=args.repair or bool(args.repair_flaw),
        repair_flaw=args.repair_flaw,
        reorder=args.reorder,
        regroup=args.regroup,
        offsets=args.offsets,
        abort_leaves_progress=args.abort_leaves_progress,
        commit_without_start=args.commit_without_start,
        max_states=args.max_states,
    )


def report(result: Result) -> str:
    """The result as the CLI prints it."""
    lines = [
        result.config.describe(),
        f"states: {result.states}  final states: {result.final_states}  "
        f"time: {result.seconds:.1f} s",
        f"result: {'OK' if result.ok else 'VIOLATION: ' + str(result.violation)}",
    ]
    if result.ok:
        ended = ", ".join(f"{k} {v}" for k, v in sorted(result.stops.items()))
        lines.append(
            f"runs in final states: {ended or 'none'}; final states with an open "
            f"transaction: {result.final_with_open_txns}"
        )
        if result.config.repair:
            lines.append(f"final states finished after a repair: {result.finished_after_repair}")
        if result.config.offsets:
            lines.append(f"of them, the offsets repaired alone: {result.offsets_only_repairs}")
        if result.config.regroup:
            lines.append(
                f"of them, after replayed tasks taken together: {result.finished_after_union}; "
                f"with rows refused (no replayed transactions held exactly lost rows): "
                f"{result.finished_with_refused}"
            )
    else:
        lines.append("shortest trace:")
        lines += [f"  {i:2d}. {step}" for i, step in enumerate(result.trace, 1)]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Run the CLI; exit status 0 when OK, 1 on a violation, 2 when the state cap is hit."""
    config = parse(sys.argv[1:] if argv is None else argv)
    try:
        result = explore(config)
    except StateCapExceeded as exc:
        print(exc, file=sys.stderr)
        return 2
    print(report(result))
    return 0 if result.ok else 1


if __name__ == "__main__":
    sys.exit(main())
