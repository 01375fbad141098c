"""Publishing again the file references of a decided batch that the broker aborted (files mode).

A decided participant whose transaction timed out before the driver could commit it is lost in
records mode: its rows live nowhere else. In files mode its files are still there and the
decision lists every one of them, so recovery can publish their references once more. It does
so crash-safely, in the same order as a batch: the references are produced in a transaction of
the sink's republish id and left open ("prepared"), the round is recorded in the commit log
(put-if-absent per batch and round), and only then committed. A crash before the record leaves
an open transaction that the next round's `init_transactions()` aborts; a crash after it
leaves a record whose transaction the next recovery commits, or, if the broker aborted that
one too, supersedes with the next round. No reference is ever published twice.
"""

from __future__ import annotations

import io
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from fastavro import reader as avro_reader

from kafka_txn_sink.errors import StagingError
from kafka_txn_sink.files.naming import base_name, stored_name
from kafka_txn_sink.files.references import Reference, WrittenFile, reference
from kafka_txn_sink.kafka.producer import TaskTransaction
from kafka_txn_sink.kafka.producer_settings import producer_config
from kafka_txn_sink.options import SinkOptions
from kafka_txn_sink.protocol.messages import Decision, FileRef, Participant, Republish
from kafka_txn_sink.protocol.txn_ids import republish_id
from kafka_txn_sink.storage import S3Settings, open_file_sink
from kafka_txn_sink.storage.files import FileSink

# The Avro header (magic, schema, codec, sync marker) is read in growing slices up to this.
_HEADER_FIRST_BYTES = 64 * 1024
_HEADER_MAX_BYTES = 64 * 1024 * 1024


@dataclass(frozen=True)
class Republisher:
    """What recovery needs to rebuild and publish the references of lost participants."""

    sink_id: str
    bootstrap_servers: str
    kafka: Mapping[str, str]
    transaction_timeout_ms: int
    client_timeout_s: float
    references_topic: str
    path: str
    s3: S3Settings | None
    inline_max_bytes: int

    @classmethod
    def for_options(cls, options: SinkOptions) -> Republisher | None:
        """The republisher of a files-mode sink; None in records mode alone."""
        files = options.files
        if files is None or options.transaction_timeout_ms is None:
            return None
        return cls(
            sink_id=options.sink_id,
            bootstrap_servers=options.bootstrap_servers,
            kafka=options.kafka,
            transaction_timeout_ms=options.transaction_timeout_ms,
            client_timeout_s=options.commit_timeout_ms / 1000,
            references_topic=files.references_topic,
            path=files.path,
            s3=options.s3,
            inline_max_bytes=files.schema_inline_max_bytes,
        )

    def __repr__(self) -> str:
        return f"Republisher(sink_id={self.sink_id!r}, references_topic={self.references_topic!r})"

    def prepare(
        self, decision: Decision, participants: Sequence[Participant], round_: int
    ) -> Republish:
        """Produce the participants' references in an open transaction; the round's record.

        Raises:
            StagingError: a file the decision lists cannot be read.
            KafkaTxnSinkError: the transaction could not be opened or its records delivered.
        """
        sink = open_file_sink(self.path, self.s3)
        messages = [
            self._reference(sink, ref, decision.batch_id)
            for participant in participants
            for ref in participant.files
        ]
        config = producer_config(
            self.bootstrap_servers,
            dict(self.kafka),
            republish_id(self.sink_id),
            self.transaction_timeout_ms,
        )
        txn = TaskTransaction(config, self.client_timeout_s)
        try:
            txn.init()
            for message in messages:
                txn.send(self.references_topic, value=message.value, key=message.key)
            prepared = txn.prepare()
        except BaseException:
            txn.abort()
            raise
        finally:
            txn.detach()
        if prepared is None:
            raise StagingError(f"batch {decision.batch_id}: no file references to republish")
        return Republish(
            sink_id=self.sink_id,
            batch_id=decision.batch_id,
            round=round_,
            partitions=tuple(sorted(p.partition for p in participants)),
            triple=prepared.triple,
            references=prepared.rows,
            offsets=prepared.offsets,
            recorded_at_ms=prepared.prepared_at_ms,
        )

    def _reference(self, sink: FileSink, ref: FileRef, batch_id: int) -> Reference:
        """The same reference the task published: the file's facts, schema and codec."""
        name = _name(sink, ref)
        schema, codec = _header(sink, name)
        return reference(
            WrittenFile(ref=ref, schema=schema, name=name),
            sink=sink,
            sink_id=self.sink_id,
            batch_id=batch_id,
            codec=codec,
            inline_max_bytes=self.inline_max_bytes,
        )


def _name(sink: FileSink, ref: FileRef) -> str:
    """The file's name under the sink's root, checked against the location the log holds."""
    name = stored_name(ref.partition_path, base_name(ref.location))
    if sink.location(name) != ref.location:
        raise StagingError(
            f"the decision names file {ref.location}, which is not under option path "
            f"{sink.uri}: was path changed since the batch was decided?"
        )
    return name


def _header(sink: FileSink, name: str) -> tuple[dict[str, Any], str]:
    """The writer schema and codec stored in an Avro file's header."""
    size = _HEADER_FIRST_BYTES
    while True:
        head = sink.read_head(name, size)
        try:
            found = avro_reader(io.BytesIO(head))
            return json.loads(found.metadata["avro.schema"]), found.codec
        except (ValueError, EOFError, KeyError, StopIteration) as exc:
            if len(head) < size or size >= _HEADER_MAX_BYTES:
                raise StagingError(
                    f"cannot read the Avro header of {sink.location(name)}: {exc}"
                ) from exc
            size *= 4
