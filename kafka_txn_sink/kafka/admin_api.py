"""The driver's view of the brokers, as interfaces: what the protocol asks of Kafka's admin side.

`TransactionAdmin` (EndTxn, DescribeTransactions, ListTransactions; `txn_admin.TxnAdmin` speaks
it to real brokers) and `ClusterFacts` (topics, the brokers' transaction limit, and the fate
probe `FateProbe`; `cluster.Cluster`) are what protocol/ depends on, so tests can hand it fakes.
No Kafka client is imported here.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import Enum
from typing import Protocol

from kafka_txn_sink.protocol.messages import GroupProgress, OffsetRanges, Triple

ONGOING = "Ongoing"
NOT_FOUND = "NotFound"


@dataclass(frozen=True)
class TxnState:
    """One transactional id as its coordinator describes it."""

    transactional_id: str
    state: str
    producer_id: int = -1
    producer_epoch: int = -1
    timeout_ms: int = 0
    start_ms: int = -1
    partitions: tuple[tuple[str, int], ...] = ()  # what the open transaction wrote to

    @property
    def triple(self) -> Triple:
        """The transaction the coordinator holds for this id now."""
        return Triple(self.transactional_id, self.producer_id, self.producer_epoch)


@dataclass(frozen=True)
class EndTxnResult:
    """The coordinator's answer to one EndTxn."""

    triple: Triple
    error: str | None  # None: the coordinator accepted it

    @property
    def ok(self) -> bool:
        """Whether the coordinator accepted the EndTxn."""
        return self.error is None


class TransactionAdmin(Protocol):
    """Requests to the brokers' transaction coordinators on behalf of the driver."""

    def end_transactions(
        self, triples: Iterable[Triple], commit: bool, deadline_s: float
    ) -> list[EndTxnResult]:
        """EndTxn(commit or abort) for each triple; errors are reported, never raised."""
        ...

    def describe(self, txn_ids: Iterable[str]) -> dict[str, TxnState]:
        """The state of each id; unknown ids are NOT_FOUND."""
        ...

    def list_ids(self, states: Iterable[str] = ()) -> list[str]:
        """Every transactional id the brokers report in one of `states` (all if empty).

        Raises:
            KafkaUnavailableError: a broker refused or timed out.
        """
        ...


class Fate(Enum):
    """What a transaction's records, read back from the log, say of its fate."""

    COMMITTED = "committed"  # one of its records is visible at read_committed
    ABORTED = "aborted"  # one of its records is in the log and read_committed skips it
    # Not settled within the deadline: still open, or the brokers did not answer. Asking again
    # later may settle it.
    OPEN = "open"
    # Every record that would tell is gone from the log (retention, deleteRecords,
    # compaction): asking again never settles it.
    UNDETERMINED = "undetermined"


@dataclass(frozen=True)
class FateAnswer:
    """The probe's answer, and the records that gave it (or why none could)."""

    fate: Fate
    evidence: str


class FateProbe(Protocol):
    """Settles an EndTxn error: what do a transaction's records say at read_committed?"""

    def fate(self, offsets: OffsetRanges) -> FateAnswer:
        """The fate of the transaction that wrote these ranges (its first and last record
        per partition); see `Fate`."""
        ...

    def progress_fate(self, progress: GroupProgress) -> FateAnswer:
        """The fate of the progress transaction that committed `progress` to its group, read
        from the group's offsets (a progress transaction has no records)."""
        ...


class ClusterFacts(FateProbe, Protocol):
    """What the driver asks the cluster besides transactions."""

    def topic_exists(self, topic: str) -> bool:
        """Whether `topic` exists."""
        ...

    def cached_max_transaction_timeout_ms(self) -> int:
        """The brokers' transaction.max.timeout.ms (remembered for a while)."""
        ...

    def topic_partitions(self, topic: str) -> int | None:
        """The partition count of `topic`, None if it does not exist."""
        ...

    def max_message_bytes(self, topic: str) -> int:
        """The topic's max.message.bytes."""
        ...

    def create_topic(
        self, topic: str, partitions: int, replication_factor: int, config: Mapping[str, str]
    ) -> int | None:
        """Create `topic`; the partition count of the one that exists instead, else None."""
        ...
