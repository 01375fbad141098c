"""How the CLI prints: one JSON document for scripts, or rich tables for people."""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import datetime, timezone
from typing import Any

from rich.console import Console

Payload = dict[str, Any]


def console() -> Console:
    """A console for stdout, as wide as its terminal, or 160 columns when piped."""
    out = Console(highlight=False)
    if not out.is_terminal:
        # Piped or captured: rich would assume 80 columns and fold the tables.
        out.width = 160
    return out


class Output:
    """Either one JSON document on stdout, or rich tables and lines."""

    def __init__(self, json_mode: bool) -> None:
        self.json_mode = json_mode
        self.console = console()

    def emit(self, payload: Payload, render: Callable[[Payload, Console], None]) -> None:
        """Print `payload` as JSON, or let `render` draw it."""
        if self.json_mode:
            print(json.dumps(payload, indent=2, sort_keys=True))
        else:
            render(payload, self.console)


def iso(ms: int | None) -> str:
    """A time in epoch milliseconds as UTC ISO 8601 to the second; "-" for none."""
    if ms is None or ms < 0:
        return "-"
    return datetime.fromtimestamp(ms / 1000, tz=timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def age_s(since_ms: int, now: int) -> float | None:
    """Seconds from `since_ms` to `now`, to a tenth; None when `since_ms` is unknown (< 0)."""
    return round((now - since_ms) / 1000, 1) if since_ms >= 0 else None
