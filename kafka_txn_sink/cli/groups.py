"""`kafka-txn-sink group-offsets`: a consumer group's committed offsets as Spark's Kafka source
takes them in `startingOffsets`, to start a new checkpoint where a query with option
consumerGroup left off.

    kafka-txn-sink group-offsets --bootstrap HOST:PORT --group G [--kafka KEY=VALUE]
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from rich.console import Console

from kafka_txn_sink.cli.common import OK, REFUSED, add_kafka_option, kafka_settings
from kafka_txn_sink.cli.render import Output, Payload
from kafka_txn_sink.kafka.cluster import Cluster
from kafka_txn_sink.kafka.groups import as_starting_offsets

DEFAULT_TIMEOUT_MS = 30_000


def add_parser(commands: Any) -> None:
    """Register `group-offsets` on the CLI's subcommands."""
    parser = commands.add_parser(
        "group-offsets",
        help="print a consumer group's committed offsets as a startingOffsets JSON (the offsets "
        "of every batch a query with option consumerGroup completed)",
    )
    parser.add_argument("--bootstrap", required=True, metavar="HOST:PORT", help="Kafka brokers")
    parser.add_argument("--group", required=True, metavar="G", help="the consumer group")
    add_kafka_option(parser)
    parser.add_argument(
        "--timeout-ms",
        type=int,
        default=DEFAULT_TIMEOUT_MS,
        help=f"Kafka request timeout (default {DEFAULT_TIMEOUT_MS})",
    )
    parser.set_defaults(func=cmd_group_offsets)


def cmd_group_offsets(args: argparse.Namespace, out: Output) -> int:
    """Print the group's offsets; exit 1 when it has none committed."""
    cluster = Cluster(args.bootstrap, kafka_settings(args), args.timeout_ms)
    offsets = as_starting_offsets(cluster.committed_offsets(args.group))
    out.emit({"group": args.group, "startingOffsets": offsets}, _render)
    return OK if offsets else REFUSED


def _render(payload: Payload, console: Console) -> None:
    if not payload["startingOffsets"]:
        console.print(f"group {payload['group']} has no committed offsets")
        return
    # Plain, one line: pasted as .option("startingOffsets", '<this>').
    console.print(json.dumps(payload["startingOffsets"], separators=(",", ":")), soft_wrap=True)
