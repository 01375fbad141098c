"""Where rows go when the input has a `topic` column, on a real broker and real Spark (batch
writes, tests/e2e/batch_job.py): option `topic` wins over the column, as in Spark's own Kafka
sink, on the row writer and the Arrow writer; and no row ever reaches files mode's
`referencesTopic`, whose messages a consumer takes as file references."""

from __future__ import annotations

import uuid

import pytest

from kafka_txn_sink.testing.topics import read_topic
from tests.e2e.harness import Pipeline, assert_exactly_once, create_topics
from tests.e2e.test_batch_writes import IDS, run_write, with_files
from tests.e2e.test_files_mode import assert_files_exactly_once, logged_files

pytestmark = [pytest.mark.kafka, pytest.mark.spark]


@pytest.mark.parametrize("writer", ["arrow", pytest.param("rows", marks=pytest.mark.full)])
def test_the_topic_option_wins_over_a_topic_column(pipeline: Pipeline, writer: str) -> None:
    decoy = f"decoy_{uuid.uuid4().hex[:8]}"
    create_topics(pipeline.bootstrap, 3, decoy)
    pipeline.select = ["key", "value", f"'{decoy}' AS topic"]
    arrow = "1" if writer == "arrow" else "0"

    outcome = run_write(pipeline, "routed", env={"KTS_ARROW_WRITER": arrow})

    assert outcome.returncode == 0, outcome.error
    assert_exactly_once(pipeline, IDS)  # every row on the option's topic, once
    assert read_topic(pipeline.bootstrap, decoy, "read_uncommitted") == []


@pytest.mark.full  # CI: the topic option wins over a topic column
def test_a_topic_column_naming_the_references_topic_reaches_only_the_option_topic(
    pipeline: Pipeline,
) -> None:
    with_files(pipeline)
    references = pipeline.options["referencesTopic"]
    pipeline.select = [*pipeline.select, f"'{references}' AS topic"]

    outcome = run_write(pipeline, "forged")

    assert outcome.returncode == 0, outcome.error
    assert_exactly_once(pipeline, IDS)
    assert_files_exactly_once(pipeline, IDS)
    published = read_topic(pipeline.bootstrap, references, "read_uncommitted")
    assert len(published) == len(logged_files(pipeline)), "only file references are there"


def test_the_topic_option_naming_the_references_topic_is_refused(pipeline: Pipeline) -> None:
    with_files(pipeline)
    pipeline.options["referencesTopic"] = pipeline.output

    outcome = run_write(pipeline, "refused")

    assert outcome.returncode == 3
    assert "ConfigError" in outcome.error
    assert "option topic" in outcome.error and "option referencesTopic" in outcome.error
    assert read_topic(pipeline.bootstrap, pipeline.output, "read_uncommitted") == []
