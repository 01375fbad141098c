"""Which extras of the install a sink's options need, checked on the driver at its start.

`checked_options` is how the driver reads the options Spark hands it: parsed (options.py), then
refused when an extra they need is missing (all of them in one message naming each option and
the `pip install` line), or a Kafka client (and in files mode polars-avro) is outside its tested
versions. The extras themselves are in extras.py; the command line checks its own arguments.
"""

from __future__ import annotations

from collections.abc import Mapping

from kafka_txn_sink.extras import location_needs, require_all
from kafka_txn_sink.kafka.client_versions import POLARS_AVRO, check, check_clients
from kafka_txn_sink.options import SinkOptions, parse_options


def checked_options(given: Mapping[str, str]) -> SinkOptions:
    """The sink's options as `parse_options` reads them, once `check_install` accepts them.

    Raises:
        ConfigError: as `parse_options`; MissingExtraError: as `check_install`.
    """
    options = parse_options(given)
    check_install(options)
    return options


def check_install(options: SinkOptions) -> None:
    """Refuse options whose extras are not installed (all of them in one message), and Kafka
    clients (and in files mode polars-avro) outside their tested versions.

    Raises:
        MissingExtraError: names each option, its extra and the `pip install` line.
        ConfigError: a client's version is outside its tested range (client_versions.py).
    """
    require_all(needs(options))
    check_clients()
    if options.files is not None:
        check(POLARS_AVRO)


def needs(options: SinkOptions) -> list[tuple[str, str]]:
    """(what needs it, the extra) for each extra the sink's options use."""
    found = location_needs("option commitLog", options.commit_log)
    if options.commit_log_format == "delta":
        found.append(("option commitLogFormat=delta", "delta"))
    if options.files is not None:
        found.append(("option path (files mode)", "files"))
        found += location_needs("option path", options.files.path)
    for f in options.serde.fields():
        found.append((f"option {f.column}Format={f.format}", "registry"))
        if f.format == "protobuf":
            found.append((f"option {f.column}Format=protobuf", "protobuf"))
    if any(key.lower() == "ssl.keystore.location" for key in options.kafka):
        found.append(("option kafka.ssl.keystore.location", "keystore"))
    return found
