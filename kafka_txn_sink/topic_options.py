"""Option `createTopics`: the sink's output topics created by the driver when the query starts.

The topics are option `topic` and, in files mode, option `referencesTopic` (a `topic` column's
topics are known only row by row, so they are never created). The driver creates a missing one
before any transaction opens (protocol/start.py), never a task; a topic that exists is left as
it is, with a warning when its partition count is not the one asked for.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from kafka_txn_sink.errors import ConfigError
from kafka_txn_sink.option import Option, truthy

CREATE_TOPICS = Option(
    "createTopics",
    "`true`: the driver creates option `topic` (and `referencesTopic`) at the start when missing "
    "(needs Create on the topic) and waits until the brokers list it; an existing topic is left "
    "as it is",
    "`false`",
)
CREATE_PARTITIONS = Option(
    "createTopics.partitions", "partitions of a topic createTopics creates", "the brokers'"
)
CREATE_REPLICATION = Option(
    "createTopics.replicationFactor",
    "replication factor of a topic createTopics creates",
    "the brokers'",
)
TOPIC_CONFIG = Option(
    "topic.config.*",
    "topic configs of a topic createTopics creates, e.g. `topic.config.retention.ms`",
)
TOPIC_OPTIONS = (CREATE_TOPICS, CREATE_PARTITIONS, CREATE_REPLICATION, TOPIC_CONFIG)
TOPIC_CONFIG_PREFIX = "topic.config."  # options arrive by lower-case name


@dataclass(frozen=True)
class TopicCreation:
    """How createTopics creates a missing topic (-1: the brokers' default)."""

    partitions: int = -1
    replication_factor: int = -1
    config: dict[str, str] = field(default_factory=dict)


def parse_topic_options(options: Mapping[str, str]) -> TopicCreation | None:
    """createTopics' settings; None without it. Keys are lower-cased already.

    Raises:
        ConfigError: a number is not a positive whole number, or a setting without
            createTopics.
    """
    config = {
        key[len(TOPIC_CONFIG_PREFIX) :]: value
        for key, value in options.items()
        if key.startswith(TOPIC_CONFIG_PREFIX)
    }
    if not truthy(options.get(CREATE_TOPICS.key, "false")):
        given = [o for o in (CREATE_PARTITIONS, CREATE_REPLICATION) if o.key in options]
        if given or config:
            names = [str(o) for o in given] + [f"{TOPIC_CONFIG_PREFIX}{k}" for k in config]
            raise ConfigError(f"option(s) {', '.join(names)} need option {CREATE_TOPICS}=true")
        return None
    return TopicCreation(
        partitions=_positive(options, CREATE_PARTITIONS),
        replication_factor=_positive(options, CREATE_REPLICATION),
        config=config,
    )


def _positive(options: Mapping[str, str], option: Option) -> int:
    raw = options.get(option.key, "").strip()
    if not raw:
        return -1
    try:
        value = int(raw)
    except ValueError:
        value = 0
    if value < 1:
        raise ConfigError(f"option {option} must be a whole number above 0, got {raw!r}")
    return value
