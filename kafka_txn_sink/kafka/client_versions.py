"""The versions of the two Kafka clients (and polars-avro) the sink is tested with, and the check
that refuses others at the driver's start and in the command line.

The sink relies on internals of each: confluent-kafka's statistics `eos` object (the producer id
and epoch) and its producer never being closed after flush (close() aborts since 2.16);
kafka-python's KafkaAdminClient private connection manager (the EndTxn client, txn_admin.py);
polars-avro's private `_avro_rs` module (files mode's native encoder). pyproject.toml allows the
same ranges; `ci/test_clients.sh oldest|newest` runs the tests at both ends (docs/compatibility.md).
"""

from __future__ import annotations

import importlib.util
import re
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from pathlib import Path

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
    found = installed_version(supported.distribution)
    if found is None:
        return  # not installed: its import decides
    message = refusal(supported, found)
    if message is not None:
        raise ConfigError(message)


def installed_version(distribution: str) -> str | None:
    """The installed version of `distribution`, or None when it is not installed.

    The two Kafka clients' versions are read from their own modules: a batch's planner and
    commit worker are often new processes, and importlib.metadata (with the email parser it
    loads, and its scan of sys.path) costs them about 15 ms each; importing kafka-python for its
    `__version__`, about 130 ms.
    """
    reader = _READERS.get(distribution)
    found = reader() if reader is not None else None
    if found is not None:
        return found
    from importlib import metadata

    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return None


def _confluent_kafka() -> str | None:
    try:
        import confluent_kafka  # the driver's own client: imported by the start anyway
    except ImportError:
        return None
    return str(confluent_kafka.__version__)


def _kafka_python() -> str | None:
    """kafka-python's `kafka/version.py`, read without importing the package."""
    spec = importlib.util.find_spec("kafka")
    if spec is None or spec.origin is None:
        return None
    try:
        text = (Path(spec.origin).parent / "version.py").read_text(encoding="utf-8")
    except OSError:
        return None
    match = re.search(r"^__version__\s*=\s*['\"]([^'\"]+)['\"]", text, re.MULTILINE)
    return match.group(1) if match else None


_READERS: dict[str, Callable[[], str | None]] = {
    "confluent-kafka": _confluent_kafka,
    "kafka-python": _kafka_python,
}


@cache
def check_clients() -> None:
    """`check` both Kafka clients (once per process: the versions do not change).

    Raises:
        ConfigError: a client's version is outside its tested range.
    """
    for supported in CLIENTS:
        check(supported)
