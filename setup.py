"""The one thing pyproject.toml cannot say: the C extension, left out on request.

kafka/_quiet.c (records without a delivery report produced from C, kafka/quiet.py) is built
against CPython's stable ABI, so the wheel is one per platform for CPython 3.10 and later; it is
optional, so a machine without a C compiler still builds a working wheel. With
KAFKA_TXN_SINK_PURE_PYTHON set, it is left out and the wheel is pure Python (py3-none-any), one
for every platform: what a Databricks bundle built on another machine uploads.
"""

import os

from setuptools import Extension, setup

PURE_PYTHON = bool(os.environ.get("KAFKA_TXN_SINK_PURE_PYTHON"))

QUIET = Extension(
    "kafka_txn_sink.kafka._quiet",
    sources=["kafka_txn_sink/kafka/_quiet.c"],
    py_limited_api=True,
    optional=True,
)

setup(
    ext_modules=[] if PURE_PYTHON else [QUIET],
    options={} if PURE_PYTHON else {"bdist_wheel": {"py_limited_api": "cp310"}},
)
