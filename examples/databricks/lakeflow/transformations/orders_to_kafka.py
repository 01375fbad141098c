"""A declarative pipeline (Lakeflow Declarative Pipelines on Databricks, Spark Declarative
Pipelines elsewhere) that copies a Kafka topic to another through kafka_txn, exactly once.

Everything comes from the pipeline's configuration, so the file runs unchanged on Databricks
and with `spark-pipelines run` (tests/e2e/test_declarative_pipeline.py runs it so):

    kafka_txn.input.bootstrap        the input topic's brokers (Spark's Kafka source)
    kafka_txn.input.topic            the input topic
    kafka_txn.input.maxOffsetsPerTrigger   optional
    kafka_txn.input.kafka.<setting>  optional: the source's Java client settings (SASL, TLS)
    kafka_txn.register               `true` on Databricks: register the data source first
    kafka_txn.sink.<option>          each of the sink's options, e.g. kafka_txn.sink.topic,
                                     kafka_txn.sink.sinkId, kafka_txn.sink.commitLog,
                                     kafka_txn.sink.kafka.bootstrap.servers,
                                     kafka_txn.sink.kafka.sasl.password (a secret reference)

A full refresh replaces the flow's checkpoint: the sink then refuses the new query with a
message that says what to do (docs/connect.md), rather than writing the input again.
"""

from pyspark import pipelines as dp

import kafka_txn_sink

INPUT, SINK = "kafka_txn.input.", "kafka_txn.sink."

settings = spark.conf.getAll  # noqa: F821 (a property: every setting of the session)
if settings.get("kafka_txn.register", "false") == "true":
    # Databricks documents registering a Python data source before use. Open-source Spark
    # finds it by itself, and there a registration from a pipeline's session made
    # spark-pipelines 4.3 fail on a response it does not know (Python accumulators), so it is
    # asked for only where needed.
    kafka_txn_sink.register(spark)  # noqa: F821 (the pipeline's session)

dp.create_sink(
    "orders_out",
    format="kafka_txn",
    options={k[len(SINK) :]: v for k, v in settings.items() if k.startswith(SINK)},
)


@dp.append_flow(target="orders_out")
def orders():
    reader = (
        spark.readStream.format("kafka")  # noqa: F821
        .option("kafka.bootstrap.servers", settings[INPUT + "bootstrap"])
        .option("subscribe", settings[INPUT + "topic"])
        .option("startingOffsets", "earliest")
    )
    if INPUT + "maxOffsetsPerTrigger" in settings:
        reader = reader.option("maxOffsetsPerTrigger", settings[INPUT + "maxOffsetsPerTrigger"])
    for key, value in settings.items():
        if key.startswith(INPUT + "kafka."):
            reader = reader.option(key[len(INPUT) :], value)
    return reader.load().selectExpr("key", "value")
