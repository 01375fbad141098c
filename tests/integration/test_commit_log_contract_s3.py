"""The commit log's contract on the test bed's S3 server, for the JSON and the Delta format."""

from __future__ import annotations

import pytest

from kafka_txn_sink.commit_log import LOG_FORMATS
from kafka_txn_sink.storage import S3Settings
from tests.commit_log_contract import CommitLogContract, LogPlace

pytestmark = pytest.mark.s3


class TestS3CommitLog(CommitLogContract):
    """Every promise of `CommitLog`, under an S3 prefix."""

    @pytest.fixture(params=LOG_FORMATS)
    def place(
        self, request: pytest.FixtureRequest, s3_bucket: str, s3_settings: S3Settings
    ) -> LogPlace:
        uri = f"s3://{s3_bucket}/sinks/orders/_log"
        return LogPlace(request.param, uri, uri, s3_settings)
