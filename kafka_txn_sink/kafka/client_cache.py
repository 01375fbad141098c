"""Clients kept for the life of a process, one per connection settings.

Spark reuses its planner and commit-worker Python processes from batch to batch, so a client
made once serves every batch there. A client is dropped after a failure, so the next caller
starts from a fresh one; clients of a forked parent are never handed to the child.
"""

from __future__ import annotations

import atexit
import os
import threading
from collections.abc import Callable, Mapping
from typing import Any, Generic, TypeVar

C = TypeVar("C")


class ClientCache(Generic[C]):
    """Clients of one kind, one per process and connection settings."""

    def __init__(
        self, make: Callable[[str, Mapping[str, str], int], C], close: Callable[[C], None]
    ):
        self._make = make
        self._close = close
        self._clients: dict[tuple[Any, ...], C] = {}
        self._lock = threading.Lock()
        atexit.register(self.close_all)

    def get(self, bootstrap: str, kafka: Mapping[str, str], timeout_ms: int) -> C:
        """The client for these settings, made on first use."""
        key = (os.getpid(), bootstrap, tuple(sorted(kafka.items())), timeout_ms)
        with self._lock:
            found = self._clients.get(key)
            if found is None:
                found = self._clients[key] = self._make(bootstrap, kafka, timeout_ms)
            return found

    def discard(self, client: C) -> None:
        """Forget `client` (if it is one of ours) and close it."""
        with self._lock:
            for key, value in list(self._clients.items()):
                if value is client:
                    del self._clients[key]
        self._close(client)

    def close_all(self) -> None:
        """Close every client this process made (at exit)."""
        with self._lock:
            mine = [c for k, c in self._clients.items() if k[0] == os.getpid()]
            self._clients.clear()
        for client in mine:
            self._close(client)
