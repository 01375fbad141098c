"""Errors of the sink. Each names what went wrong and, where there is one, the remedy."""

from __future__ import annotations

from collections.abc import Iterable


class KafkaTxnSinkError(Exception):
    """Root of every error the sink raises on purpose."""


class ConfigError(KafkaTxnSinkError):
    """An option is missing, invalid, or owned by the sink."""


class InputError(KafkaTxnSinkError):
    """A row cannot be written as it is (wrong column type, null where not allowed, too large).

    `reason` says which part of the row (records/dead_letter.py: what `badRows=deadLetter`
    records as the dead-letter record's kind)."""

    def __init__(self, message: str, reason: str = "input") -> None:
        super().__init__(message)
        self.reason = reason


class QueryIdMismatchError(KafkaTxnSinkError):
    """The query writing now is not the one the commit log belongs to (checkpoint replaced)."""

    @classmethod
    def check(
        cls, sink_id: str, log_uri: str, log_query_id: str | None, query_ids: Iterable[str]
    ) -> None:
        """Refuse any of `query_ids` that is not `log_query_id` (None: the log has no query).

        Raises:
            QueryIdMismatchError: the checkpoint was deleted or replaced (its batch ids start
                again at 0), so batches would be skipped or mixed up silently.
        """
        foreign = sorted(q for q in query_ids if log_query_id and q != log_query_id)
        if foreign:
            assert log_query_id is not None
            raise cls.for_log(sink_id, log_uri, log_query_id, foreign[0])

    @classmethod
    def for_log(
        cls, sink_id: str, log_uri: str, log_query_id: str, query_id: str
    ) -> QueryIdMismatchError:
        """The error for query `query_id` writing to a log that belongs to `log_query_id`."""
        return cls(
            f"the commit log {log_uri} of sink {sink_id} belongs to streaming query "
            f"{log_query_id}, but query {query_id} is writing: the checkpoint was deleted or "
            f"replaced (a declarative pipeline's full refresh replaces its flows' checkpoints). "
            f"Restore the checkpoint, or start over with a new sinkId and commitLog: the query "
            f"then writes its input again from its startingOffsets, so read_committed consumers "
            f"get again what the old checkpoint committed unless the source starts where it "
            f"ended; batches are never skipped silently."
        )


class CommitLogError(KafkaTxnSinkError):
    """The commit log cannot be read or written, or holds something it should not."""


class CommitLogConflictError(CommitLogError):
    """A different record already exists for a batch; nothing was overwritten."""


class DecisionInDoubtError(CommitLogError):
    """A decision (or abort record) write failed without an answer: it may still land."""


class SupersededError(KafkaTxnSinkError):
    """A newer run of the query (another driver) owns the sink; this one decides nothing more."""


class ParticipantNotCommittableError(KafkaTxnSinkError):
    """A prepared transaction is no longer Ongoing with its recorded producer id and epoch."""


class TransactionTooOldError(KafkaTxnSinkError):
    """A prepared transaction has less time left than the commit needs; the batch is not decided."""


class TransactionLostError(KafkaTxnSinkError):
    """A decided transaction could not be committed; its rows are recorded as lost in the log."""


class TransactionCompletionError(KafkaTxnSinkError):
    """A decided transaction's fate could not be settled yet; recovery will try again."""


class TransactionFateUnknownError(TransactionCompletionError):
    """A decided transaction's EndTxn failed and the records that would tell whether the
    brokers committed it are gone from the log: no loss is recorded and nothing is published
    again; the batch stays incomplete until someone checks its rows by hand."""


class KafkaUnavailableError(KafkaTxnSinkError):
    """The brokers cannot be reached, or a request to them timed out."""


class StagingError(KafkaTxnSinkError):
    """An output file (files mode) could not be written, uploaded, listed or deleted."""


class PermissionDeniedError(KafkaTxnSinkError):
    """The brokers refused an operation the sink needs: the error names the permission, the
    resource and the principal, and how to grant it."""


class AuthenticationFailedError(KafkaTxnSinkError):
    """The brokers refused the client's credentials; the error names the mechanism."""


class SchemaRegistryError(KafkaTxnSinkError):
    """The Schema Registry cannot be reached, or refuses a schema (records' key or value
    formats); the batch writes nothing."""
