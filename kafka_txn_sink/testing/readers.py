"""What a read_committed consumer sees of the sink's output, as DataFrames for chispa.

``read_committed`` reads a topic as Spark's Kafka source does, at ``isolation.level``
``read_committed``; ``read_referenced_files`` follows the reference messages of files mode to the
Avro files they name and reads those files' rows, once per reference, as a reader of files
mode would. Both need the Kafka connector on the session's ``spark.jars`` (and spark-avro for
the files), as the ``kts_spark`` fixture has them. pyspark is imported only when they run.
"""

from __future__ import annotations

import atexit
import json
import shutil
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kafka_txn_sink.errors import StagingError
from kafka_txn_sink.testing.spark_session import BOOTSTRAP_CONF

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

    from kafka_txn_sink.protocol.messages import FileRef
    from kafka_txn_sink.storage import S3Settings
    from kafka_txn_sink.storage.files import FileSink

KAFKA_COLUMNS = ("key", "value", "topic", "partition", "offset", "headers")
"""The columns of ``read_committed``, as Spark's Kafka source names and types them."""

_FILE_COLUMN = "_kts_staged_file"


def read_committed(
    spark: SparkSession,
    topic: str,
    *,
    bootstrap: str | None = None,
    kafka_options: Mapping[str, str] | None = None,
) -> DataFrame:
    """Every record of ``topic`` that a read_committed consumer sees now, ordered by partition
    and offset: ``key`` and ``value`` (binary), ``topic``, ``partition``, ``offset``, ``headers``.

    ``bootstrap`` defaults to the session's ``spark.kafka_txn_sink.testing.bootstrap`` (the
    ``kts_spark`` fixture sets it); ``kafka_options`` are Kafka client settings (TLS, SASL)
    without the ``kafka.`` prefix. Records of aborted transactions are not seen, and the read
    stops at the first open transaction, as a read_committed consumer does.
    """
    reader = (
        spark.read.format("kafka")
        .option("kafka.bootstrap.servers", bootstrap or _session_bootstrap(spark))
        .option("kafka.isolation.level", "read_committed")
        .option("subscribe", topic)
        .option("startingOffsets", "earliest")
        .option("endingOffsets", "latest")
        .option("includeHeaders", "true")
    )
    for key, value in (kafka_options or {}).items():
        reader = reader.option(f"kafka.{key}", value)
    return reader.load().select(*KAFKA_COLUMNS).orderBy("partition", "offset")


def read_referenced_files(
    spark: SparkSession,
    references_topic: str,
    *,
    bootstrap: str | None = None,
    s3: S3Settings | None = None,
    staging_dir: str | Path | None = None,
    avro_options: Mapping[str, str] | None = None,
) -> DataFrame:
    """The rows of the Avro files that the reference messages of ``references_topic`` name, as
    a read_committed consumer sees those messages: each file's rows once per reference, with
    the file's partition values (``partitionBy`` and time directories) as string columns after
    the file's own columns, in directory order (null for the default partition).

    Files are copied (``s3://`` ones with ``s3``, boto3's defaults when None) under
    ``staging_dir`` (a temporary directory removed at exit by default), then read with Spark's
    ``format("avro")`` and ``avro_options``. Files of different schemas are read under one
    schema, as Spark's Avro reader does; give ``avroSchema`` in ``avro_options`` to choose it.
    No reference gives an empty DataFrame without columns.

    Raises:
        ValueError: a message of the topic is not a file reference.
        StagingError: a referenced file is missing, unreadable, or not of its referenced size.
    """
    from pyspark.sql import functions as F
    from pyspark.sql.types import StringType, StructField, StructType

    from kafka_txn_sink.files.references import parse_reference

    messages = read_committed(spark, references_topic, bootstrap=bootstrap).select("value")
    refs = [parse_reference(bytes(row.value)) for row in messages.collect()]
    if not refs:
        return spark.createDataFrame([], StructType([]))
    staged = _stage(refs, Path(staging_dir) if staging_dir else _temporary_dir(), s3)
    rows = (
        spark.read.format("avro")
        .options(**(avro_options or {}))
        .load([str(path) for path in staged])
    )
    names = partition_names(refs)
    if not names:
        return rows
    values = spark.createDataFrame(
        [
            (path.name, *(ref.partition_values.get(n) for n in names))
            for path, ref in zip(staged, refs, strict=True)
        ],
        StructType([StructField(c, StringType()) for c in (_FILE_COLUMN, *names)]),
    )
    return (
        rows.withColumn(_FILE_COLUMN, F.col("_metadata.file_name"))
        .join(F.broadcast(values), _FILE_COLUMN)
        .drop(_FILE_COLUMN)
    )


def partition_names(refs: Sequence[FileRef]) -> list[str]:
    """The partition columns of ``refs``, in the order of their directories."""
    from kafka_txn_sink.files.partitioning import hive_escape

    names: list[str] = []
    for ref in refs:
        by_escaped = {hive_escape(name): name for name in ref.partition_values}
        segments = ref.partition_path.split("/") if ref.partition_path else []
        for segment in segments:
            name = by_escaped.get(segment.partition("=")[0])
            if name is not None and name not in names:
                names.append(name)
    return names


def _session_bootstrap(spark: SparkSession) -> str:
    bootstrap = spark.conf.get(BOOTSTRAP_CONF, None)
    if not bootstrap:
        raise ValueError(
            f"no Kafka bootstrap address: pass bootstrap=, or set {BOOTSTRAP_CONF} "
            "on the session (the kts_spark fixture does)"
        )
    return bootstrap


def _stage(refs: Sequence[FileRef], directory: Path, s3: S3Settings | None) -> list[Path]:
    """Copy each referenced file to ``directory``/<n>.avro, n its reference's position."""
    directory.mkdir(parents=True, exist_ok=True)
    sinks: dict[str, FileSink] = {}
    staged: list[Path] = []
    for n, ref in enumerate(refs):
        path = directory / f"{n:06d}.avro"
        path.write_bytes(_fetch(ref, s3, sinks))
        staged.append(path)
    return staged


def _fetch(ref: FileRef, s3: S3Settings | None, sinks: dict[str, FileSink]) -> bytes:
    """The whole file a reference names, checked against the size the reference gives."""
    from kafka_txn_sink.storage import open_file_sink, parse_location

    location = parse_location(ref.location, "referenced file", StagingError)
    if location.scheme == "s3":
        root, name = f"s3://{location.bucket}", location.path.lstrip("/")
    else:
        root, name = str(Path(location.path).parent), Path(location.path).name
    if root not in sinks:
        sinks[root] = open_file_sink(root, s3)
    data = sinks[root].read_head(name, ref.bytes + 1)
    if len(data) != ref.bytes:
        raise StagingError(
            f"{ref.location} holds {len(data)} bytes; its reference says {ref.bytes}"
        )
    return data


def _temporary_dir() -> Path:
    """A new directory removed when the interpreter exits (the DataFrame reads it lazily)."""
    directory = Path(tempfile.mkdtemp(prefix="kts-referenced-files-"))
    atexit.register(shutil.rmtree, directory, ignore_errors=True)
    return directory


def read_committed_values(
    spark: SparkSession,
    topic: str,
    schema_registry_url: str,
    *,
    bootstrap: str | None = None,
    kafka_options: Mapping[str, str] | None = None,
) -> DataFrame:
    """``read_committed`` with each ``value`` decoded from the Schema Registry's wire format, as
    the sink writes it with option ``valueFormat``: Avro values as the struct their schema
    describes (Spark's ``from_avro``), JSON Schema values as their JSON text, protobuf values as
    the JSON text of protobuf's JSON mapping (field names as in the ``.proto``, 64-bit integers
    as text, unset fields left out; a Python UDF, as the test bed's Spark has no spark-protobuf).

    Raises:
        ValueError: the topic's values carry more than one schema id (decode them one by one).
    """
    from pyspark.sql.avro.functions import from_avro
    from pyspark.sql.functions import col, expr

    from kafka_txn_sink.serde.resolve import registry_client

    records = read_committed(spark, topic, bootstrap=bootstrap, kafka_options=kafka_options)
    ids = {
        int.from_bytes(bytes(row.schema_id), "big")
        for row in records.select(expr("substring(value, 2, 4) AS schema_id")).distinct().collect()
    }
    if len(ids) > 1:
        raise ValueError(f"topic {topic} has values of schema ids {sorted(ids)}: one at a time")
    if not ids:
        return records
    schema = registry_client({"url": schema_registry_url}).get_schema(ids.pop())
    payload = expr("substring(value, 6)")
    if (schema.schema_type or "AVRO") == "JSON":
        decoded = payload.cast("string")
    elif schema.schema_type == "PROTOBUF":
        decoded = _protobuf_json(schema.schema_str)(col("value"))
    else:
        decoded = from_avro(payload, schema.schema_str)
    return records.withColumn("value", decoded).select(*(col(c) for c in KAFKA_COLUMNS))


def _protobuf_json(text: str) -> Any:
    """A UDF: the JSON text of a protobuf value of the `.proto` ``text`` (the wire format's
    prefix skipped: magic byte, schema id, message indexes)."""
    from pyspark.sql.functions import udf

    def decode(value: bytes | None) -> str | None:
        from kafka_txn_sink.serde.protobuf import message_reader

        return None if value is None else json.dumps(message_reader(text)(bytes(value)[5:]))

    return udf(decode, "string")
