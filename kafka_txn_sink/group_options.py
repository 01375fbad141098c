"""Option `consumerGroup`: commit each batch's input offsets to a consumer group, with its output.

The offsets are the batch's end offsets in Spark's offset log (`<checkpointLocation>/offsets/N`),
so the option needs the query's `checkpointLocation` option (Spark hands it to the sink), a
streaming query (datasource.py refuses it in `df.write`) and records mode. By default the group
lives on the output cluster and the offsets join the batch's transactions
(protocol/progress.py); with `consumerGroup.kafka.bootstrap.servers` it lives on the input's own
cluster and they are committed after the batch's rows are visible (protocol/progress_across.py).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from kafka_txn_sink.errors import ConfigError
from kafka_txn_sink.kafka.security import option_settings
from kafka_txn_sink.option import Option

CONSUMER_GROUP = Option(
    "consumerGroup",
    "a consumer group to which each batch's input end offsets are committed inside the batch's "
    "transactions (input topics on the output cluster; else see `consumerGroup.kafka.*`): the "
    "group's lag is the query's, and it moves exactly when the batch becomes visible. Needs "
    "`checkpointLocation`, a group with no active members, and Read on the group",
    "",
)
GROUP_KAFKA = Option(
    "consumerGroup.kafka.*",
    "the group's own cluster, when the input topics live on another cluster than the output: "
    "`consumerGroup.kafka.bootstrap.servers` and that cluster's client settings as for `kafka.*` "
    "(SASL, TLS). The offsets are then committed once the batch's rows are visible, in a "
    "transaction of their own there: never ahead of the output, never back, but a moment after "
    "it (docs/consumer_groups.md)",
    "",
)
GROUP_OPTIONS = (CONSUMER_GROUP, GROUP_KAFKA)
GROUP_KAFKA_PREFIX = "consumergroup.kafka."  # options arrive by lower-case name
_GROUP_KAFKA_NAME = "consumerGroup.kafka."  # as users write it, for messages
# What progress_across.py sets for its transaction there.
_OWNED = frozenset(
    {
        "transactional.id",
        "enable.idempotence",
        "acks",
        "transaction.timeout.ms",
        "group.id",
        "isolation.level",
    }
)
SPARK_CHECKPOINT = "checkpointlocation"  # Spark's own option, handed to every sink
_MAX_GROUP_LENGTH = 249  # as Kafka's topic names; groups have no stated limit, this keeps logs sane


@dataclass(frozen=True)
class GroupOptions:
    """Where a query's progress goes: consumer group `group`, from the offsets Spark records
    under `checkpoint`."""

    group: str
    checkpoint: str
    bootstrap: str = ""  # the group's cluster; "": the output cluster
    kafka: dict[str, str] = field(default_factory=dict, repr=False)  # its settings (secrets)

    @property
    def elsewhere(self) -> bool:
        """The group lives on another cluster than the output: committed after the rows."""
        return bool(self.bootstrap)


def parse_group_options(options: Mapping[str, str], *, records_mode: bool) -> GroupOptions | None:
    """`consumerGroup` and the checkpoint it reads (options by lower-case name).

    Raises:
        ConfigError: the group is set where it cannot work, naming the option and why.
    """
    group = options.get(CONSUMER_GROUP.key, "").strip()
    if not group:
        stray = sorted(k for k in options if k.startswith(GROUP_KAFKA_PREFIX))
        if stray:
            raise ConfigError(
                f"option(s) {', '.join(stray)} name the cluster of option {CONSUMER_GROUP}, "
                f"which is not set"
            )
        return None
    if len(group) > _MAX_GROUP_LENGTH or any(c.isspace() or ord(c) < 32 for c in group):
        raise ConfigError(
            f"option {CONSUMER_GROUP} must be a consumer group name of at most "
            f"{_MAX_GROUP_LENGTH} characters without spaces, got {group!r}"
        )
    bootstrap, kafka = _group_cluster(options)
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
    return GroupOptions(group, checkpoint, bootstrap, kafka)


def _group_cluster(options: Mapping[str, str]) -> tuple[str, dict[str, str]]:
    """The `consumerGroup.kafka.*` settings: the group's bootstrap servers and the rest, checked
    as `kafka.*` is: the driver's kafka-python reads the group's offsets there too.

    Raises:
        ConfigError: see `security.client_settings`, or a setting the sink sets itself.
    """
    raw = {
        key[len(GROUP_KAFKA_PREFIX) :]: str(value)
        for key, value in options.items()
        if key.startswith(GROUP_KAFKA_PREFIX)
    }
    kafka = option_settings(raw, _GROUP_KAFKA_NAME)
    owned = sorted(k for k in kafka if k.lower() in _OWNED)
    if owned:
        raise ConfigError(
            f"option(s) {', '.join(GROUP_KAFKA_PREFIX + k for k in owned)} cannot be set: the "
            f"sink sets them for its own transaction on the group's cluster"
        )
    bootstrap = kafka.pop("bootstrap.servers", "").strip()
    if kafka and not bootstrap:
        raise ConfigError(
            f"options {', '.join(GROUP_KAFKA_PREFIX + k for k in sorted(kafka))} need "
            f"option {GROUP_KAFKA_PREFIX}bootstrap.servers, the consumer group's cluster"
        )
    return bootstrap, kafka
