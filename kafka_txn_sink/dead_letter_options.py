"""Options `badRows` and `deadLetterTopic`: what records mode does with a row it cannot write.

`badRows=fail` (the default) fails the batch at the first such row, as the sink always did.
`badRows=deadLetter` writes the row to `deadLetterTopic` instead, in the same transaction as the
batch's other rows (records/dead_letter.py; docs/plans/dead_letter.md lists the reasons), so a
read_committed reader sees each row once, in exactly one of the two topics.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from kafka_txn_sink.errors import ConfigError
from kafka_txn_sink.option import Option

FAIL, DEAD_LETTER = "fail", "deadletter"  # options arrive lower-cased

BAD_ROWS = Option(
    "badRows",
    "`fail`: a row the sink cannot write fails the batch; `deadLetter`: it goes to "
    "`deadLetterTopic` in the batch's transaction, with headers saying why (records mode; the "
    "reasons are in docs/formats.md); faults of the brokers or the registry still fail the batch",
    "`fail`",
)
DEAD_LETTER_TOPIC = Option(
    "deadLetterTopic",
    "the topic of the rows `badRows=deadLetter` sets aside; must exist (or `createTopics`) and "
    "differ from `topic` and `referencesTopic`",
    "",
    "with `badRows=deadLetter`",
)
DEAD_LETTER_OPTIONS = (BAD_ROWS, DEAD_LETTER_TOPIC)


@dataclass(frozen=True)
class DeadLetterOptions:
    """Where `badRows=deadLetter` writes the rows it sets aside."""

    topic: str


def parse_dead_letter_options(
    options: Mapping[str, str], records_mode: bool, reserved: Mapping[str, str | None]
) -> DeadLetterOptions | None:
    """The dead-letter settings; None with `badRows=fail`. Keys are lower-cased already;
    `reserved` maps each option naming a topic the dead-letter topic may not be to its value.

    Raises:
        ConfigError: an unknown `badRows`, a missing or reserved `deadLetterTopic`, a
            `deadLetterTopic` without `badRows=deadLetter`, or dead letters without records.
    """
    mode = options.get(BAD_ROWS.key, FAIL).strip().lower()
    topic = options.get(DEAD_LETTER_TOPIC.key, "").strip()
    if mode not in (FAIL, DEAD_LETTER):
        raise ConfigError(f"option {BAD_ROWS} must be fail or deadLetter, not {mode!r}")
    if mode == FAIL:
        if topic:
            raise ConfigError(f"option {DEAD_LETTER_TOPIC} needs option {BAD_ROWS}=deadLetter")
        return None
    if not records_mode:
        raise ConfigError(
            f"option {BAD_ROWS}=deadLetter is for records mode (option topic): files mode's rows "
            f"are checked against the file schema before any task runs"
        )
    if not topic:
        raise ConfigError(f"option {BAD_ROWS}=deadLetter needs option {DEAD_LETTER_TOPIC}")
    for name, value in reserved.items():
        if value is not None and value == topic:
            raise ConfigError(
                f"option {DEAD_LETTER_TOPIC} and option {name} name the same topic {topic!r}: "
                f"readers could not tell the rows set aside from the others"
            )
    return DeadLetterOptions(topic)
