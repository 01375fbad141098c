"""Ids for the verifier: read from Kafka records and Avro rows, held compactly, compared exactly.

Ten million ids as Python `bytes` in a `Counter` would take well over 2 GiB, so ids live in
pyarrow binary arrays, spread over hash buckets as they are read: comparing bucket by bucket
keeps the hash tables of `value_counts`/`index_in` small, whatever the number of ids.

The comparison counts every id on both sides and never sums across ids, so a lost id and a
duplicated one never cancel out.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from kafka_txn_sink.errors import ConfigError, InputError

BUCKETS = 64  # a power of two
_EMPTY = pa.array([], pa.binary())


# -- where ids come from -------------------------------------------------------------------


def id_bytes(value: Any) -> bytes | None:
    """One id as bytes: text as UTF-8, bytes as they are, numbers and booleans as JSON text
    (so the key `b"42"` and the JSON or Avro number 42 are the same id); None stays None."""
    if value is None:
        return None
    if isinstance(value, bytes):
        return value
    if isinstance(value, str):
        return value.encode()
    return json.dumps(value, sort_keys=True, separators=(",", ":"), default=str).encode()


@dataclass(frozen=True)
class IdSource:
    """How to find the id of a Kafka record: its key, or a (dotted) field of its value, which
    is JSON, or in a Schema Registry's wire format (`decode`: the registry's decoder)."""

    field: tuple[str, ...] = ()  # empty: the record key
    decode: Callable[[bytes], Any] | None = None  # None: the value is JSON

    @classmethod
    def parse(
        cls, text: str, option: str, decode: Callable[[bytes], Any] | None = None
    ) -> IdSource:
        """`key`, `json:FIELD` or `registry:FIELD` (`json:a.b` for a nested field); the
        registry's values are read with `decode`.

        Raises:
            ConfigError: anything else, or `registry:` without `decode`; the message names
                `option`.
        """
        if text == "key":
            return cls()
        kind, sep, path = text.partition(":")
        parts = tuple(path.split("."))
        if kind not in ("json", "registry") or not sep or not all(parts):
            raise ConfigError(f"{option} must be key, json:FIELD or registry:FIELD, got {text!r}")
        if kind == "registry" and decode is None:
            raise ConfigError(f"{option}={text} needs --schema-registry-url")
        return cls(parts, decode if kind == "registry" else None)

    def __str__(self) -> str:
        if not self.field:
            return "key"
        return ("registry:" if self.decode else "json:") + ".".join(self.field)

    def of(self, key: bytes | None, value: bytes | None) -> bytes | None:
        """The id of one record; None when it has none (null key, a value that does not
        decode, no such field)."""
        if not self.field:
            return key
        if value is None:
            return None
        try:
            found: Any = self.decode(value) if self.decode else json.loads(value)
        except (ValueError, RecursionError, InputError, EOFError):
            return None
        for name in self.field:
            if not isinstance(found, dict):
                return None
            found = found.get(name)
        return id_bytes(found)


# -- holding them --------------------------------------------------------------------------


class IdStore:
    """A multiset of ids (bytes) in `BUCKETS` hash buckets of pyarrow binary arrays.

    Buckets use Python's `hash`, which is stable within one process: compare only stores
    filled by the same process.
    """

    def __init__(self) -> None:
        self._chunks: list[list[pa.Array]] = [[] for _ in range(BUCKETS)]
        self.count = 0

    def extend(self, ids: Sequence[bytes]) -> None:
        """Add a chunk of ids: one arrow array, sorted by bucket, sliced (no copy) per bucket."""
        if not ids:
            return
        buckets = np.fromiter((hash(i) for i in ids), np.int64, len(ids)) & (BUCKETS - 1)
        order = np.argsort(buckets, kind="stable")
        grouped = pa.array(ids, pa.binary()).take(pa.array(order))
        sizes = np.bincount(buckets, minlength=BUCKETS).tolist()
        start = 0
        for index, size in enumerate(sizes):
            if size:
                self._chunks[index].append(grouped.slice(start, size))
                start += size
        self.count += len(ids)

    def bucket(self, index: int) -> pa.ChunkedArray:
        """Every id of bucket `index` (with repeats), without copying them together."""
        return pa.chunked_array(self._chunks[index], pa.binary())


# -- comparing them ------------------------------------------------------------------------


@dataclass
class IdDiff:
    """Input ids against output ids, each counted.

    `lost`: seen fewer times than it went in. `duplicated`: seen more than once and more often
    than it went in (with the times seen). `unexpected`: seen, never went in.
    """

    expected: int = 0
    seen: int = 0
    lost: pa.Array = field(default_factory=lambda: _EMPTY)
    duplicated: pa.Array = field(default_factory=lambda: _EMPTY)
    duplicated_counts: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    unexpected: pa.Array = field(default_factory=lambda: _EMPTY)

    @property
    def exact(self) -> bool:
        """Nothing lost, duplicated or unexpected."""
        return not (len(self.lost) or len(self.duplicated) or len(self.unexpected))


def compare(expected: IdStore, seen: IdStore) -> IdDiff:
    """Every id of `expected` and `seen`, bucket by bucket; results sorted by id."""
    lost: list[pa.Array] = []
    duplicated: list[pa.Array] = []
    counts: list[np.ndarray] = []
    unexpected: list[pa.Array] = []
    for index in range(BUCKETS):
        part = _compare_bucket(expected.bucket(index), seen.bucket(index))
        lost.append(part[0])
        duplicated.append(part[1])
        counts.append(part[2])
        unexpected.append(part[3])
    dup_ids = pa.concat_arrays(duplicated)
    order = pc.sort_indices(dup_ids).to_numpy()
    return IdDiff(
        expected=expected.count,
        seen=seen.count,
        lost=_sorted(pa.concat_arrays(lost)),
        duplicated=dup_ids.take(pa.array(order, pa.int64())),
        duplicated_counts=np.concatenate(counts)[order],
        unexpected=_sorted(pa.concat_arrays(unexpected)),
    )


def _compare_bucket(
    wanted_ids: pa.ChunkedArray, seen_ids: pa.ChunkedArray
) -> tuple[pa.Array, pa.Array, np.ndarray, pa.Array]:
    wanted = pc.value_counts(wanted_ids)
    got = pc.value_counts(seen_ids)
    w_values, w_counts = wanted.field(0), wanted.field(1).to_numpy()
    g_values, g_counts = got.field(0), got.field(1).to_numpy()
    where = pc.index_in(w_values, value_set=g_values)
    present = where.is_valid().to_numpy(zero_copy_only=False)
    hits = where.drop_null().to_numpy().astype(np.int64)
    got_for_wanted = np.zeros(len(w_values), np.int64)
    got_for_wanted[present] = g_counts[hits]
    in_input = np.zeros(len(g_values), bool)
    in_input[hits] = True
    lost = _mask(w_values, got_for_wanted < w_counts)
    # A duplicate of an input id: seen more often than it went in, and more than once.
    dup_wanted = got_for_wanted > np.maximum(w_counts, 1)
    # A duplicate of an id that never went in is unexpected and duplicated, both.
    dup_other = (~in_input) & (g_counts > 1)
    duplicated = pa.concat_arrays([_mask(w_values, dup_wanted), _mask(g_values, dup_other)])
    dup_counts = np.concatenate([got_for_wanted[dup_wanted], g_counts[dup_other]])
    return lost, duplicated, dup_counts, _mask(g_values, ~in_input)


def _mask(values: pa.Array, mask: np.ndarray) -> pa.Array:
    return values.filter(pa.array(mask, pa.bool_())) if len(values) else _EMPTY


def _sorted(values: pa.Array) -> pa.Array:
    return values.take(pc.sort_indices(values)) if len(values) else _EMPTY


def as_text(ident: bytes) -> str:
    """An id for people and JSON: UTF-8, with undecodable bytes escaped."""
    return ident.decode("utf-8", "backslashreplace")


def texts(ids: pa.Array, limit: int | None = None) -> Iterator[str]:
    """The ids of a binary array as text, the first `limit` of them (all when None)."""
    shown = ids if limit is None else ids.slice(0, limit)
    for chunk_start in range(0, len(shown), 65536):
        for raw in shown.slice(chunk_start, 65536).to_pylist():
            yield as_text(raw)
