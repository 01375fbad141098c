"""The oracle: what a read_committed consumer sees, compared id by id with what went in.

`verify(VerifySpec(...))` reads the input topics over an explicit range, the sink's outputs
(records topics, and/or reference messages and Avro files) and its commit log, and reports
every anomaly (`kafka-txn-sink verify` is its command line). Nothing is summed in a way that
lets a loss and a duplicate cancel out: every id is counted.

    spec.py        what to verify (VerifySpec) and its checks
    run.py         one verification: the reads in their order, and the report
    kafka.py       reading topics over explicit offset ranges, in chunks, with progress
    checkpoint.py  the input range from the query's checkpoint
    log.py         the commit log as the verifier checks records against it
    files.py       reference messages, Avro files, orphans (files mode)
    ids.py         ids stored compactly, and compared
    report.py      the report, as text and JSON
"""

from __future__ import annotations

from kafka_txn_sink.verify.report import VerifyReport
from kafka_txn_sink.verify.run import verify
from kafka_txn_sink.verify.spec import VerifySpec

__all__ = ["VerifyReport", "VerifySpec", "verify"]
