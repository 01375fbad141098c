"""A digest of the records one task produced: what tells a replay of a batch from other rows.

A repair (protocol/repair.py) writes again the rows of a decided transaction the brokers
aborted; it takes a replayed task's transaction for that only when the replay produced the same
records. Spark's Kafka source does not keep a batch's partition indexes on a replay, so the
driver matches by records, not by index: by this digest.

`DigestingTransaction` sits between records mode and the task's transaction and folds every
record into CRC-32 streams: values, keys, their lengths (-1 for null), topics run-length
encoded, partitions and headers. Each stream is a concatenation, so the digest does not depend
on how the rows were grouped into calls (`send` or `send_many`, row or Arrow writer), only on
the records and their order. It is a checksum, not a cryptographic hash: it tells a replay from
other rows, not a forgery. File references (files mode) are produced past it.
"""

from __future__ import annotations

import sys
import zlib
from array import array
from collections.abc import Sequence

import pyarrow as pa
import pyarrow.compute as pc

from kafka_txn_sink.protocol.output import Headers, Transaction


class DigestingTransaction:
    """A `Transaction` that digests every record it passes on to `txn`."""

    def __init__(self, txn: Transaction):
        self._txn = txn
        self._count = 0
        self._crc = [0] * 6  # values, value lengths, keys, key lengths, topics, the rest
        self._topic: str | None = None
        self._run = 0  # records in a row sent to `_topic`, not yet folded
        # Cells of records sent one by one, folded a group at a time (the digest is the same).
        self._values: list[bytes | None] = []
        self._keys: list[bytes | None] = []

    def send(
        self,
        topic: str,
        value: bytes | None,
        key: bytes | None = None,
        partition: int | None = None,
        headers: Headers | None = None,
    ) -> None:
        """Produce one record into the transaction, and digest it."""
        self._txn.send(topic, value, key, partition, headers)
        self._count_topic(topic, 1)
        self._values.append(value)
        self._keys.append(key)
        if partition is not None or headers:
            rest = repr((self._count - 1, partition, headers)).encode()
            self._crc[5] = zlib.crc32(rest, self._crc[5])
        if len(self._values) >= GROUP:
            self._fold_pending()

    def send_many(
        self, topic: str, values: Sequence[bytes | None], keys: Sequence[bytes | None] | None
    ) -> None:
        """Produce `values[i]` with `keys[i]` to `topic`, for every i, and digest them."""
        self._txn.send_many(topic, values, keys)
        self._fold_pending()
        self._count_topic(topic, len(values))
        self._fold(values, keys if keys is not None else [None] * len(values))

    def digest(self) -> str:
        """The digest of every record so far: their count, then the CRCs in hex."""
        self._fold_pending()
        crc = list(self._crc)
        crc[4] = _fold_topic(crc[4], self._topic, self._run)
        return f"{self._count}-" + "".join(f"{c:08x}" for c in crc)

    def _count_topic(self, topic: str, records: int) -> None:
        if topic != self._topic:
            self._crc[4] = _fold_topic(self._crc[4], self._topic, self._run)
            self._topic, self._run = topic, 0
        self._run += records
        self._count += records

    def _fold_pending(self) -> None:
        if self._values:
            self._fold(self._values, self._keys)
            self._values, self._keys = [], []

    def _fold(self, values: Sequence[bytes | None], keys: Sequence[bytes | None]) -> None:
        crc = self._crc
        crc[0], crc[1] = _cells(values, crc[0], crc[1])
        crc[2], crc[3] = _cells(keys, crc[2], crc[3])


# Records sent one by one are folded this many at a time.
GROUP = 4096


def _cells(cells: Sequence[bytes | None], data_crc: int, lengths_crc: int) -> tuple[int, int]:
    """The two CRCs with `cells` folded in: their bytes, and their lengths as 64-bit
    little-endian integers (-1 for null). Through one Arrow array: its data buffer holds the
    bytes back to back, and its lengths come from one C call (about half the time of joining
    the bytes and mapping `len` in Python, measured). Large binary, so that a group of more
    than 2 GiB stays one array."""
    column = pa.array(cells, pa.large_binary())
    if len(column) == 0:
        return data_crc, lengths_crc
    size = memoryview(column.buffers()[1]).cast("q")[len(column)]  # the last offset
    data = column.buffers()[2]
    if size and data is not None:
        data_crc = zlib.crc32(memoryview(data)[:size], data_crc)
    lengths = pc.binary_length(column)
    if column.null_count:
        lengths = pc.fill_null(lengths, -1)
    raw = memoryview(lengths.buffers()[1])[: 8 * len(column)]
    if sys.byteorder == "big":  # the digest is compared across machines
        swapped = array("q", raw.tobytes())
        swapped.byteswap()
        return data_crc, zlib.crc32(swapped, lengths_crc)
    return data_crc, zlib.crc32(raw, lengths_crc)


def _fold_topic(crc: int, topic: str | None, run: int) -> int:
    if topic is None or run == 0:
        return crc
    return zlib.crc32(f"{topic}\0{run}\0".encode(), crc)
