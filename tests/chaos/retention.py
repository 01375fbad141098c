"""The retention faults (issue 24, defects 2 and 3): what retention removes while the sink still
needs it.

- `gone`: the query is held after the first EndTxn(commit) of the fresh batch. The trial sends
  the rest of the batch's EndTxns itself (as if the driver's second round reached the brokers
  and its answers were lost), so every participant is committed; it then initialises one
  participant's transactional id again (an id that expired, or another attempt: the driver's
  next EndTxn for it fails), deletes its first record in every partition it wrote
  (`deleteRecords`, as retention would), and kills the query. The restarted query's EndTxn for
  that participant fails, and the fate probe must find the commit from the records that are
  left: nothing recorded lost, nothing republished. The deleted records are read first and
  kept (`removed/<batch>.json`), so the oracle still counts the rows they carried.
- `vacuum`: while the fresh batch is in flight (a task has uploaded its files; or every task
  has, and nothing is decided yet), `kafka-txn-sink vacuum --execute` runs with a clock two
  days ahead, so every unreferenced file is past the retention. Not one of the batch's files
  may be deleted; the oracle checks that every reference names a file that is there.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition
from confluent_kafka.admin import AdminClient

from kafka_txn_sink.kafka.producer import TaskTransaction
from kafka_txn_sink.kafka.producer_settings import producer_config
from kafka_txn_sink.kafka.txn_admin import ONGOING, TxnAdmin
from kafka_txn_sink.protocol.messages import Participant
from kafka_txn_sink.testing.topics import Seen
from tests.chaos import query
from tests.chaos.oracle import commit_log_of
from tests.chaos.query import REACH_S, FaultNotFired, Running, finish
from tests.chaos.removed import Removed, save_removed
from tests.chaos.schedule import Fault
from tests.chaos.state import Context

SETTLED_S = 60.0  # for the coordinators to write the commit markers of the batch
READ_S = 60.0  # to read back what deleteRecords will remove
LATER_MS = 48 * 3600 * 1000  # vacuum's clock: every file is two days old
KAFKA_S = 30.0


def strike_gone(context: Context, running: Running, fault: Fault, batch: int) -> dict[str, Any]:
    """Commit the rest of the batch behind the driver's back, fence one participant's id,
    delete its first records, kill the query; then restart it and read how it settled."""
    hit = running.wait_reached(fault.point, REACH_S)
    bootstrap = context.bed.bootstrap
    decision = commit_log_of(context.bed, context.sink).decision(batch)
    if decision is None or not decision.participants:
        raise FaultNotFired(f"batch {batch} was held after its first EndTxn, but has no decision")
    commit_behind_the_driver(bootstrap, decision.participants)
    victim = next((p for p in decision.participants if _spans_records(p)), None)
    if victim is None:
        raise FaultNotFired(f"no participant of batch {batch} wrote two records to a partition")
    fence(bootstrap, victim.transactional_id)
    cuts = {(t, int(p)): first + 1 for t, ranges in victim.offsets.items()
            for p, (first, _) in ranges.items()}  # fmt: skip
    removed = read_before(bootstrap, cuts)
    save_removed(context.sink, batch, removed)
    delete_before(bootstrap, cuts)
    running.kill()
    settled = finish(query.start(context.spec, running.directory / "settle"))
    completion = commit_log_of(context.bed, context.sink).completion(batch)
    return {
        "hit": hit,
        "fenced": victim.transactional_id,
        "cut": {f"{t}[{p}]": cut for (t, p), cut in sorted(cuts.items())},
        "removed_records": len(removed),
        "outcome": f"killed; restarted: {settled['outcome']}",
        "completed": completion is not None,
        "lost": sorted(p.partition for p in completion.lost) if completion else [],
        "republished": list(completion.republished) if completion else [],
    }


def strike_vacuum(context: Context, running: Running, fault: Fault, batch: int) -> dict[str, Any]:
    """Run `vacuum --execute` two days ahead while the batch is held in flight."""
    hit = running.wait_reached(fault.point, REACH_S)
    vacuumed = run_vacuum(context)
    running.release(fault.point)
    ended = finish(running)
    decision = commit_log_of(context.bed, context.sink).decision(batch)
    mine = {f.location for p in decision.participants for f in p.files} if decision else set()
    deleted = [name for name in vacuumed["deleted"] if any(loc.endswith("/" + name)
               for loc in mine)]  # fmt: skip
    return {
        "hit": hit,
        **ended,
        "vacuum_deleted": len(vacuumed["deleted"]),
        "vacuum_kept_undecided": vacuumed["kept_undecided"],
        "in_flight_files": len(mine),
        "in_flight_deleted": deleted,
    }


def retention_anomalies(results: Iterable[dict[str, Any]]) -> list[str]:
    """`gone` trials whose batch did not complete as committed, and `vacuum` trials that
    deleted a file of the batch in flight."""
    found = []
    for r in results:
        if not r["fired"]:
            continue
        if r["kind"] == "gone" and (not r["completed"] or r["lost"] or r["republished"]):
            found.append(
                f"trial {r['index']} batch {r['batch']}: completed {r['completed']}, lost "
                f"{r['lost']}, republished {r['republished']} ({r['outcome']})"
            )
        if r["kind"] == "vacuum" and r["in_flight_deleted"]:
            found.append(
                f"trial {r['index']} batch {r['batch']}: vacuum deleted files in flight "
                f"{r['in_flight_deleted'][:3]}"
            )
    return found


# -- gone ----------------------------------------------------------------------------------------


def _spans_records(participant: Participant) -> bool:
    """Whether some partition keeps a record of it once its first ones are deleted."""
    return any(last > first for ranges in participant.offsets.values()
               for first, last in ranges.values())  # fmt: skip


def commit_behind_the_driver(bootstrap: str, participants: Iterable[Participant]) -> None:
    """EndTxn(commit) for every participant (a repeat for the one the driver committed), and
    wait until the coordinators have written every marker."""
    triples = [p.triple for p in participants]
    with TxnAdmin(bootstrap, {}) as admin:
        failed = [r for r in admin.end_transactions(triples, True, KAFKA_S) if not r.ok]
        if failed:
            raise FaultNotFired(f"EndTxn(commit) behind the driver failed: {failed[0].error}")
        ids = [t.transactional_id for t in triples]
        deadline = time.monotonic() + SETTLED_S
        while any(s.state in (ONGOING, "PrepareCommit") for s in admin.describe(ids).values()):
            if time.monotonic() > deadline:
                raise FaultNotFired("the coordinators did not complete the commit in time")
            time.sleep(0.5)


def fence(bootstrap: str, transactional_id: str) -> None:
    """InitProducerId on the id, with the sink's own producer settings: the epoch the decision
    recorded is fenced."""
    txn = TaskTransaction(producer_config(bootstrap, {}, transactional_id, 60_000), KAFKA_S)
    txn.init()
    txn.detach()


def read_before(bootstrap: str, cuts: Mapping[tuple[str, int], int]) -> list[Removed]:
    """Every record below each cut, at read_uncommitted, marked by whether read_committed
    returns it too (every transaction below the cuts has ended)."""
    removed = []
    for (topic, partition), cut in sorted(cuts.items()):
        everything = _read_range(bootstrap, topic, partition, cut, "read_uncommitted")
        visible = {r.offset for r in _read_range(bootstrap, topic, partition, cut,
                                                 "read_committed")}  # fmt: skip
        removed += [Removed(topic, r, r.offset in visible) for r in everything]
    return removed


def _read_range(
    bootstrap: str, topic: str, partition: int, stop: int, isolation: str
) -> list[Seen]:
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"chaos-gone-{os.getpid()}",
            "isolation.level": isolation,
            "enable.auto.commit": False,
        }
    )
    found: list[Seen] = []
    try:
        where = TopicPartition(topic, partition, OFFSET_BEGINNING)
        consumer.assign([where])
        deadline = time.monotonic() + READ_S
        while consumer.position([where])[0].offset < stop:
            if time.monotonic() > deadline:
                raise FaultNotFired(f"{topic}[{partition}] not read up to {stop} in time")
            message = consumer.poll(0.5)
            if message is None or message.error():
                continue
            offset = message.offset()
            if offset is not None and offset < stop:
                found.append(Seen(message.key(), message.value(), partition, offset))
    finally:
        consumer.close()
    return found


def delete_before(bootstrap: str, cuts: Mapping[tuple[str, int], int]) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    wanted = [TopicPartition(t, p, cut) for (t, p), cut in sorted(cuts.items())]
    for future in admin.delete_records(wanted, request_timeout=KAFKA_S).values():
        future.result(timeout=KAFKA_S)


# -- vacuum --------------------------------------------------------------------------------------


def run_vacuum(context: Context) -> dict[str, Any]:
    """`kafka-txn-sink vacuum --execute` as an operator runs it, with the clock two days on."""
    bed, sink = context.bed, context.sink
    command = [sys.executable, "-m", "kafka_txn_sink", "--json", "vacuum", "--execute"]
    command += ["--log", sink.commit_log, "--log-format", sink.log_format, "--path", sink.files]
    command += ["--s3-endpoint", bed.endpoint, "--s3-region", "us-east-1", "--limit", "0"]
    command += ["--now-ms", str(int(time.time() * 1000) + LATER_MS)]
    env = {**os.environ, "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing"}
    done = subprocess.run(
        command, capture_output=True, text=True, timeout=300, env=env, cwd=Path(query.ROOT)
    )
    try:
        body = json.loads(done.stdout)
    except ValueError as exc:
        raise FaultNotFired(f"vacuum printed no JSON (exit {done.returncode}): "
                            f"{done.stderr[-400:]}") from exc  # fmt: skip
    if done.returncode != 0:
        raise FaultNotFired(f"vacuum failed (exit {done.returncode}): {json.dumps(body)[:400]}")
    return {
        "deleted": [f["name"] for f in body["delete"]["files"]],
        "kept_undecided": body["kept"]["undecided"],
    }
