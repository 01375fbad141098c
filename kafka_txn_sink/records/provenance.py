"""Option `provenanceHeaders`: where each record came from, in headers of its own.

Readers that cannot read transactionally (read_uncommitted consumers, mirroring tools, some
stream processors) see aborted attempts too. With `kts.sink`, `kts.batch`, `kts.task` (the
Spark partition) and `kts.seq` (the row's ordinal in its task's input) they can audit what they
read. Keeping one record per (sink, batch, task, seq) de-duplicates only where a replay hands
each task the same rows in the same order (no shuffle before the sink, a source that replays a
partition as it was): after a shuffle, an aborted attempt and the committed replay may carry one
key for different rows, and only the commit log's decision says which attempt counts.

The headers come after every other header. They are left out of the records' digest
(records/digest.py): a replay that hands a task its rows in another order still matches, and a
repair writes the replay's ordinals for rows no reader ever saw committed.
"""

from __future__ import annotations

from dataclasses import dataclass

from kafka_txn_sink.protocol.output import Headers

SINK, BATCH, TASK, SEQ = "kts.sink", "kts.batch", "kts.task", "kts.seq"


@dataclass(frozen=True)
class Provenance:
    """The provenance of one task's records."""

    sink_id: str
    batch_id: int
    task: int

    def headers(self, ordinal: int) -> Headers:
        """The headers of the task's row number `ordinal` (from 0)."""
        return [
            (SINK, self.sink_id.encode()),
            (BATCH, str(self.batch_id).encode()),
            (TASK, str(self.task).encode()),
            (SEQ, str(ordinal).encode()),
        ]
