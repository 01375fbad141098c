"""One option of the sink: its name as users write it and what the README says of it.

Every option is an `Option` in the table of the module that owns it (options.py for the sink,
files_options.py for files mode, serde/options.py for records mode's formats and the Schema
Registry, group_options.py for option consumerGroup); options.py
collects them into one table, from which parsing, errors and the README's tables come.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Group = Literal["sink", "files", "registry"]


@dataclass(frozen=True)
class Option:
    """One option: its name as users write it, and what the README says of it."""

    name: str
    meaning: str
    default: str = ""  # as the README shows it; "" for none
    required: str = "no"
    group: Group = "sink"

    @property
    def key(self) -> str:
        """The name as Spark hands it over case-insensitively (lower case)."""
        return self.name.lower()

    def __str__(self) -> str:
        return self.name


def truthy(value: str) -> bool:
    """An option's yes: true, 1 or yes, in any case."""
    return value.strip().lower() in {"true", "1", "yes"}
