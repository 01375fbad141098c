"""The versions of the two Kafka clients (and polars-avro) the sink is tested with, and the check
that refuses others at the driver's start and in the command line.

The sink relies on internals of each: confluent-kafka's statistics `eos` object (the producer id
and epoch) and its producer never being closed after flush (close() aborts since 2.16);
kafka-python's KafkaAdminClient private connection manager (the EndTxn client, txn_admin.py);
polars-avro's private `_avro_rs` module (files mode's native encoder). pyproject.toml allows the
same ranges; `ci/test_clients.sh oldest|newest` runs the tests at both ends (docs/compatibility.md).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cache
from importlib import metadata

from kafka_txn_sink.errors import ConfigError


@dataclass(frozen=True)
class Supported:
    """A distribution's tested range: `low <= version < high`."""

    distribution: str
    low: str
    high: str

    @property
    def requirement(self) -> str:
        """The range as pip writes it, e.g. `confluent-kafka>=2.7.0,<3`."""
        return f"{self.distribution}>={self.low},<{self.high}"


CLIENTS = (
    Supported("confluent-kafka", "2.7.0", "3"),
    Supported("kafka-python", "3.0.0", "3.1"),
)
POLARS_AVRO = Supported("polars-avro", "0.13", "0.14")


def release(version: str) -> tuple[int, ...]:
    """The numeric release of a version string: `2.16.1rc1` -> (2, 16, 1)."""
    match = re.match(r"\d+(?:\.\d+)*", version)
    return tuple(int(part) for part in match.group().split(".")) if match else ()


def refusal(supported: Supported, found: str) -> str | None:
    """Why `found` is refused, or None when it is in the tested range."""
    if release(supported.low) <= release(found) < release(supported.high):
        return None
    return (
        f"{supported.distribution} {found} is installed, but the sink is tested with "
        f"{supported.distribution} >={supported.low},<{supported.high} only (it relies on "
        f"its internals): pip install '{supported.requirement}'"
    )


def check(supported: Supported) -> None:
    """Refuse an installed `supported.distribution` outside its tested range.

    Raises:
        ConfigError: names the package, the version found and the versions supported.
    """
    try:
        found = metadata.version(supported.distribution)
    except metadata.PackageNotFoundError:
        return  # not installed as a distribution (a platform's copy): its import decides
    message = refusal(supported, found)
    if message is not None:
        raise ConfigError(message)


@cache
def check_clients() -> None:
    """`check` both Kafka clients (once per process: the versions do not change).

    Raises:
        ConfigError: a client's version is outside its tested range.
    """
    for supported in CLIENTS:
        check(supported)
