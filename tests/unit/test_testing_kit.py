"""The users' test kit (kafka_txn_sink.testing) without a broker: what a user sees when Java or
Maven is missing, that its pytest plugin costs nothing until a fixture is asked for, the order
of partition columns, and that the Databricks example's job definition fits its script.

The kit working end to end (broker, S3, Spark, chispa, from the installed wheel) is shown by
the example tests that ci/check_wheel.sh runs.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import yaml

import kafka_txn_sink
from kafka_txn_sink import testing
from kafka_txn_sink.protocol.messages import FileRef
from kafka_txn_sink.testing.readers import partition_names

ROOT = Path(__file__).resolve().parents[2]
DATABRICKS = ROOT / "examples" / "databricks"


@pytest.fixture
def no_tools(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """An environment without java nor mvn on PATH, no JAVA_HOME, an empty jar cache."""
    empty = tmp_path / "empty_bin"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    monkeypatch.delenv("JAVA_HOME", raising=False)
    monkeypatch.delenv("KTS_KAFKA_BOOTSTRAP", raising=False)
    monkeypatch.setenv("KTS_CACHE", str(tmp_path / "cache"))
    return dict(os.environ)


def test_a_broker_without_java_fails_saying_so(no_tools: dict[str, str], tmp_path: Path) -> None:
    with pytest.raises(testing.TestbedError, match=r"Java \(java\) is not on PATH.*Kafka's broker"):
        testing.KafkaBroker(tmp_path / "broker").start()


def test_jars_without_maven_fail_saying_so(no_tools: dict[str, str]) -> None:
    with pytest.raises(testing.TestbedError, match=r"Maven \(mvn\) is not on PATH.*Maven Central"):
        testing.kafka_jars()


def test_the_schema_registry_without_maven_fails_saying_so(no_tools: dict[str, str],
                                                         tmp_path: Path) -> None:
    with pytest.raises(testing.TestbedError, match=r"Maven \(mvn\) is not on PATH.*Registry"):
        testing.SchemaRegistry(tmp_path / "registry").start()


USER_TESTS = """
import sys


def test_nothing_costly_was_loaded():
    assert not {"pyspark", "confluent_kafka", "boto3", "moto"} & set(sys.modules)


def test_wants_a_broker(kts_kafka):
    raise AssertionError("not reached: there is no Java")
"""


def test_the_plugin_is_idle_until_asked_and_then_fails_clearly(
    no_tools: dict[str, str], tmp_path: Path
) -> None:
    (tmp_path / "test_user.py").write_text(USER_TESTS)
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "kafka_txn_sink.testing.plugin",
         "-p", "no:cacheprovider", "-q", "test_user.py"],
        cwd=tmp_path, env=no_tools, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip

    out = done.stdout
    assert "1 passed, 1 error" in out, out
    assert "kafka_txn_sink.testing: Java (java) is not on PATH" in out, out
    assert "skipped" not in out and "Traceback" not in out, out


def ref(partition_path: str, values: dict[str, str | None]) -> FileRef:
    return FileRef(f"/data/{partition_path}/part.avro", partition_path, values, 1, 10, "0" * 16)


def test_partition_columns_come_in_directory_order() -> None:
    refs = [
        ref("", {}),
        ref("user=a%2Fb/date=2026-11-21/hour=05",
            {"date": "2026-11-21", "hour": "05", "user": "a/b"}),
        ref("user=__HIVE_DEFAULT_PARTITION__/date=2026-11-22/hour=00",
            {"date": "2026-11-22", "hour": "00", "user": None}),
    ]  # fmt: skip

    assert partition_names(refs) == ["user", "date", "hour"]


def load_job() -> ModuleType:
    spec = importlib.util.spec_from_file_location("orders_job", DATABRICKS / "orders_job.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def bundle_tasks() -> list[tuple[dict[str, Any], dict[str, Any]]]:
    bundle = yaml.safe_load((DATABRICKS / "databricks.yml").read_text())
    return [(job, task) for job in bundle["resources"]["jobs"].values() for task in job["tasks"]]


def test_the_bundle_runs_the_job_script_with_parameters_it_accepts() -> None:
    job = load_job()
    tasks = bundle_tasks()

    assert len(tasks) == 2
    for _, task in tasks:
        python_task = task["spark_python_task"]
        assert (DATABRICKS / python_task["python_file"]).is_file()
        args = job.parse_args(python_task["parameters"])
        assert args.commit_log.endswith("/_log") and args.checkpoint.endswith("/checkpoint")
        assert all(v.count("=") >= 1 for v in args.source_option + args.sink_option)


def test_the_bundle_installs_the_wheel_of_this_version() -> None:
    wheel = f"./dist/kafka_txn_sink-{kafka_txn_sink.__version__}-py3-none-any.whl"
    libraries: list[str] = []
    for job, task in bundle_tasks():
        libraries += [lib["whl"] for lib in task.get("libraries", [])]
        for environment in job.get("environments", []):
            libraries += environment["spec"]["dependencies"]

    assert libraries == [wheel, wheel]


WITHOUT_PYSPARK = """
import sys


class NoPySpark:
    def find_spec(self, name, path=None, target=None):
        if name == "pyspark" or name.startswith("pyspark."):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)


sys.meta_path.insert(0, NoPySpark())
from kafka_txn_sink.testing import TestbedError, local_spark

try:
    local_spark([])
except TestbedError as exc:
    print(exc)
"""


def test_a_session_without_pyspark_says_which_extra_to_install() -> None:
    done = subprocess.run(
        [sys.executable, "-c", WITHOUT_PYSPARK], capture_output=True, text=True, timeout=120,
        check=False,
    )  # fmt: skip

    assert done.returncode == 0, done.stderr
    assert "PySpark is not installed" in done.stdout
    assert "kafka-txn-sink[spark,testing]" in done.stdout


def test_kill_tree_kills_processes_that_left_the_group(tmp_path: Path) -> None:
    """As PySpark's daemons do (setsid): the group alone would leave them running."""
    from kafka_txn_sink.testing.processes import descendants, kill_tree, running, spawn

    script = "setsid sleep 300 & sleep 300 & wait"
    proc = spawn(["bash", "-c", script], tmp_path / "tree.log", tmp_path, detached=False)
    testing.wait_for(lambda: True if len(descendants(proc.pid)) == 2 else None, 30,
                     "two children")
    below = descendants(proc.pid)
    assert len({os.getpgid(pid) for pid in below}) == 2  # one child left the group

    killed = kill_tree(proc)

    assert killed[0] == proc.pid and set(killed[1:]) == set(below)
    assert not any(running(pid) for pid in killed)


def test_ports_of_the_bed_are_not_ones_the_kernel_lends_to_outgoing_connections() -> None:
    # A port from bind(0) is one of the kernel's ephemeral ports: a client's outgoing connection
    # may take it before the broker binds it (a CI run failed on "Address already in use").
    from kafka_txn_sink.testing.processes import free_port

    low, _high = (int(part) for part in
                  Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
    ports = [free_port() for _ in range(50)]
    assert all(1024 < port < low for port in ports), ports
    assert len(set(ports)) == len(ports), "a port was lent twice in one process"
