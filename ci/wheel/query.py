"""One small batch write through the sink, run by the Python of an install combination
(ci/check_wheel.sh): `python query.py '<options as JSON>'`. A platform's PySpark is on its path;
the sink comes from the wheel with the combination's extras. Exit 0 when the write went through;
the sink's error (a missing extra, say) on stderr and a non-zero exit otherwise.
"""

import json
import os
import sys

from pyspark.sql import SparkSession

from kafka_txn_sink.datasource import register

options = json.loads(sys.argv[1])
# Spark's Python workers run this combination's Python (the driver's), not a python3 on PATH.
os.environ["PYSPARK_PYTHON"] = os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
spark = (
    SparkSession.builder.master("local[1]")
    .config("spark.ui.enabled", "false")
    .config("spark.sql.shuffle.partitions", "1")
    .getOrCreate()
)
try:
    register(spark)
    rows = [(f"k{i}", f"v{i}") for i in range(10)]
    frame = spark.createDataFrame(rows, "key string, value string").coalesce(1)
    frame.write.format("kafka_txn").options(**options).mode("append").save()
finally:
    spark.stop()
