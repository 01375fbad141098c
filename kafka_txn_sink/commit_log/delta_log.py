"""The commit log as a Delta table, written with delta-rs (`deltalake`), read by any Delta reader.

    SELECT batch_id, query_id, rows, size(participants) AS participants
    FROM delta.`s3://bucket/sinks/orders/_log` WHERE kind = 'decision' AND batch_id > 100

One row per record, partitioned by `kind`:

    column          type     sink          decision               completion
    kind            string   "sink"        "decision"             "completion"   (partition)
    batch_id        long     null          the batch              the batch
    sink_id         string   the sink      the sink               the sink
    query_id        string   null          Spark's query id       null
    recorded_at_ms  long     created at    decided at             completed at
    tasks           int      null          tasks of the batch     null
    rows            long     null          rows it commits        null
    participants    array<struct<partition int, attempt int, transactional_id string,
                    producer_id long, producer_epoch int, rows long>>           (decision)
    lost            array<struct<partition int, transactional_id string, producer_id long,
                    producer_epoch int, rows long, reason string>>              (completion)
    lost_rows       long     null          null                   rows lost
    format_version  int      the version of the record's format (messages.FORMAT_VERSION)
    record          string   the record's exact JSON (protocol/messages.py), as the JSON log stores

An owner and a release record (`run_records.Owner`, `run_records.Release`) have kind `owner` or
`release` and the run number in `batch_id`.

A republish record (files mode, `messages.Republish`) has kind `republish_<round>`, its batch id,
sink id, time and `record`; one kind per round keeps put-if-absent per (kind, batch id).

The log reads back only `record`: one source of truth, the same bytes as in the JSON log. The
other columns are for queries (offsets are in the JSON: `get_json_object(record, '$.output')`).

A record is written put-if-absent per (kind, batch id). Each commit carries a delta-rs application
transaction: one app id per kind (`APP_IDS`), version = the batch id (the highest one recorded, if
batches come out of order). Before it commits, the writer reads the batch's row on the snapshot it
commits against and compares: the app version ignores content, so it cannot tell "already done"
from "done differently". A writer of the same kind that commits after that snapshot makes our
commit fail (Delta's concurrent-transaction conflict on the app id); the writer then reads again
and compares, so exactly one record per batch lands. On S3, commit files are created with
`If-None-Match: *` (conditional put), so no lock service is needed.

There is no hint object: the highest completed batch, found from the completions' app version and
one pruned read, plays the JSON log's hint (batches complete in order: docs/protocol.md). Every
`compact_every` batches the table is compacted, vacuumed and checkpointed (`compact`).
"""

from __future__ import annotations

import functools
import json
import logging
import re
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal, TypeVar
from urllib.parse import unquote, urlparse

import pyarrow as pa
from deltalake import DeltaTable, QueryBuilder, write_deltalake
from deltalake import Schema as DeltaSchema
from deltalake.exceptions import CommitFailedError, DeltaError, TableNotFoundError
from deltalake.transaction import CommitProperties, Transaction

from kafka_txn_sink.commit_log.base import (
    CommitLogBase,
    Record,
    check_batch_id,
    parse_record,
    parser_of,
)
from kafka_txn_sink.commit_log.delta_rows import (
    COMPLETION,
    DECISION,
    OWNER,
    PARTITION_COLUMNS,
    RELEASE,
    SCHEMA,
    SINK,
    completion_kind,
    outcome_kind,
    repair_kind,
    republish_kind,
    row_of,
)
from kafka_txn_sink.errors import CommitLogError
from kafka_txn_sink.protocol.messages import Completion, Decision, Outcome, Republish, parse_outcome
from kafka_txn_sink.protocol.run_records import Owner, SinkMeta
from kafka_txn_sink.storage import LocalStorage, S3Settings, Storage, open_storage

log = logging.getLogger(__name__)

T = TypeVar("T")

# A condition on batch_id, such as (">", 41).
Condition = tuple[Literal["=", ">"], int]


APP_IDS = {
    SINK: "kafka_txn_sink/sink",
    DECISION: "kafka_txn_sink/decisions",
    COMPLETION: "kafka_txn_sink/completions",
    OWNER: "kafka_txn_sink/owners",
    RELEASE: "kafka_txn_sink/releases",
}

# Operators may change them with ALTER TABLE ... SET TBLPROPERTIES; the rows themselves are the
# permanent history, so the table keeps little of Delta's own.
TABLE_PROPERTIES = {
    # Opening the table reads the last checkpoint and the commits after it, one request each on
    # S3: every 100 commits made a fresh open ten times slower there than every 10.
    "delta.checkpointInterval": "10",
    # Commit files (two per batch) and checkpoints older than this go at the next checkpoint: an
    # hour of versions to travel back to, and a _delta_log that stops growing.
    "delta.logRetentionDuration": "interval 1 hours",
    # Files that compaction replaced stay this long for readers of older snapshots, then vacuum
    # deletes them; checkpoints carry their tombstones until then. The log's own readers hold a
    # snapshot for well under a second.
    "delta.deletedFileRetentionDuration": "interval 1 hours",
    # Statistics of batch_id prune every lookup; the other columns' would only fatten the log.
    "delta.dataSkippingStatsColumns": "batch_id,recorded_at_ms",
}

COMPACT_EVERY = 100
# Compaction rewrites only files below this size, so a long log is not rewritten again and again.
TARGET_FILE_BYTES = 8 * 1024 * 1024
# Rounds of read, compare and commit when other writers keep committing first.
_COMMIT_ATTEMPTS = 5
# Looks at a _delta_log folder without a table yet, waiting for a creator to finish.
_OPEN_ATTEMPTS = 3
_OPEN_BACKOFF_S = 0.1
_RELOAD_AFTER_COMMITS = 20

_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_BACKTRACE_LINE = re.compile(r"^\d+: ")


class DeltaCommitLog(CommitLogBase):
    """The `CommitLog` as rows of a Delta table at a local path or an S3 prefix."""

    def __init__(
        self,
        location: str,
        s3: S3Settings | None = None,
        *,
        recent: int = 20,
        compact_every: int = COMPACT_EVERY,
        table_properties: Mapping[str, str] = TABLE_PROPERTIES,
    ) -> None:
        self._s3 = s3 or S3Settings()
        self._uri, self._table_uri, on_s3 = _locate(location)
        self._options = storage_options(self._s3) if on_s3 else None
        self.recent = recent
        # Compact after every this many completed batches; 0 never compacts.
        self.compact_every = compact_every
        self._properties = dict(table_properties)
        self._table: DeltaTable | None = None
        self._loaded_version = -1

    def __repr__(self) -> str:
        return f"DeltaCommitLog({self.uri!r})"

    @property
    def uri(self) -> str:
        """The location as the JSON log names it (`file:///…` or `s3://bucket/prefix`)."""
        return self._uri

    # -- the CommitLog protocol --------------------------------------------------------------

    def sink_meta(self) -> SinkMeta | None:
        """The claim in the `sink` row, or None (also when there is no table yet)."""
        table = self._current()
        return None if table is None else self._sink_meta(table)

    def outcome(self, batch_id: int, round_: int) -> Outcome | None:
        """The decision or abort row at round `round_` of `batch_id`, or None."""
        table = self._current()
        kind = outcome_kind(round_)
        found = None if table is None else self._record(table, kind, batch_id)
        return None if found is None else self._parse(kind, batch_id, found, parse_outcome)

    def completion(self, batch_id: int, level: int = 0) -> Completion | None:
        """The completion marker of `batch_id`'s decision (or of its repair `level`), or None."""
        table = self._current()
        kind = completion_kind(level)
        found = None if table is None else self._record(table, kind, batch_id)
        return None if found is None else self._parse(kind, batch_id, found, Completion.from_json)

    def repair(self, batch_id: int, level: int) -> Decision | None:
        """The repair of `batch_id` at `level`, or None."""
        table = self._current()
        kind = repair_kind(level)
        found = None if table is None else self._record(table, kind, batch_id)
        return None if found is None else self._parse(kind, batch_id, found, Decision.from_json)

    def republish(self, batch_id: int, round_: int) -> Republish | None:
        """Round `round_` of `batch_id`'s republishing, or None."""
        table = self._current()
        kind = republish_kind(round_)
        found = None if table is None else self._record(table, kind, batch_id)
        return None if found is None else self._parse(kind, batch_id, found, Republish.from_json)

    def _outcome_batches(self, after: int | None) -> list[int]:
        table = self._current()
        if table is None:
            return []
        if after is not None and after < 0:
            after = None
        return self._batch_ids(table, DECISION, above=after)

    def decisions(self, after: int | None = None) -> list[Decision]:
        """The decision of every decided batch above `after`, read in one query (a batch whose
        round 0 is an abort record is looked up round by round)."""
        table = self._current()
        if table is None:
            return []
        where: list[Condition] = [] if after is None or after < 0 else [(">", after)]
        found = []
        for batch_id, record in sorted(self._rows(table, DECISION, where).items()):
            assert batch_id is not None
            outcome = self._parse(DECISION, batch_id, record, parse_outcome)
            decision = outcome if isinstance(outcome, Decision) else self.decision(batch_id)
            if decision is not None:
                found.append(decision)
        return found

    def latest_decision(self) -> Decision | None:
        """The decision of the highest batch id the decisions' app version points at (or of the
        highest decided one below it, when that batch holds only abort records)."""
        table = self._current()
        latest = None if table is None else self._highest(table, DECISION)
        if table is None or latest is None:
            return None
        found = self.decision(latest)
        return found or self._highest_decision(self._batch_ids(table, DECISION))

    def incomplete_batches(self) -> list[int]:
        """Decided batches above the highest completed one, ascending."""
        table = self._current()
        if table is None:
            return []
        return self.decided_batches(after=self._highest(table, COMPLETION))

    def write_hint(self, batch_id: int) -> None:
        """Nothing to write: the table's metadata finds the highest completed batch cheaply."""

    def owners(self) -> list[Owner]:
        """Every owner row, by run number ascending."""
        table = self._current()
        if table is None:
            return []
        rows = self._rows(table, OWNER, [])
        runs = sorted(r for r in rows if r is not None)
        return [self._parse(OWNER, r, rows[r], Owner.from_json) for r in runs]

    def latest_run(self) -> int | None:
        """The highest run number with an owner row, or None."""
        table = self._current()
        return None if table is None else self._highest(table, OWNER)

    def latest_owner(self) -> Owner | None:
        """The owner row of the highest run number, or None."""
        table = self._current()
        latest = None if table is None else self._highest(table, OWNER)
        if table is None or latest is None:
            return None
        found = self._record(table, OWNER, latest)
        return None if found is None else self._parse(OWNER, latest, found, Owner.from_json)

    def released_runs(self) -> set[int]:
        """The run numbers with a release row (their batch ids only are read)."""
        table = self._current()
        return set() if table is None else set(self._batch_ids(table, RELEASE))

    # -- what CommitLogBase builds on -------------------------------------------------------

    def _put(self, record: Record) -> Record | None:
        kind, batch_id, row = row_of(record)
        existing = self._put_if_absent(kind, batch_id, row)
        if existing is not None:
            return self._parse(kind, batch_id, existing, parser_of(record))
        if isinstance(record, Completion) and self._compaction_due(record.batch_id):
            self._compact_quietly()
        return None

    def _recent_decisions(self) -> list[Decision]:
        table = self._current()
        latest = None if table is None else self._highest(table, DECISION)
        return [] if latest is None else self.decisions(after=latest - self.recent)

    # -- compaction ------------------------------------------------------------------------

    def compact(self) -> dict[str, Any]:
        """Merge small files, delete the ones readers no longer need, checkpoint the log.

        Returns the numbers of files compaction added and removed, and how many vacuum deleted.
        """
        table = self._current()
        if table is None:
            return {}
        try:
            metrics = table.optimize.compact(target_size=TARGET_FILE_BYTES)
            # Retention: the table's delta.deletedFileRetentionDuration.
            deleted = table.vacuum(dry_run=False)
            table.create_checkpoint()
            table.cleanup_metadata()
        except (DeltaError, OSError) as exc:
            raise self._error("cannot compact", exc) from exc
        return {
            "files_added": metrics.get("numFilesAdded", 0),
            "files_removed": metrics.get("numFilesRemoved", 0),
            "files_vacuumed": len(deleted),
        }

    def _compaction_due(self, completed_batch: int) -> bool:
        return self.compact_every > 0 and (completed_batch + 1) % self.compact_every == 0

    def _compact_quietly(self) -> None:
        # The batch is recorded already; a failed compaction only leaves more files to read.
        try:
            log.info("compacted the commit log %s: %s", self.uri, self.compact())
        except Exception as exc:
            log.warning("could not compact the commit log %s: %s", self.uri, exc)

    # -- writing -----------------------------------------------------------------------------

    def _put_if_absent(self, kind: str, batch_id: int | None, row: pa.Table) -> str | None:
        """Append `row` unless (kind, batch_id) has a row; the existing record if it has one."""
        if batch_id is not None:
            check_batch_id(batch_id)
        app_id, wanted = _app_id(kind), batch_id or 0
        failure: Exception | None = None
        for _ in range(_COMMIT_ATTEMPTS):
            table = self._current()
            if table is None:
                table = self._create()
            # The app version ignores content (and a row added by hand has none): read the row.
            existing = self._record(table, kind, batch_id)
            if existing is not None:
                return existing
            recorded = table.transaction_version(app_id)
            app = Transaction(app_id, max(wanted, recorded if recorded is not None else -1))
            try:
                write_deltalake(
                    table,
                    row,
                    mode="append",
                    commit_properties=CommitProperties(app_transactions=[app]),
                )
                return None
            except CommitFailedError as exc:
                # Another writer of this kind committed since our snapshot: look again.
                failure = exc
            except (DeltaError, OSError) as exc:
                raise self._error(f"cannot write the {kind} of batch {batch_id}", exc) from exc
        raise CommitLogError(
            f"cannot write the {kind} of batch {batch_id} to {self.uri}: other writers committed "
            f"first {_COMMIT_ATTEMPTS} times in a row ({_clean(failure)}); nothing was written"
        )

    def _create(self) -> DeltaTable:
        """An empty log table; if another process creates it first, theirs."""
        try:
            DeltaTable.create(
                self._table_uri,
                SCHEMA,
                mode="error",
                partition_by=PARTITION_COLUMNS,
                name="kafka_txn_sink commit log",
                configuration=self._properties,
                storage_options=self._options,
            )
        except (DeltaError, OSError) as exc:
            table = self._current()
            if table is None:
                raise self._error("cannot create the commit log table", exc) from exc
            return table
        table = self._current()
        if table is None:
            raise CommitLogError(f"the commit log table created at {self.uri} cannot be read")
        return table

    # -- reading -----------------------------------------------------------------------------

    def _current(self) -> DeltaTable | None:
        """The table at its latest version, or None if there is no table (yet)."""
        try:
            table = self._table
            if table is not None:
                table.update_incremental()
                # Queries on a snapshot slow down with every commit it has followed; a fresh
                # load starts again from the latest checkpoint.
                if table.version() - self._loaded_version < _RELOAD_AFTER_COMMITS:
                    return table
            self._table = self._open()
        except (DeltaError, OSError) as exc:
            raise self._error("cannot read", exc) from exc
        if self._table is not None:
            self._loaded_version = self._table.version()
        return self._table

    def _open(self) -> DeltaTable | None:
        for attempt in range(_OPEN_ATTEMPTS):
            try:
                table = DeltaTable(self._table_uri, storage_options=self._options)
            except TableNotFoundError:
                if not self._storage.list("_delta_log/"):
                    self._check_no_json_log()
                    return None
                # Files but no table: another process may be creating it this very moment.
                time.sleep(_OPEN_BACKOFF_S * 2**attempt)
                continue
            self._check_schema(table)
            return table
        raise CommitLogError(
            f"{self.uri}/_delta_log holds files, but no readable Delta table: it is not a "
            "kafka_txn_sink commit log, or it is damaged; it is left as it is: inspect it, "
            "or choose another commitLog location"
        )

    def _check_no_json_log(self) -> None:
        if self._storage.exists("_sink.json"):
            raise CommitLogError(
                f"{self.uri} holds a JSON commit log (_sink.json): set commitLogFormat=json, or "
                "choose another commitLog location"
            )

    def _check_schema(self, table: DeltaTable) -> None:
        expected, found = _column_types(DeltaSchema.from_arrow(SCHEMA)), _column_types(table)
        differ = sorted(name for name, kind in expected.items() if found.get(name) != kind)
        partitions = table.metadata().partition_columns
        if differ or partitions != PARTITION_COLUMNS:
            raise CommitLogError(
                f"{self.uri} is a Delta table, but not a kafka_txn_sink commit log (columns "
                f"missing or of another type: {', '.join(differ) or 'none'}; partitioned by "
                f"{partitions}, expected {PARTITION_COLUMNS}); it is left as it is: choose "
                "another commitLog location"
            )

    @functools.cached_property
    def _storage(self) -> Storage:
        # Only for looking around a location that holds no table; built on demand, as the S3
        # client is slow to make.
        return open_storage(self.uri, self._s3)

    def _sink_meta(self, table: DeltaTable) -> SinkMeta | None:
        found = self._record(table, SINK, None)
        return None if found is None else self._parse(SINK, None, found, SinkMeta.from_json)

    def _highest(self, table: DeltaTable, kind: str) -> int | None:
        """The highest batch id with a row of `kind`, from the app version and a pruned read."""
        recorded = table.transaction_version(APP_IDS[kind])
        above = None if recorded is None else recorded - 1
        batch_ids = self._batch_ids(table, kind, above=above)
        if not batch_ids and above is not None:
            # Rows at the app version were deleted by hand: look at all of them.
            batch_ids = self._batch_ids(table, kind)
        return batch_ids[-1] if batch_ids else None

    def _record(self, table: DeltaTable, kind: str, batch_id: int | None) -> str | None:
        if batch_id is not None:
            check_batch_id(batch_id)
        where: list[Condition] = [] if batch_id is None else [("=", batch_id)]
        return self._rows(table, kind, where).get(batch_id)

    def _batch_ids(
        self, table: DeltaTable, kind: str, above: int | None = None, equal: int | None = None
    ) -> list[int]:
        where: list[Condition] = []
        if above is not None:
            where.append((">", above))
        if equal is not None:
            check_batch_id(equal)
            where.append(("=", equal))
        found = self._read(table, kind, where, "batch_id")
        return sorted({b for b in found.column("batch_id").to_pylist() if b is not None})

    def _rows(
        self, table: DeltaTable, kind: str, where: Sequence[Condition]
    ) -> dict[int | None, str]:
        """Batch id -> record of the rows of `kind` that match; refuses two different records."""
        found = self._read(table, kind, where, "batch_id, record")
        rows: dict[int | None, str] = {}
        for batch_id, record in zip(
            found.column("batch_id").to_pylist(), found.column("record").to_pylist(), strict=True
        ):
            if record is None or rows.setdefault(batch_id, record) != record:
                raise CommitLogError(
                    f"{self.uri} holds {'an empty' if record is None else 'a second, different'} "
                    f"{kind} row for batch {batch_id}; it was not written by kafka_txn_sink's "
                    "put-if-absent and is left as it is: inspect the table and repair it by hand"
                )
        return rows

    def _read(
        self, table: DeltaTable, kind: str, where: Sequence[Condition], columns: str
    ) -> pa.Table:
        # DataFusion prunes by the kind partition and by the files' batch_id statistics, so a
        # lookup of one batch opens about one file (pyarrow's dataset would visit every file).
        sql = f"SELECT {columns} FROM log WHERE kind = '{kind}'"
        sql += "".join(f" AND batch_id {op} {int(value)}" for op, value in where)
        try:
            return pa.table(QueryBuilder().register("log", table).execute(sql).read_all())
        except (DeltaError, OSError, pa.ArrowException) as exc:
            raise self._error(f"cannot read the {kind} rows", exc) from exc

    def _parse(
        self, kind: str, batch_id: int | None, record: str, parse: Callable[[bytes], T]
    ) -> T:
        where = f"{self.uri} ({kind} of batch {batch_id})" if batch_id is not None else self.uri
        found = parse_record(where, record.encode(), parse)
        found_batch = getattr(found, "batch_id", getattr(found, "run", batch_id))
        if found_batch != batch_id:
            raise CommitLogError(f"{where} holds the {kind} of batch {found_batch}")
        return found

    def _error(self, action: str, exc: BaseException) -> CommitLogError:
        message = f"{action} commit log table {self.uri}: {_clean(exc)}"
        secret = self._s3.secret_access_key
        return CommitLogError(message.replace(secret, "***") if secret else message)


def storage_options(s3: S3Settings) -> dict[str, str]:
    """S3Settings as delta-rs (object_store) options, with the same deadlines as the JSON log."""
    options = {
        # Commits are created with If-None-Match: *, so concurrent writers need no lock service.
        "conditional_put": "etag",
        "connect_timeout": _duration(s3.connect_timeout_s),
        "timeout": _duration(s3.read_timeout_s),
        "max_retries": str(s3.max_attempts - 1),
        "retry_timeout": _duration(s3.max_attempts * (s3.connect_timeout_s + s3.read_timeout_s)),
        "AWS_VIRTUAL_HOSTED_STYLE_REQUEST": "false" if s3.use_path_style else "true",
    }
    if s3.endpoint_url:
        options["AWS_ENDPOINT_URL"] = s3.endpoint_url
        if s3.endpoint_url.lower().startswith("http://"):
            options["AWS_ALLOW_HTTP"] = "true"
    if s3.region:
        options["AWS_REGION"] = s3.region
    if s3.access_key_id and s3.secret_access_key:
        options["AWS_ACCESS_KEY_ID"] = s3.access_key_id
        options["AWS_SECRET_ACCESS_KEY"] = s3.secret_access_key
    return options


def _locate(location: str) -> tuple[str, str, bool]:
    """(uri as the JSON log names it, uri for delta-rs, on S3) of `s3://…`, `file://…` or a path."""
    parsed = urlparse(location)
    if parsed.scheme.lower() != "s3":
        local = open_storage(location)  # refuses other schemes; a local one does no I/O
        assert isinstance(local, LocalStorage)
        return local.uri, str(local.root), False
    if not parsed.netloc or parsed.query or parsed.fragment:
        raise CommitLogError(f"invalid S3 commit log location {location!r}: use s3://bucket/prefix")
    prefix = unquote(parsed.path).strip("/")
    uri = f"s3://{parsed.netloc}/{prefix}" if prefix else f"s3://{parsed.netloc}"
    return uri, uri, True


def _app_id(kind: str) -> str:
    return APP_IDS.get(kind) or f"kafka_txn_sink/{kind}"


def _column_types(schema_of: DeltaTable | DeltaSchema) -> dict[str, Any]:
    schema = schema_of.schema() if isinstance(schema_of, DeltaTable) else schema_of
    return {field["name"]: field["type"] for field in json.loads(schema.to_json())["fields"]}


def _duration(seconds: float) -> str:
    return f"{max(1, round(seconds * 1000))}ms"


def _clean(exc: BaseException | None) -> str:
    """delta-rs errors carry colour codes and backtraces: keep their first meaningful lines."""
    lines = [" ".join(line.split()) for line in _ANSI.sub("", str(exc)).splitlines()]
    kept = [line.lstrip("↳ ") for line in lines if line and not _BACKTRACE_LINE.match(line)]
    return " ".join(kept[:6])[:600] or type(exc).__name__
