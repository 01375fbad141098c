"""What tells a batch write (`df.write`, option writeId) from a streaming query in the commit
log, and which batch of the log it is."""

from __future__ import annotations

from dataclasses import dataclass

# A batch write's decision carries `write:{writeId}` as its query id: never a Spark query id.
WRITE_QUERY_PREFIX = "write:"


@dataclass(frozen=True)
class BatchWrite:
    """A batch write (`df.write`, option writeId): the batch of the commit log it is.

    The driver chose the batch (start.py), so its tasks take batch and query id from here
    rather than from Spark's streaming properties. A log of batch writes has a query id per
    write, so the checks that the writing query is the log's are not made for them.
    """

    write_id: str
    batch_id: int

    @property
    def query_id(self) -> str:
        """What the write's decision and task messages carry as their query id."""
        return write_query_id(self.write_id)


def write_query_id(write_id: str) -> str:
    """The query id of batch write `write_id`: `write:{writeId}`."""
    return f"{WRITE_QUERY_PREFIX}{write_id}"


def is_batch_write(query_id: str) -> bool:
    """Whether a decision's query id is a batch write's rather than a streaming query's."""
    return query_id.startswith(WRITE_QUERY_PREFIX)
