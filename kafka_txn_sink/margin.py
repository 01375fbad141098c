"""The commit margin: the longest the driver may take from its prepare check to its last EndTxn.

The prepare check (protocol/decide.py) decides a batch only if every participant has at least
the margin left before the brokers' transaction timeout aborts it; the start of every batch
(protocol/start.py) refuses a transaction timeout that does not exceed it, since no batch could
ever pass. So the margin must bound every step of the driver between the two, each by the
deadline the code gives it. `commit_path` lists them; `SinkOptions.margin_ms` sums them.

The unit of the commit log is one request, bounded by commitLogTimeoutMs: the S3 client's
deadlines are derived from it (options.py: 3 attempts of connect + read, each a sixth of it),
and delta-rs gets the same retry timeout per request. A Delta write round is counted as one such
request, though it reads the table before it commits: a round that needs more is a residual.

No heavy imports here: options.py, which every task loads, uses this module. The retry counts
below mirror the modules that make the requests (tests/unit/test_margin.py keeps them equal).
"""

from __future__ import annotations

from dataclasses import dataclass

S3_CONFLICT_RETRIES = 5
"""storage/s3.py `_CONFLICT_RETRIES`: a conditional PUT answered 409 is sent again this often."""

S3_CONFLICT_BACKOFF_MS = 50
"""storage/s3.py `_CONFLICT_BACKOFF_S`: the base of its backoff, doubled per retry, times at
most 1.5 (its jitter)."""

DELTA_COMMIT_ATTEMPTS = 5
"""commit_log/delta_log.py `_COMMIT_ATTEMPTS`: rounds of read, compare and commit of a record."""

END_TXN_ROUNDS = 2
"""protocol/complete.py `_commit_all`: the first participant, then the rest, each round with a
deadline of commitTimeoutMs."""


@dataclass(frozen=True)
class Step:
    """One step of the path from the prepare check to the last EndTxn, and its bound."""

    what: str
    bound_ms: int


def commit_path(
    commit_log_timeout_ms: int,
    commit_timeout_ms: int,
    clock_skew_ms: int,
    log_format: str,
    *,
    progress: bool = False,
) -> tuple[Step, ...]:
    """Every step between the prepare check's reading of its clock and the last EndTxn(commit)
    of a batch this driver decides, with its bound (L = commitLogTimeoutMs, C =
    commitTimeoutMs):

    1. the driver's clock may be behind the brokers' (whose clock starts a transaction's
       timeout): clockSkewMs;
    2. the owner check just before the decision (`runs.check_current`: one listing or lookup of
       the owner records): L;
    3. the decision's put-if-absent write: on the JSON log's S3 storage up to
       1 + S3_CONFLICT_RETRIES conditional PUTs (409: a concurrent write in flight) with their
       backoff, then one GET when the key exists (412); on the Delta log up to
       DELTA_COMMIT_ATTEMPTS rounds: L each (local storage is counted as S3);
    4. the completion check before phase 2 (`Settler.complete` reads the completion marker): L;
    5. the EndTxn rounds (END_TXN_ROUNDS, each with a deadline of C): the last EndTxn(commit) is
       sent within the last round;
    6. with `progress` (option consumerGroup, protocol/progress.py): the wait for the rows'
       commit markers (C), then the progress transaction's own EndTxn round (C). Only the
       progress transaction needs them, but one margin serves every participant.

    Not on the path: the DescribeTransactions of the check itself (its clock is read after the
    answer); the abort of stray transactions (only beside a decision found in the log, whose
    own driver checked it); the fate probe, republishing (a fresh transaction with its own
    timeout), the completion marker and the clean-up, which all follow the last EndTxn.
    """
    writes = _decision_write(commit_log_timeout_ms, log_format)
    return (
        Step("clock skew (clockSkewMs)", clock_skew_ms),
        Step("owner check: 1 commit-log request", commit_log_timeout_ms),
        writes,
        Step("completion check: 1 commit-log request", commit_log_timeout_ms),
        Step(
            f"{END_TXN_ROUNDS} EndTxn rounds of commitTimeoutMs",
            END_TXN_ROUNDS * commit_timeout_ms,
        ),
        *(
            (
                Step(
                    "consumerGroup: the markers' wait and the progress EndTxn, commitTimeoutMs "
                    "each",
                    2 * commit_timeout_ms,
                ),
            )
            if progress
            else ()
        ),
    )


def explain(steps: tuple[Step, ...]) -> str:
    """The steps as messages show them: `what bound ms + ...`."""
    return " + ".join(f"{step.what} {step.bound_ms} ms" for step in steps)


def _decision_write(commit_log_timeout_ms: int, log_format: str) -> Step:
    if log_format == "delta":
        return Step(
            f"decision write: up to {DELTA_COMMIT_ATTEMPTS} Delta rounds of commitLogTimeoutMs",
            DELTA_COMMIT_ATTEMPTS * commit_log_timeout_ms,
        )
    puts = 1 + S3_CONFLICT_RETRIES
    # 50 ms x (1 + 2 + ... + 2^(retries-1)) x 1.5, rounded up.
    backoff_ms = -(-S3_CONFLICT_BACKOFF_MS * (2**S3_CONFLICT_RETRIES - 1) * 3 // 2)
    return Step(
        f"decision write: up to {puts} conditional PUTs and 1 GET of commitLogTimeoutMs, "
        f"and {backoff_ms} ms of backoff",
        (puts + 1) * commit_log_timeout_ms + backoff_ms,
    )
