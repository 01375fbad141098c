"""The test kit reads values of a registry format back as data: a batch write of Avro, JSON
Schema and protobuf values through the sink, in this process's Spark, compared with chispa."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
from chispa import assert_df_equality
from pyspark.sql import SparkSession

from kafka_txn_sink import testing
from kafka_txn_sink.testing import read_committed_values

pytestmark = [pytest.mark.kafka, pytest.mark.spark, pytest.mark.registry]

ROWS = [("k1", "ann", 3), ("k2", "bob", None), ("k3", "cy", 7)]
PROTO = """syntax = "proto3";
package kit;

message Visit {
  string user = 1;
  int64 visits = 2;
}
"""


def write(
    spark: SparkSession, fmt: str, topic: str, registry: str, workdir: Path, bootstrap: str
) -> None:
    frame = spark.createDataFrame(ROWS, "key STRING, user STRING, visits BIGINT")
    schema = {"valueSchema": PROTO} if fmt == "protobuf" else {}
    (
        frame.selectExpr("key", "named_struct('user', user, 'visits', visits) AS value")
        .write.format("kafka_txn")
        .options(**schema)
        .option("kafka.bootstrap.servers", bootstrap)
        .option("topic", topic)
        .option("sinkId", f"kit_{topic}")
        .option("commitLog", str(workdir / "log"))
        .option("writeId", "once")
        .option("valueFormat", fmt)
        .option("schema.registry.url", registry)
        .mode("append")
        .save()
    )


@pytest.mark.parametrize("fmt", ["avro", "json-schema", "protobuf"])
def test_the_values_the_sink_wrote_read_back_as_data(
    kts_spark: SparkSession,
    kafka_broker: testing.AnyKafkaBroker,
    schema_registry: testing.SchemaRegistry,
    unique: Callable[[str], str],
    tmp_path: Path,
    fmt: str,
) -> None:
    topic = kafka_broker.create_topic(unique("kit"), partitions=2)
    write(kts_spark, fmt, topic, schema_registry.url, tmp_path, kafka_broker.bootstrap)

    seen = read_committed_values(kts_spark, topic, schema_registry.url)

    if fmt == "avro":
        found = seen.selectExpr("CAST(key AS STRING) AS key", "value.user", "value.visits")
        expected = kts_spark.createDataFrame(ROWS, "key STRING, user STRING, visits BIGINT")
        assert_df_equality(found, expected, ignore_row_order=True, ignore_nullable=True)
    elif fmt == "json-schema":
        values = {r.key.decode(): json.loads(r.value) for r in seen.collect()}
        assert values == {k: {"user": u, "visits": v} for k, u, v in ROWS}
    else:  # protobuf's JSON mapping: int64 as text, an unset field left out
        values = {r.key.decode(): json.loads(r.value) for r in seen.collect()}
        assert values == {
            k: {"user": u, **({"visits": str(v)} if v is not None else {})} for k, u, v in ROWS
        }
