"""Records produced from C with no delivery report: the `_quiet` extension, where it is built.

A record that needs no report of its own (`send_many` past a task's first REPORTED_RECORDS,
kafka/producer.py) costs about 0.9 us of CPU through confluent-kafka's `produce()`: the
call's argument parsing and its per-message state. The extension (kafka/_quiet.c) calls
librdkafka's `rd_kafka_produce` in a loop over the task's lists of `bytes` instead, on the
producer confluent-kafka created, with the functions of the librdkafka confluent-kafka loaded
(found in this process's memory map, so never a second copy).

Where the extension is not built (a platform without a compiler, an sdist), or
KAFKA_TXN_SINK_PURE_PYTHON is set, or the producer's handle does not name a producer,
`quiet_produce` returns None and records go through `produce()` as before: the same records,
the same proof of delivery.
"""

from __future__ import annotations

import ctypes
import logging
import os
from collections.abc import Callable, Sequence
from functools import cache, partial
from typing import Any

from confluent_kafka import Producer, libversion

try:
    from kafka_txn_sink.kafka import _quiet  # type: ignore[attr-defined]
except ImportError:  # not built: the pure-Python path
    _quiet = None

log = logging.getLogger(__name__)

# Set (to anything but empty) to produce every record through confluent-kafka's produce().
PURE_PYTHON = "KAFKA_TXN_SINK_PURE_PYTHON"
_PRODUCER_TYPE = 0  # librdkafka's RD_KAFKA_PRODUCER
# What _quiet.bind takes, in its order.
_FUNCTIONS = (
    "rd_kafka_produce",
    "rd_kafka_last_error",
    "rd_kafka_topic_new",
    "rd_kafka_topic_destroy",
)

# produce(topic, partition, values, keys, start, end) -> (index, error): see _quiet.c.
QuietProduce = Callable[
    [str, int, Sequence[bytes | None], Sequence[bytes | None] | None, int, int], tuple[int, int]
]


def quiet_produce(producer: Producer) -> QuietProduce | None:
    """The extension's produce() bound to `producer`; None where it cannot be used."""
    library = _librdkafka()
    if library is None:
        return None
    handle = _quiet.handle(producer)
    if library.rd_kafka_type(handle) != _PRODUCER_TYPE:
        log.warning("kafka_txn_sink: confluent-kafka's handle is not a producer; produce() used")
        return None
    produce: QuietProduce = partial(_quiet.produce, producer)
    return produce


@cache
def _librdkafka() -> Any:
    """librdkafka as confluent-kafka loaded it, bound to the extension; None where unusable."""
    if _quiet is None or os.environ.get(PURE_PYTHON):
        return None
    path = loaded_librdkafka()
    if path is None:
        return None
    library = ctypes.CDLL(path)  # the copy already in the process: dlopen returns it
    library.rd_kafka_version.restype = ctypes.c_int
    if library.rd_kafka_version() != libversion()[1]:
        log.warning("kafka_txn_sink: %s is not confluent-kafka's librdkafka; produce() used", path)
        return None
    library.rd_kafka_type.argtypes = [ctypes.c_void_p]
    library.rd_kafka_type.restype = ctypes.c_int
    address = [ctypes.cast(getattr(library, name), ctypes.c_void_p).value for name in _FUNCTIONS]
    _quiet.bind(Producer, *address)
    return library


def loaded_librdkafka() -> str | None:
    """The path of the librdkafka this process loaded for confluent-kafka; None when there is
    none or more than one (which would be confluent-kafka's is not known), or no
    /proc/self/maps (not Linux)."""
    try:
        with open("/proc/self/maps", encoding="utf-8") as maps:
            paths = {_mapped_path(line) for line in maps}
    except OSError:
        return None
    found = [path for path in paths if os.path.basename(path).startswith("librdkafka")]
    return found[0] if len(found) == 1 else None


def _mapped_path(line: str) -> str:
    """The file of one line of /proc/self/maps ("" for an anonymous mapping)."""
    fields = line.split(maxsplit=5)
    return fields[5].strip() if len(fields) == 6 else ""
