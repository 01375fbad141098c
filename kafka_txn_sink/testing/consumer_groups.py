"""`kafka-consumer-groups.sh --describe`, as an operator runs it: Kafka's own ConsumerGroupCommand
from the same Maven Central release as the test bed's broker, its table parsed."""

from __future__ import annotations

import subprocess
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from kafka_txn_sink.testing.errors import TestbedError
from kafka_txn_sink.testing.jars import kafka_tools_jars
from kafka_txn_sink.testing.processes import java_executable

COMMAND = "org.apache.kafka.tools.consumer.group.ConsumerGroupCommand"


@dataclass(frozen=True)
class GroupRow:
    """One partition of `--describe`'s table: the group's offset (None: `-`), the log's end."""

    topic: str
    partition: int
    current: int | None
    log_end: int | None
    lag: int | None


def describe_group(
    bootstrap: str, group: str, settings: Mapping[str, str] | None = None, timeout_s: float = 120
) -> list[GroupRow]:
    """The rows `kafka-consumer-groups.sh --bootstrap-server B --describe --group G` prints
    (`settings`: the client properties of `--command-config`).

    Raises:
        TestbedError: the tool failed; its output is in the message.
    """
    with tempfile.TemporaryDirectory(prefix="kts-groups-") as tmp:
        args = ["--bootstrap-server", bootstrap, "--describe", "--group", group]
        if settings:
            config = Path(tmp) / "client.properties"
            config.write_text("".join(f"{k}={v}\n" for k, v in settings.items()))
            args += ["--command-config", str(config)]
        java = java_executable("it runs kafka-consumer-groups (Kafka's ConsumerGroupCommand)")
        command = [
            java,
            "-Xmx256m",
            "-XX:+UseSerialGC",
            "-XX:TieredStopAtLevel=1",
            "-cp",
            f"{kafka_tools_jars()}/*",
            COMMAND,
            *args,
        ]
        done = subprocess.run(
            command, capture_output=True, text=True, timeout=timeout_s, check=False
        )
    if done.returncode != 0:
        raise TestbedError(f"kafka-consumer-groups failed:\n{done.stdout}\n{done.stderr}")
    return parse_describe(done.stdout)


def parse_describe(text: str) -> list[GroupRow]:
    """The partition rows of `--describe`'s table (columns found by their headers)."""
    rows: list[GroupRow] = []
    header: list[str] | None = None
    for line in text.splitlines():
        cells = line.split()
        if not cells:
            continue
        if cells[0] == "GROUP":
            header = cells
            continue
        if header is None or len(cells) < len(header) - 3:
            continue
        row = dict(zip(header, cells, strict=False))
        rows.append(
            GroupRow(
                topic=row["TOPIC"],
                partition=int(row["PARTITION"]),
                current=_number(row.get("CURRENT-OFFSET")),
                log_end=_number(row.get("LOG-END-OFFSET")),
                lag=_number(row.get("LAG")),
            )
        )
    return rows


def group_offsets(rows: list[GroupRow]) -> dict[str, dict[int, int]]:
    """topic -> partition -> the group's committed offset, as the sink's records spell it."""
    found: dict[str, dict[int, int]] = {}
    for row in rows:
        if row.current is not None:
            found.setdefault(row.topic, {})[row.partition] = row.current
    return found


def _number(cell: str | None) -> int | None:
    return int(cell) if cell is not None and cell.lstrip("-").isdigit() else None
