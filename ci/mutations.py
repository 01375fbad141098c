"""Removes one protocol step at a time and reruns the kill-point tests, to show which step each
test depends on. Slow (one Spark run pair per cell); not part of CI.

    .venv/bin/python ci/mutations.py [--only R1,R3] [--tests before_decision,after_decision]

Each mutant is a copy of HEAD (committed code only) with the replacements applied; a cell reads
`fails` when the test caught the removal, `passes` when the step was not needed for it.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# name -> (what is removed, file, old text, new text)
MUTANTS: dict[str, tuple[str, str, str, str]] = {
    "R1": (
        "tasks skip a batch that is already decided",
        "kafka_txn_sink/protocol/prepare.py",
        "    if _decided(plan, task.batch_id):",
        "    if False:",
    ),
    "R2": (
        "streamWriter() rolls decided batches forward",
        "kafka_txn_sink/protocol/start.py",
        "    roll_forward(commit_log, session.settler)\n",
        "",
    ),
    "R3": (
        "commit() aborts prepared transactions its decision does not hold",
        "kafka_txn_sink/protocol/decide.py",
        "        if stray:\n",
        "        if False:\n",
    ),
    "R4": (
        "the clean-up at the end of commit()",
        "kafka_txn_sink/protocol/decide.py",
        "take_due():\n            self._clean_up()\n",
        "take_due():\n            pass\n",
    ),
    "R5": (
        "commit() rolls an already decided batch forward instead of deciding again",
        "kafka_txn_sink/protocol/decide.py",
        "        decision = self._log.decision(batch_id)\n        if decision is None:",
        "        decision = None\n        if decision is None:",
    ),
    "R6": (
        "the completion marker short-cut (EndTxns of completed batches are sent again)",
        "kafka_txn_sink/protocol/complete.py",
        "        if existing is not None:\n            return Settled(existing",
        "        if False:\n            return Settled(existing",
    ),
}

TESTS = ["before_decision", "after_decision", "after_first_endtxn", "after_completion"]


def mutant_tree(name: str, work: Path) -> Path:
    """HEAD's tree with every removal of `name` applied (`R1+R3` removes both)."""
    tree = work / name
    tree.mkdir(parents=True)
    archive = subprocess.run(
        ["git", "-C", str(ROOT), "archive", "HEAD"], capture_output=True, check=True
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(tree)], input=archive, check=True)
    for part in name.split("+"):
        _, path, old, new = MUTANTS[part]
        target = tree / path
        text = target.read_text()
        if text.count(old) != 1:
            raise SystemExit(f"{part}: the text to replace is not found exactly once in {path}")
        target.write_text(text.replace(old, new, 1))
    return tree


def describe(name: str) -> str:
    return " + ".join(MUTANTS[part][0] for part in name.split("+"))


def run_test(tree: Path, test: str) -> str:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    selector = f"test_query_killed_at_failpoint_then_restarted[driver.{test}]"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-x",
            "-p",
            "no:cacheprovider",
            f"tests/e2e/test_records_exactly_once.py::{selector}",
        ],
        cwd=tree,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    return "passes" if done.returncode == 0 else "fails"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default=",".join(MUTANTS))
    parser.add_argument("--tests", default=",".join(TESTS))
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as work:
        for name in args.only.split(","):
            tree = mutant_tree(name, Path(work))
            cells = {test: run_test(tree, test) for test in args.tests.split(",")}
            row = "  ".join(f"{t}={v}" for t, v in cells.items())
            print(f"{name} ({describe(name)}): {row}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
