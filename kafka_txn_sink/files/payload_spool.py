"""The layout of a payload file's spool on the Arrow path, shared by the writer that appends to
it (files/writer.py) and the reader that encodes it (files/payload_arrow.py): one payload per
line, cut into chunks of whole lines that the reader takes one at a time.

Kept apart from payload_arrow so that the writer can spool without importing the native
encoder (polars-avro takes about a third of a second to import) until a file is finished.
"""

from __future__ import annotations

from dataclasses import dataclass

# Small enough that a worker's peak memory does not grow with a file's size (16 MiB chunks and
# 64 MiB kept grew it 1.7x from 25k to 400k rows), large enough to amortize each read.
CHUNK_BYTES = 2 * 1024 * 1024


@dataclass(frozen=True)
class Chunk:
    """Whole lines of a spool: bytes `start` to `end`, `rows` payloads."""

    start: int
    end: int
    rows: int
