"""The commit log's contract on a local directory, for the JSON and the Delta format."""

from __future__ import annotations

from pathlib import Path

import pytest

from kafka_txn_sink.commit_log import LOG_FORMATS
from tests.commit_log_contract import CommitLogContract, LogPlace


class TestLocalCommitLog(CommitLogContract):
    """Every promise of `CommitLog`, in a local directory."""

    @pytest.fixture(params=LOG_FORMATS)
    def place(self, request: pytest.FixtureRequest, tmp_path: Path) -> LogPlace:
        location = tmp_path / "log"
        return LogPlace(request.param, str(location), location.as_uri())
