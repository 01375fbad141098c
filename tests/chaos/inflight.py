"""The `inflight` fault (issue 24, defect 1): a decision PUT the driver gave up on lands later.

The trial's query talks to S3 through a proxy (tests/s3_proxy.py `SequencedProxy`) that holds
the PUTs of round 0 of the fresh batch's outcome key past the driver's deadlines (the suite's
S3 calls time out after 2 s, 3 attempts), so `commit()` raises
`DecisionInDoubtError` and Spark calls `abort()`. Once the query has ended, the held PUTs are
delivered in the trial's order; the next start of the query settles the batch. The round's
record must be the one delivered first (`decision-late`: abort()'s own, which was not held),
and the oracle must find every id once with no loss reported by the sink.

On the JSON log the PUT is `decisions/<batch>.json`, a decision or an abort record; on the
Delta log it is the commit of version N to `_delta_log/`, which names only the outcome key's
application transaction (`kafka_txn_sink/decisions`, version = the batch), the same for a
decision and an abort: there the two are told apart by their order of arrival (commit()'s
PUTs first, then abort()'s).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from typing import Any

from kafka_txn_sink.commit_log.delta_log import APP_IDS
from kafka_txn_sink.commit_log.delta_rows import DECISION
from tests.chaos.oracle import commit_log_of
from tests.chaos.query import EXIT_S, REACH_S, FaultNotFired, QuerySpec, Running, finish
from tests.chaos.schedule import Fault
from tests.chaos.state import Context
from tests.s3_proxy import SequencedProxy

HOLD_S = REACH_S + EXIT_S + 60.0  # a bound only: the trial delivers the held PUTs itself
LIFETIME_S = HOLD_S + 60.0  # the proxy stops by itself after this, whatever the suite does
DELIVER_S = 30.0  # for the S3 server's answer to each delivered PUT


def held_requests(log_format: str, batch: int, order: str) -> tuple[str, dict[str, bytes]]:
    """(path part, label -> body part) of the PUTs of round 0 of `batch`'s outcome key to
    hold: the decision's, and abort()'s too unless the order is `decision-late`."""
    if log_format == "delta":
        app = f'"appId":"{APP_IDS[DECISION]}","version":{batch}}}'.encode()
        return "/_delta_log/", {"outcome": app}
    bodies = {"decision": b'"kind":"decision"', "abort": b'"kind":"abort"'}
    if order == "decision-late":
        del bodies["abort"]
    return f"/decisions/{batch:020d}.json", bodies


@contextmanager
def through_proxy(
    context: Context, spec: QuerySpec, fault: Fault, batch: int
) -> Iterator[QuerySpec]:
    """`spec` with its S3 endpoint replaced by a proxy that holds the PUTs of `batch`'s
    outcome key (`context.proxy` while it runs); the proxy stops when the block ends."""
    path, bodies = held_requests(context.sink.log_format, batch, fault.order)
    proxy = SequencedProxy(context.bed.endpoint, path, bodies, HOLD_S, LIFETIME_S)
    with proxy:
        context.proxy = proxy
        try:
            yield replace(spec, options={**spec.options, "s3.endpoint": proxy.endpoint})
        finally:
            context.proxy = None


def strike_inflight(context: Context, running: Running, fault: Fault, batch: int) -> dict[str, Any]:
    """Wait until the decision's PUT is held and the query has ended (commit() in doubt,
    abort() done), then deliver the held PUTs in the fault's order and read the round."""
    proxy = context.proxy
    assert proxy is not None, "an inflight trial's query runs through a proxy"
    running.wait_for(lambda: bool(proxy.held), "the decision's PUT", REACH_S)
    ended = finish(running)
    delivered = proxy.deliver(reverse=fault.order == "abort-first", timeout_s=DELIVER_S)
    record = commit_log_of(context.bed, context.sink).outcome(batch, 0)
    running.notes.update(
        held=list(proxy.held),
        delivered=[f"{label} {status}" for label, status in delivered],
        round0=type(record).__name__.lower() if record is not None else None,
        expected_round0="decision" if fault.order == "decision-first" else "abort",
    )
    if len(delivered) < len(proxy.held) or any(status < 0 for _, status in delivered):
        raise FaultNotFired(f"held PUTs {proxy.held} were not all delivered: {delivered}")
    return ended


def inflight_anomalies(results: Iterable[dict[str, Any]]) -> list[str]:
    """Inflight trials whose batch's round 0 holds another record than the one that reached
    the S3 server first."""
    return [
        f"trial {r['index']} batch {r['batch']} ({r['order']}): round 0 holds {r['round0']}, "
        f"{r['expected_round0']} landed first"
        for r in results
        if r["kind"] == "inflight" and r["fired"] and r["round0"] != r["expected_round0"]
    ]
