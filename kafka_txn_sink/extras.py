"""The optional parts of the install (pip extras), and the check that an option's extra is there.

The core install runs records mode with a JSON commit log on a local or mounted path. Each other
feature comes with an extra: files mode (`files`), an `s3://` location (`s3`), the Delta commit
log (`delta`), a PKCS#12 keystore (`keystore`), the verifier (`verify`), record formats of a
Schema Registry (`registry`, and `protobuf` for that format), AWS MSK IAM authentication
(`msk-iam`), the metrics pushed over OTLP (`otlp`); `all` has them all. The driver checks the
options at its start (`option_extras.check_install`) and the command line checks its arguments
(`require`), so that a missing extra is one clear error naming the option and the
`pip install` line, never an ImportError in a task.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Iterable, Mapping

from kafka_txn_sink.errors import ConfigError

DISTRIBUTION = "kafka-txn-sink"

# The modules each extra brings, as imported (pyproject.toml lists the distributions).
EXTRAS: Mapping[str, tuple[str, ...]] = {
    "files": ("fastavro", "polars_avro", "cramjam", "numpy"),
    "s3": ("boto3", "botocore"),
    "delta": ("deltalake",),
    "keystore": ("cryptography",),
    "verify": ("numpy", "fastavro", "boto3", "botocore"),
    "registry": ("confluent_kafka.schema_registry", "fastavro", "jsonschema", "numpy"),
    "protobuf": ("grpc_tools", "google.protobuf"),
    "msk-iam": ("aws_msk_iam_sasl_signer", "botocore"),
    "otlp": ("opentelemetry.sdk", "opentelemetry.exporter.otlp.proto.http"),
}


class MissingExtraError(ConfigError):
    """An option (or command) needs an extra of the package that is not installed."""


def missing_modules(extra: str) -> list[str]:
    """The modules of `extra` that this Python cannot import."""
    return [name for name in EXTRAS[extra] if not _importable(name)]


def _importable(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except ModuleNotFoundError:  # a submodule's parent is missing too (`google` of protobuf)
        return False


def location_needs(what: str, location: str | None) -> list[tuple[str, str]]:
    """[(`what=s3://...`, "s3")] for an S3 location, else nothing."""
    return [(f"{what}=s3://...", "s3")] if location and location.startswith("s3://") else []


def require(what: str, extra: str) -> None:
    """Refuse `what` (an option or a command) when `extra` is not installed.

    Raises:
        MissingExtraError: names `what`, the extra and the `pip install` line.
    """
    require_all([(what, extra)])


def require_all(needed: Iterable[tuple[str, str]]) -> None:
    """`require` for several (what, extra) pairs, reported together.

    Raises:
        MissingExtraError: one message naming every missing one and one `pip install` line.
    """
    missing = [(what, extra, mods) for what, extra in needed if (mods := missing_modules(extra))]
    if missing:
        raise MissingExtraError(missing_message(missing))


def missing_message(missing: list[tuple[str, str, list[str]]]) -> str:
    """`option X needs the s3 extra (boto3 is not installed): pip install '...[s3]'`."""
    parts = [
        f"{what} needs the {extra} extra ({', '.join(mods)} not installed)"
        for what, extra, mods in missing
    ]
    extras = ",".join(dict.fromkeys(extra for _, extra, _ in missing))
    return f"{'; '.join(parts)}: pip install '{DISTRIBUTION}[{extras}]'"
