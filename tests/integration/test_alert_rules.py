"""The alert rules of examples/prometheus, checked and evaluated by Prometheus' own promtool
(Debian's package, from the test bed): each alert fires on the series its test case says, at
the time it says, with its summary and description rendered, and stays quiet otherwise."""

from __future__ import annotations

import subprocess
from pathlib import Path

from kafka_txn_sink.testing.prometheus import promtool

RULES = Path(__file__).resolve().parents[2] / "examples" / "prometheus"


def _promtool(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(promtool()), *args], cwd=RULES, capture_output=True, text=True, timeout=120
    )


def test_the_rules_file_is_valid() -> None:
    checked = _promtool("check", "rules", "kafka_txn_sink_rules.yml")
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "SUCCESS: 6 rules found" in checked.stdout


def test_each_alert_fires_when_and_only_when_its_case_says() -> None:
    tested = _promtool("test", "rules", "kafka_txn_sink_rules_test.yml")
    assert tested.returncode == 0, tested.stdout + tested.stderr
