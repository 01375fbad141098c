"""An option whose extra is not installed is refused when the options are parsed (the driver's
start), by name and with the `pip install` line; the CLI says the same for its commands.

A missing module is simulated by making `importlib.util.find_spec` find nothing for it.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from kafka_txn_sink import option_extras
from kafka_txn_sink.cli import main
from kafka_txn_sink.errors import ConfigError
from kafka_txn_sink.extras import EXTRAS, MissingExtraError
from kafka_txn_sink.kafka import client_versions
from kafka_txn_sink.option_extras import checked_options

BASE = {"kafka.bootstrap.servers": "127.0.0.1:9092", "sinkId": "orders", "commitLog": "/tmp/log"}
FILES = {"path": "/tmp/files", "referencesTopic": "refs"}


@pytest.fixture
def without(monkeypatch: pytest.MonkeyPatch) -> Callable[..., None]:
    """Make the named modules (and their submodules) unimportable as far as find_spec knows."""

    def hide(*names: str) -> None:
        real = importlib.util.find_spec

        def find_spec(name: str, package: str | None = None) -> object:
            if name.split(".")[0] in names:
                return None
            return real(name, package)

        monkeypatch.setattr(importlib.util, "find_spec", find_spec)

    return hide


def test_the_core_options_need_no_extra(without: Callable[..., None]) -> None:
    without(*{module for modules in EXTRAS.values() for module in modules})

    options = checked_options({**BASE, "topic": "out"})

    assert option_extras.needs(options) == []


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (
            {"commitLog": "s3://bucket/log"},
            "option commitLog=s3://... needs the s3 extra (boto3, botocore not installed): "
            "pip install 'kafka-txn-sink[s3]'",
        ),
        (
            {"commitLogFormat": "delta"},
            "option commitLogFormat=delta needs the delta extra (deltalake not installed): "
            "pip install 'kafka-txn-sink[delta]'",
        ),
        (
            {"kafka.ssl.keystore.location": "/etc/keystore.p12", "kafka.security.protocol": "SSL"},
            "option kafka.ssl.keystore.location needs the keystore extra (cryptography not "
            "installed): pip install 'kafka-txn-sink[keystore]'",
        ),
    ],
)
def test_an_option_without_its_extra_is_refused_by_name_with_the_install_line(
    without: Callable[..., None], options: dict[str, str], message: str
) -> None:
    without("boto3", "botocore", "deltalake", "cryptography")

    with pytest.raises(MissingExtraError) as raised:
        checked_options({**BASE, **options})

    assert str(raised.value) == message


def test_files_mode_on_s3_names_both_extras_in_one_install_line(
    without: Callable[..., None],
) -> None:
    without("fastavro", "boto3")

    with pytest.raises(MissingExtraError) as raised:
        checked_options({**BASE, **FILES, "path": "s3://bucket/files"})

    assert str(raised.value) == (
        "option path (files mode) needs the files extra (fastavro not installed); "
        "option path=s3://... needs the s3 extra (boto3 not installed): "
        "pip install 'kafka-txn-sink[files,s3]'"
    )


def test_an_installed_extra_passes(without: Callable[..., None]) -> None:
    without("deltalake")  # not needed by these options

    options = checked_options({**BASE, **FILES, "commitLog": "s3://bucket/log"})

    assert [extra for _, extra in option_extras.needs(options)] == ["s3", "files"]


def test_the_cli_names_the_extra_of_an_s3_log(
    without: Callable[..., None], capsys: pytest.CaptureFixture[str]
) -> None:
    without("boto3", "botocore")

    code = main(["log", "list", "--log", "s3://bucket/log"])

    err = capsys.readouterr().err
    assert code == 2
    assert "--log=s3://... needs the s3 extra (boto3, botocore not installed)" in err
    assert "pip install 'kafka-txn-sink[s3]'" in err


def test_the_cli_verify_command_names_its_extra(
    without: Callable[..., None], capsys: pytest.CaptureFixture[str]
) -> None:
    without("numpy")

    code = main(["verify", "--bootstrap", "127.0.0.1:1", "--input-topic", "in"])

    err = capsys.readouterr().err
    assert code == 2
    assert "kafka-txn-sink verify needs the verify extra (numpy not installed)" in err
    assert "pip install 'kafka-txn-sink[verify]'" in err


@pytest.mark.parametrize(
    ("distribution", "found", "refused"),
    [
        ("confluent-kafka", "2.6.1", True),
        ("confluent-kafka", "2.7.0", False),
        ("confluent-kafka", "2.99.1", False),
        ("confluent-kafka", "3.0.0", True),
        ("kafka-python", "2.3.3", True),
        ("kafka-python", "3.0.0", False),
        ("kafka-python", "3.0.12", False),
        ("kafka-python", "3.1.0rc1", True),
    ],
)
def test_a_kafka_client_outside_the_tested_range_is_refused_by_name(
    monkeypatch: pytest.MonkeyPatch, distribution: str, found: str, refused: bool
) -> None:
    real = client_versions.installed_version
    monkeypatch.setattr(
        client_versions,
        "installed_version",
        lambda name: found if name == distribution else real(name),
    )
    client_versions.check_clients.cache_clear()

    if not refused:
        checked_options({**BASE, "topic": "out"})
        return
    with pytest.raises(ConfigError) as raised:
        checked_options({**BASE, "topic": "out"})
    supported = next(s for s in client_versions.CLIENTS if s.distribution == distribution)
    assert str(raised.value) == (
        f"{distribution} {found} is installed, but the sink is tested with {distribution} "
        f">={supported.low},<{supported.high} only (it relies on its internals): "
        f"pip install '{supported.requirement}'"
    )


def test_the_cli_refuses_an_untested_client_before_running(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(client_versions, "installed_version", lambda name: "1.0.0")
    client_versions.check_clients.cache_clear()

    code = main(["log", "list", "--log", "/nonexistent"])

    assert code == 2
    assert "confluent-kafka 1.0.0 is installed, but the sink is tested with" in (
        capsys.readouterr().err
    )


def test_the_ranges_of_pyproject_are_the_checked_ones() -> None:
    tomllib = pytest.importorskip("tomllib")
    pyproject = tomllib.loads((Path(__file__).parents[2] / "pyproject.toml").read_text())
    optional = pyproject["project"]["optional-dependencies"]
    declared = [*pyproject["project"]["dependencies"], *optional["files"]]

    for supported in [*client_versions.CLIENTS, client_versions.POLARS_AVRO]:
        assert supported.requirement in declared


def test_the_version_check_loads_neither_kafka_python_nor_package_metadata() -> None:
    """A batch's planner and commit worker are often new Python processes, and both check the
    options at their start: importing kafka-python (about 130 ms) or importlib.metadata with
    its email parser (about 10 ms, and 5 ms to scan sys.path) would be paid before each such
    batch (docs/performance.md)."""
    code = (
        "import sys, pyspark.worker; "
        "from kafka_txn_sink.option_extras import checked_options; "
        f"checked_options({{**{BASE!r}, 'topic': 'out'}}); "
        "print([m for m in ('kafka', 'importlib.metadata') if m in sys.modules])"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"


@pytest.mark.parametrize("distribution", ["confluent-kafka", "kafka-python"])
def test_the_version_read_is_the_installed_distributions(distribution: str) -> None:
    from importlib import metadata

    assert client_versions.installed_version(distribution) == metadata.version(distribution)


def test_kafka_pythons_version_is_read_from_the_package_that_would_be_imported(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    (tmp_path / "kafka").mkdir()
    (tmp_path / "kafka" / "__init__.py").write_text("raise ImportError('never imported')\n")
    (tmp_path / "kafka" / "version.py").write_text("__version__ = '2.0.2'\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "kafka", raising=False)  # another test's import
    client_versions.check_clients.cache_clear()

    assert client_versions.installed_version("kafka-python") == "2.0.2"
    with pytest.raises(ConfigError, match=r"^kafka-python 2\.0\.2 is installed, but the sink"):
        client_versions.check_clients()
