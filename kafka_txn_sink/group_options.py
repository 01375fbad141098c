"""Option `consumerGroup`: commit each batch's input offsets to a consumer group, with its output.

The offsets are the batch's end offsets in Spark's offset log (`<checkpointLocation>/offsets/N`),
so the option needs the query's `checkpointLocation` option (Spark hands it to the sink), a
streaming query (datasource.py refuses it in `df.write`) and records mode (the progress
transaction runs on the output cluster, where the input topics must live too).
protocol/progress.py does the committing.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from kafka_txn_sink.errors import ConfigError
from kafka_txn_sink.option import Option

CONSUMER_GROUP = Option(
    "consumerGroup",
    "a consumer group to which each batch's input end offsets are committed inside the batch's "
    "transactions (the input topics must live on the output cluster): the group's lag is the "
    "query's, and it moves exactly when the batch becomes visible. Needs `checkpointLocation`, "
    "a group with no active members, and Read on the group",
    "",
)
GROUP_OPTIONS = (CONSUMER_GROUP,)
SPARK_CHECKPOINT = "checkpointlocation"  # Spark's own option, handed to every sink
_MAX_GROUP_LENGTH = 249  # as Kafka's topic names; groups have no stated limit, this keeps logs sane


@dataclass(frozen=True)
class GroupOptions:
    """Where a query's progress goes: consumer group `group`, from the offsets Spark records
    under `checkpoint`."""

    group: str
    checkpoint: str


def parse_group_options(options: Mapping[str, str], *, records_mode: bool) -> GroupOptions | None:
    """`consumerGroup` and the checkpoint it reads (options by lower-case name).

    Raises:
        ConfigError: the group is set where it cannot work, naming the option and why.
    """
    group = options.get(CONSUMER_GROUP.key, "").strip()
    if not group:
        return None
    if len(group) > _MAX_GROUP_LENGTH or any(c.isspace() or ord(c) < 32 for c in group):
        raise ConfigError(
            f"option {CONSUMER_GROUP} must be a consumer group name of at most "
            f"{_MAX_GROUP_LENGTH} characters without spaces, got {group!r}"
        )
    if not records_mode:
        raise ConfigError(
            f"option {CONSUMER_GROUP} is for records mode (option topic): files mode has no "
            f"transaction on the input's cluster to commit the offsets in"
        )
    checkpoint = options.get(SPARK_CHECKPOINT, "").strip()
    if not checkpoint:
        raise ConfigError(
            f"option {CONSUMER_GROUP} ({group}) needs the query's checkpointLocation as an "
            f"option of this writeStream (.option('checkpointLocation', ...)): the batch's "
            f"offsets are read from its offsets/ log; the session default "
            f"spark.sql.streaming.checkpointLocation is not handed to sinks"
        )
    return GroupOptions(group, checkpoint)
