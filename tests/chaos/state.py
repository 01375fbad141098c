"""The suite's resumable state (DIR/state.json) and what one run's trials share."""

from __future__ import annotations

import json
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console

from kafka_txn_sink.commit_log import LogFormat
from tests.chaos.bed import Bed, Sink, write_json
from tests.chaos.query import QuerySpec
from tests.chaos.schedule import Fault
from tests.s3_proxy import SequencedProxy

# 2: the kinds of issue 14 (second driver, freeze, late attempt, coordinator);
# 3: issue 24 (inflight, the commit log's format)
STATE_VERSION = 3


@dataclass
class State:
    """DIR/state.json: the run's seed, schedule and sink, and every finished trial."""

    directory: Path
    body: dict[str, Any]

    @classmethod
    def open(
        cls, directory: Path, seed: int, schedule: Sequence[Fault], log: LogFormat = "json"
    ) -> State:
        path = directory / "state.json"
        planned = [f.to_json() for f in schedule]
        if not path.exists():
            body = {
                "version": STATE_VERSION,
                "seed": seed,
                "schedule": planned,
                "name": uuid.uuid4().hex[:10],
                "log": log,
                "results": {},
                "checks": [],
                "created": False,
                "s3_saved": True,
            }
            state = cls(directory, body)
            state.save()
            return state
        body = json.loads(path.read_text())
        made_with = (body.get("seed"), body.get("schedule"), body.get("log", "json"))
        if made_with != (seed, planned, log):
            raise SystemExit(
                f"{path} was made with seed {body.get('seed')}, "
                f"{len(body.get('schedule', []))} trials and the {body.get('log', 'json')} log; "
                f"use the same --seed, --trials, --kinds and --log to resume, or another --state "
                f"directory"
            )
        return cls(directory, body)

    def save(self) -> None:
        write_json(self.directory / "state.json", self.body)

    def done(self, index: int) -> bool:
        return str(index) in self.body["results"]

    def record(self, result: dict[str, Any]) -> None:
        self.body["results"][str(result["index"])] = result
        self.save()

    def set(self, key: str, value: Any) -> None:
        self.body[key] = value
        self.save()

    @property
    def results(self) -> list[dict[str, Any]]:
        return [self.body["results"][k] for k in sorted(self.body["results"], key=int)]


@dataclass
class Context:
    bed: Bed
    sink: Sink
    spec: QuerySpec
    state: State
    console: Console
    ready: bool = False  # the bucket holds the run's objects: safe to mirror
    proxy: SequencedProxy | None = None  # inflight: the S3 proxy of the query running now

    @property
    def directory(self) -> Path:
        return self.state.directory
