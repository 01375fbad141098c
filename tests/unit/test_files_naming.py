"""Files mode's one file-name grammar: what is built parses back, and what each name is."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kafka_txn_sink.files.naming import (
    FileName,
    FileNaming,
    base_name,
    is_data_file,
    is_schema_file,
    is_temp,
    parse_file_name,
    schema_file_name,
    stored_name,
    temp_name,
    temp_target,
)

PARTITION_PATHS = st.sampled_from(["", "user=ann", "user=a%2Fb/date=2026-11-21/hour=05"])


def test_a_data_file_name_pads_every_number() -> None:
    naming = FileNaming(12, 3, 1, token="0123abcd")
    assert naming.name(4) == "part-0000000012-00003-001-00004-0123abcd.avro"


def test_sync_markers_ignore_the_attempt_and_token_but_not_the_file() -> None:
    naming = FileNaming(12, 3, 1, token="0123abcd")
    assert len(naming.sync_marker(4)) == 16
    assert naming.sync_marker(4) == FileNaming(12, 3, 2).sync_marker(4)
    assert naming.sync_marker(4) != naming.sync_marker(5)
    assert naming.sync_marker(4) != FileNaming(13, 3, 1).sync_marker(4)


def test_each_naming_draws_a_fresh_token() -> None:
    assert FileNaming(1, 1, 0).token != FileNaming(1, 1, 0).token


@given(
    batch=st.integers(0, 10**12),
    partition=st.integers(0, 10**6),
    attempt=st.integers(0, 10**4),
    seq=st.integers(0, 10**6),
    token=st.text("0123456789abcdef", min_size=1, max_size=12),
    directory=PARTITION_PATHS,
)
def test_built_names_parse_back(
    batch: int, partition: int, attempt: int, seq: int, token: str, directory: str
) -> None:
    name = FileNaming(batch, partition, attempt, token).name(seq)
    expected = FileName(batch, partition, attempt, seq, token)
    stored = stored_name(directory, name)

    assert str(expected) == name
    assert parse_file_name(name) == expected
    assert parse_file_name(stored) == expected
    assert parse_file_name(f"s3://bucket/prefix/{stored}") == expected
    # A local upload's temporary that a crash left behind names the same file.
    temporary = stored_name(directory, temp_name(name))
    assert parse_file_name(temporary) == expected
    assert is_data_file(stored) and is_data_file(temporary)
    assert is_temp(temporary) and not is_temp(stored)
    assert not is_schema_file(stored)


@pytest.mark.parametrize(
    "name",
    [
        "part-notes.avro",
        "part-0000000012-00003-001-00004-0123ABCD.avro",  # upper-case token
        "part-000000012-00003-001-00004-0123abcd.avro",  # batch of 9 digits
        "part-0000000012-00003-001-00004-0123abcd.avro.crc",
        "_schemas/0123.avsc",
        ".part-0000000012-00003-001-00004-0123abcd.avro",  # hidden, but no temporary
    ],
)
def test_other_names_are_not_this_sinks_data_files(name: str) -> None:
    assert parse_file_name(name) is None


def test_temporaries_name_their_target() -> None:
    first, second = temp_name("f.avro"), temp_name("f.avro")
    assert first != second
    assert first.startswith(".f.avro.") and first.endswith(".tmp")
    assert temp_target(first) == "f.avro"
    assert temp_target("f.avro") is None
    assert temp_target(".f.avro.tmp") is None  # no random part


def test_stored_schemas_are_never_data() -> None:
    name = schema_file_name("ab" * 32)
    assert name == f"_schemas/{'ab' * 32}.avsc"
    assert is_schema_file(name)
    assert not is_data_file(name)
    assert not is_data_file(f"_schemas/{temp_name('x.avsc')}")


@pytest.mark.parametrize(
    ("name", "data"),
    [
        ("x.avro", True),  # any Avro file under the path counts as data, as vacuum always did
        ("user=a/part-0000000001-00000-000-00000-aaaaaaaa.avro", True),
        ("user=a/.part-0000000001-00000-000-00000-aaaaaaaa.avro.0a1b2c3d4e5f.tmp", True),
        ("user=a/.notes.txt.0a1b.tmp", False),
        ("user=a/.hidden.avro", False),
        ("README.md", False),
        ("_schemas/x.avro", False),
    ],
)
def test_what_counts_as_data(name: str, data: bool) -> None:
    assert is_data_file(name) is data


def test_names_under_the_root() -> None:
    assert stored_name("", "f.avro") == "f.avro"
    assert stored_name("user=a/d=1", "f.avro") == "user=a/d=1/f.avro"
    assert base_name("s3://b/p/user=a/f.avro") == "f.avro"
    assert base_name("f.avro") == "f.avro"
