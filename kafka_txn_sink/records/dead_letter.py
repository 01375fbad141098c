"""Option `badRows=deadLetter`: the record a row the sink cannot write becomes, in the dead-letter
topic, in the same transaction as the batch's other rows (docs/plans/dead_letter.md).

A row is set aside only for a fault found before anything of it was produced (an `InputError`
raised while its cells are turned into a record, or by the checks `judge` makes), never for an
answer of the brokers: a record they refuse makes the transaction abortable, and the batch fails
as it always did. The dead-letter record carries the row's key and value (as bytes where they
are bytes or strings, else as JSON), and headers: the fault's kind and message, digested, then
the row's position (`kts.sink`, `kts.batch`, `kts.task`, `kts.seq`), left out of the digest like
option provenanceHeaders' so a replay in another order still matches.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import date, datetime
from decimal import Decimal
from typing import Any

from kafka_txn_sink.errors import InputError
from kafka_txn_sink.protocol.output import Headers
from kafka_txn_sink.records.provenance import Provenance

KIND, MESSAGE = "kts.error.kind", "kts.error.message"
TRUNCATED = "kts.error.truncated"  # the value's size before it was cut to fit the topic
TRUNCATED_ROOM = 64  # bytes kept for that header
# The reasons that belong to a row: what it holds, found before anything of it was produced.
ROW_REASONS = frozenset(
    {"key_encoding", "value_encoding", "too_large", "topic", "partition", "header", "timestamp"}
)
# Every record is judged against this many bytes less than its topic's limit: librdkafka and
# the broker count a record's and its batch's framing too (a row that close to the limit is set
# aside though the broker might have taken it, never the reverse).
FRAMING_MARGIN = 512


@dataclass(frozen=True)
class DeadLetters:
    """Where one task sets its bad rows aside, and the limits it judges records by."""

    topic: str
    provenance: Provenance  # the task's: the position headers of each dead-letter record
    max_bytes: Mapping[str, int]  # topic -> the most bytes a record there may have

    def judge(
        self,
        topic: str,
        key: bytes | None,
        value: bytes | None,
        headers: Headers | None,
    ) -> None:
        """Refuse a record its topic would refuse for its size.

        Raises:
            InputError: reason `too_large`.
        """
        limit = self.max_bytes.get(topic)
        if limit is None:
            return
        size = len(key or b"") + len(value or b"")
        if headers:
            size += sum(len(name) + len(data or b"") for name, data in headers)
        if size > limit - FRAMING_MARGIN:
            raise InputError(
                f"a record of {size} bytes is over the {limit - FRAMING_MARGIN} bytes topic "
                f"{topic} takes (its max.message.bytes less {FRAMING_MARGIN} for framing)",
                reason="too_large",
            )

    def judge_all(
        self,
        topic: str,
        keys: Sequence[bytes | None] | None,
        values: Sequence[bytes | None],
    ) -> None:
        """`judge` for records with keys and values only, at once: by the longest key and the
        longest value (one C-level pass each), so a group without a large record costs little.

        Raises:
            InputError: reason `too_large`, when a record may be too large (the caller then
                judges the records one by one).
        """
        limit = self.max_bytes.get(topic)
        if limit is None:
            return
        longest = max(map(len, filter(None, values)), default=0)
        if keys is not None:
            longest += max(map(len, filter(None, keys)), default=0)
        if longest > limit - FRAMING_MARGIN:
            raise InputError(f"a record of topic {topic} may be too large", reason="too_large")

    def record(
        self, key: Any, value: Any, fault: InputError, ordinal: int
    ) -> tuple[bytes | None, bytes | None, Headers, Headers]:
        """The dead-letter record of the task's row number `ordinal` (from 0), whose key and
        value cells are `key` and `value`: its key, value, digested headers and position
        headers (a value too large for the dead-letter topic is cut to fit)."""
        headers: Headers = [(KIND, fault.reason.encode()), (MESSAGE, str(fault).encode())]
        where = self.provenance.headers(ordinal)
        raw_key, raw_value = _raw(key), _raw(value)
        limit = self.max_bytes.get(self.topic)
        if limit is not None and raw_value is not None:
            # A row set aside for its size would be too large for the dead-letter topic too:
            # its value is cut to fit, and a header keeps the size it had.
            others = len(raw_key or b"") + sum(len(n) + len(v or b"") for n, v in headers + where)
            room = limit - FRAMING_MARGIN - others - TRUNCATED_ROOM
            if len(raw_value) > room:
                headers.append((TRUNCATED, str(len(raw_value)).encode()))
                raw_value = raw_value[: max(0, room)]
        return raw_key, raw_value, headers, where


def _raw(cell: Any) -> bytes | None:
    """A cell as the dead-letter record keeps it: bytes as they are, a string as UTF-8, anything
    else as JSON."""
    if cell is None or isinstance(cell, bytes):
        return cell
    if isinstance(cell, (bytearray, memoryview)):
        return bytes(cell)
    if isinstance(cell, str):
        return cell.encode()
    return json.dumps(_jsonable(cell), separators=(",", ":"), sort_keys=True).encode()


def _jsonable(cell: Any) -> Any:
    """A cell of any Spark type as JSON values: rows and maps as objects, binary as base64,
    instants and decimals as their ISO or plain strings."""
    if hasattr(cell, "asDict"):
        return {k: _jsonable(v) for k, v in cell.asDict().items()}
    if isinstance(cell, Mapping):
        return {str(k): _jsonable(v) for k, v in cell.items()}
    if isinstance(cell, (list, tuple)):
        return [_jsonable(v) for v in cell]
    if isinstance(cell, (bytes, bytearray, memoryview)):
        return base64.b64encode(bytes(cell)).decode()
    if isinstance(cell, (datetime, date)):
        return cell.isoformat()
    if isinstance(cell, Decimal):
        return str(cell)
    if isinstance(cell, float) and cell != cell:
        return "NaN"
    return cell
