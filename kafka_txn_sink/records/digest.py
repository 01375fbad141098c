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

from kafka_txn_sink.protocol.output import Headers, Transaction


class DigestingTransaction:
    """A `Transaction` that digests every record it passes on to `txn`."""

    def __init__(self, txn: Transaction):
        self._txn = txn
        self._count = 0
        self._crc = [0] * 6  # values, value lengths, keys, key lengths, topics, the rest
        self._topic: str | None = None
        self._run = 0  # records in a row sent to `_topic`, not yet folded

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
        self._fold(topic, [value], [key])
        if partition is not None or headers:
            rest = repr((self._count - 1, partition, headers)).encode()
            self._crc[5] = zlib.crc32(rest, self._crc[5])

    def send_many(
        self, topic: str, values: Sequence[bytes | None], keys: Sequence[bytes | None] | None
    ) -> None:
        """Produce `values[i]` with `keys[i]` to `topic`, for every i, and digest them."""
        self._txn.send_many(topic, values, keys)
        self._fold(topic, values, keys if keys is not None else [None] * len(values))

    def digest(self) -> str:
        """The digest of every record so far: their count, then the CRCs in hex."""
        crc = list(self._crc)
        crc[4] = _fold_topic(crc[4], self._topic, self._run)
        return f"{self._count}-" + "".join(f"{c:08x}" for c in crc)

    def _fold(
        self, topic: str, values: Sequence[bytes | None], keys: Sequence[bytes | None]
    ) -> None:
        crc = self._crc
        crc[0], crc[1] = _cells(values, crc[0], crc[1])
        crc[2], crc[3] = _cells(keys, crc[2], crc[3])
        if topic != self._topic:
            crc[4] = _fold_topic(crc[4], self._topic, self._run)
            self._topic, self._run = topic, 0
        self._run += len(values)
        self._count += len(values)


def _cells(cells: Sequence[bytes | None], data_crc: int, lengths_crc: int) -> tuple[int, int]:
    """The two CRCs with `cells` folded in: their bytes, and their lengths (-1 for null)."""
    try:
        data = b"".join(cells)  # type: ignore[arg-type]
        lengths = array("q", map(len, cells))  # type: ignore[arg-type]
    except TypeError:  # a null among them: rare enough for a second pass
        data = b"".join([c for c in cells if c is not None])
        lengths = array("q", [-1 if c is None else len(c) for c in cells])
    if sys.byteorder == "big":
        lengths.byteswap()  # the digest is compared across machines
    return zlib.crc32(data, data_crc), zlib.crc32(lengths, lengths_crc)


def _fold_topic(crc: int, topic: str | None, run: int) -> int:
    if topic is None or run == 0:
        return crc
    return zlib.crc32(f"{topic}\0{run}\0".encode(), crc)
