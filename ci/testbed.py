"""Test bed of kafka_txn_sink, from real parts only (DESIGN.md section 6).

- Apache Kafka's own broker (KRaft, one node) from jars that Maven resolves from Maven Central.
- An S3-compatible HTTP server: moto in server mode.
- The Spark packages (Kafka source/sink, Avro) that pyspark does not ship.

Everything binds 127.0.0.1 only; every wait is bounded; every process started here is ended at
exit unless it was started detached (``up``).

Importable (``tests/conftest.py`` puts ``ci/`` on ``sys.path``) and a command line::

    python ci/testbed.py fetch [--kafka-version V]   # resolve all jars into the cache
    python ci/testbed.py up [--dir D]                # broker + S3 in the background, D/env
    python ci/testbed.py down [--dir D]              # stop them

Standard library only at import time; ``confluent_kafka`` is imported where a broker is probed.
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any, TypeVar

REPO_ROOT = Path(__file__).resolve().parent.parent
CI_DIR = REPO_ROOT / "ci"
POMS_DIR = CI_DIR / "poms"
VERSIONS_FILE = CI_DIR / "versions.env"
MAVEN_SETTINGS = CI_DIR / "maven-settings.xml"
DEFAULT_UP_DIR = REPO_ROOT / ".testbed"
LOOPBACK = "127.0.0.1"
MARKER = ".complete"

T = TypeVar("T")


class TestbedError(RuntimeError):
    """A part of the test bed could not be fetched, started or reached in time."""


# --------------------------------------------------------------------------------------------
# Versions and cache
# --------------------------------------------------------------------------------------------


def read_versions(path: Path = VERSIONS_FILE) -> dict[str, str]:
    """The KEY=VALUE pairs of ci/versions.env (comments and blank lines ignored)."""
    pairs: dict[str, str] = {}
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith("#") or "=" not in line:
            continue
        key, _, value = line.partition("=")
        pairs[key.strip()] = value.strip().strip("'\"")
    return pairs


def pinned(key: str) -> str:
    """One pinned version from ci/versions.env; fails loudly when it is missing."""
    versions = read_versions()
    if key not in versions:
        raise TestbedError(f"{key} is not set in {VERSIONS_FILE}")
    return versions[key]


def default_kafka_version() -> str:
    """``$KTS_KAFKA_VERSION`` or KAFKA_VERSION of ci/versions.env."""
    return os.environ.get("KTS_KAFKA_VERSION") or pinned("KAFKA_VERSION")


SPARK_PACKAGES = {
    # pom property: (versions.env key, env override); each defaults to SPARK_VERSION.
    "spark.kafka.version": ("SPARK_KAFKA_VERSION", "KTS_SPARK_KAFKA_VERSION"),
    "spark.token.version": ("SPARK_TOKEN_PROVIDER_VERSION", "KTS_SPARK_TOKEN_PROVIDER_VERSION"),
    "spark.avro.version": ("SPARK_AVRO_VERSION", "KTS_SPARK_AVRO_VERSION"),
}


def spark_package_versions() -> dict[str, str]:
    """Versions of spark-sql-kafka-0-10, its token provider and spark-avro (pom properties)."""
    versions = read_versions()
    base = pinned("SPARK_VERSION")
    return {
        prop: os.environ.get(env) or versions.get(key) or base
        for prop, (key, env) in SPARK_PACKAGES.items()
    }


def cache_dir() -> Path:
    """``$KTS_CACHE`` or ``~/.cache/kafka_txn_sink``."""
    env = os.environ.get("KTS_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "kafka_txn_sink"


# --------------------------------------------------------------------------------------------
# Bounded waiting
# --------------------------------------------------------------------------------------------


def wait_for(
    probe: Callable[[], T | None],
    timeout: float,
    what: str,
    interval: float = 0.5,
    on_timeout: Callable[[], str] = lambda: "",
) -> T:
    """Call ``probe`` until it returns something other than None, or raise after ``timeout``.

    Exceptions from ``probe`` count as "not yet"; the last one is reported on timeout.
    """
    deadline = time.monotonic() + timeout
    last_error = ""  # a repr only: a kept exception would keep the probe's clients alive
    while True:
        try:
            result = probe()
        except TestbedError:
            raise
        except Exception as exc:
            last_error, result = repr(exc), None
        if result is not None:
            return result
        if time.monotonic() >= deadline:
            detail = f"; last error: {last_error}" if last_error else ""
            raise TestbedError(f"timed out after {timeout:.0f}s waiting for {what}{detail}\n"
                               + on_timeout())
        time.sleep(interval)


def free_port() -> int:
    """A currently free TCP port on the loopback address."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((LOOPBACK, 0))
        return int(sock.getsockname()[1])


def tail(path: Path, lines: int = 50) -> str:
    """The last ``lines`` lines of a text file, or a note that it does not exist."""
    if not path.exists():
        return f"({path} does not exist)"
    text = path.read_text(errors="replace").splitlines()[-lines:]
    return f"--- last {len(text)} lines of {path} ---\n" + "\n".join(text)


# --------------------------------------------------------------------------------------------
# Jars (Maven)
# --------------------------------------------------------------------------------------------


def _mvn_copy_dependencies(pom: Path, props: Mapping[str, str], out: Path) -> list[Path]:
    """Resolve ``pom``'s runtime dependencies into ``out`` once; a marker records success.

    Maven writes into a private staging directory that is renamed into place, so concurrent
    runs (set-up and a test session) never see half a directory."""
    if (out / MARKER).exists():
        return sorted(out.glob("*.jar"))
    mvn = shutil.which("mvn")
    if mvn is None:
        raise TestbedError("Maven (mvn) is not on PATH: it resolves the test bed's jars")
    settings = ["-s", str(MAVEN_SETTINGS)] if MAVEN_SETTINGS.exists() else []
    staging = out.with_name(f"{out.name}.partial-{os.getpid()}")
    errors: list[str] = []
    for extra in ([], ["-U"]):  # -U only on retry: re-check what a failed run cached
        shutil.rmtree(staging, ignore_errors=True)
        cmd = [
            mvn, "-q", "-B", *settings, *extra, "dependency:copy-dependencies", "-f", str(pom),
            *(f"-D{key}={value}" for key, value in props.items()),
            "-DincludeScope=runtime", f"-DoutputDirectory={staging}",
        ]
        try:
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=900, check=False)
        except subprocess.TimeoutExpired:
            errors.append(f"$ {' '.join(cmd)}\n(timed out after 900 s)")
            continue
        if done.returncode == 0 and any(staging.glob("*.jar")):
            (staging / MARKER).write_text(" ".join(cmd) + "\n")
            _install_dir(staging, out)
            return sorted(out.glob("*.jar"))
        errors.append(f"$ {' '.join(cmd)}\n{done.stdout[-3000:]}{done.stderr[-3000:]}")
    shutil.rmtree(staging, ignore_errors=True)
    raise TestbedError("Maven could not resolve the jars:\n" + "\n".join(errors))


def _install_dir(staging: Path, out: Path) -> None:
    """Move a complete ``staging`` to ``out`` unless another run completed ``out`` first."""
    if (out / MARKER).exists():
        shutil.rmtree(staging, ignore_errors=True)
        return
    shutil.rmtree(out, ignore_errors=True)
    try:
        staging.rename(out)
    except OSError:
        if not (out / MARKER).exists():
            raise
        shutil.rmtree(staging, ignore_errors=True)


def kafka_jars(version: str | None = None) -> Path:
    """The directory holding the jars of Kafka broker ``version`` (resolved on first use)."""
    version = version or default_kafka_version()
    props = {"kafka.version": version, "log4j.version": pinned("LOG4J_VERSION")}
    out = cache_dir() / f"kafka-{version}"
    _mvn_copy_dependencies(POMS_DIR / "kafka-broker.xml", props, out)
    return out


_JAR_NAME = re.compile(r"^(?P<artifact>.+)-(?P<version>\d+(?:\.\d+)+[^/]*)\.jar$")


def jar_artifact(name: str) -> str:
    """The artifact of a jar file name: ``kafka-clients-3.9.0.jar`` -> ``kafka-clients``."""
    match = _JAR_NAME.match(name)
    return match.group("artifact") if match else name.removesuffix(".jar")


def pyspark_jars_dir() -> Path:
    """``pyspark/jars`` of the running interpreter's pyspark (found without importing it)."""
    import importlib.util

    spec = importlib.util.find_spec("pyspark")
    if spec is None or spec.origin is None:
        raise TestbedError(f"pyspark is not installed for {sys.executable}")
    return Path(spec.origin).parent / "jars"


def pyspark_version() -> str | None:
    """The installed pyspark's version (None when it is not installed)."""
    from importlib import metadata

    try:
        return metadata.version("pyspark")
    except metadata.PackageNotFoundError:
        return None


def _check_pyspark_version() -> None:
    """Warn when pyspark's minor version is not SPARK_VERSION's: the Kafka source of another
    minor fails in streaming queries (Spark's internal checkpoint classes change)."""
    installed, pinned_spark = pyspark_version(), pinned("SPARK_VERSION")
    if installed and installed.split(".")[:2] != pinned_spark.split(".")[:2]:
        warnings.warn(f"pyspark {installed} is installed but ci/versions.env pins "
                      f"SPARK_VERSION={pinned_spark}", stacklevel=3)


def spark_jars() -> list[Path]:
    """Jars for ``spark.jars``: spark-sql-kafka-0-10 and spark-avro with their runtime deps,
    less every artifact that pyspark already ships (no duplicate classes on the classpath)."""
    props = {**spark_package_versions(), "scala.binary": pinned("SCALA_BINARY")}
    kafka, token, avro = (props[p] for p in SPARK_PACKAGES)
    name = f"spark-{kafka}" if kafka == token == avro else f"spark-{kafka}-t{token}-a{avro}"
    jars = _mvn_copy_dependencies(POMS_DIR / "spark-packages.xml", props, cache_dir() / name)
    _check_pyspark_version()
    shipped = {jar_artifact(p.name) for p in pyspark_jars_dir().glob("*.jar")}
    return [jar for jar in jars if jar_artifact(jar.name) not in shipped]


# --------------------------------------------------------------------------------------------
# Processes
# --------------------------------------------------------------------------------------------

_LIVE: dict[int, subprocess.Popen[bytes]] = {}


def _cleanup_all() -> None:
    for proc in list(_LIVE.values()):
        _terminate(proc, timeout=10.0)


atexit.register(_cleanup_all)


def _die_with_parent() -> None:
    """In the child before exec: SIGKILL it when the thread that started it dies (Linux), so a
    test run that is itself killed leaves no broker behind."""
    import ctypes

    pr_set_pdeathsig = 1
    ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGKILL)


def _spawn(cmd: list[str], log_path: Path, cwd: Path, detached: bool,
           env: Mapping[str, str] | None = None) -> subprocess.Popen[bytes]:
    """Start ``cmd`` in its own process group, output appended to ``log_path``.

    Unless ``detached``, it is ended at exit and dies with the thread that started it."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    tie = not detached and sys.platform.startswith("linux")
    with log_path.open("ab") as log:
        proc = subprocess.Popen(
            cmd, cwd=cwd, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
            start_new_session=True, env=dict(env) if env is not None else None,
            preexec_fn=_die_with_parent if tie else None,
        )
    if not detached:
        _LIVE[proc.pid] = proc
    return proc


def _signal_group(pid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)


def _terminate(proc: subprocess.Popen[bytes], timeout: float, sig: signal.Signals =
               signal.SIGTERM) -> None:
    """Signal the process group, wait up to ``timeout``, then SIGKILL it."""
    _LIVE.pop(proc.pid, None)
    if proc.poll() is None:
        _signal_group(proc.pid, signal.SIGCONT)  # a paused process cannot handle SIGTERM
        _signal_group(proc.pid, sig)
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            _signal_group(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
    _signal_group(proc.pid, signal.SIGKILL)  # leftovers of the group, if any


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def terminate_pid(pid: int, timeout: float = 30.0) -> None:
    """Stop a process group started by another run of this module (``down``)."""
    _signal_group(pid, signal.SIGCONT)
    _signal_group(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while _pid_alive(pid) and time.monotonic() < deadline:
        time.sleep(0.2)
    _signal_group(pid, signal.SIGKILL)


# --------------------------------------------------------------------------------------------
# Kafka
# --------------------------------------------------------------------------------------------

BROKER_DEFAULTS: dict[str, object] = {
    "process.roles": "broker,controller",
    "node.id": 1,
    "controller.listener.names": "CONTROLLER",
    "inter.broker.listener.name": "PLAINTEXT",
    "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
    "transaction.state.log.replication.factor": 1,
    "transaction.state.log.min.isr": 1,
    "transaction.state.log.num.partitions": 4,
    "offsets.topic.replication.factor": 1,
    "offsets.topic.num.partitions": 4,
    "group.initial.rebalance.delay.ms": 0,
    "auto.create.topics.enable": "false",
    "num.partitions": 3,
    "default.replication.factor": 1,
    "min.insync.replicas": 1,
    # Tests rely on the coordinator aborting timed-out transactions quickly.
    "transaction.abort.timed.out.transaction.cleanup.interval.ms": 1000,
    # After a kill the restarted broker waits out its old session before it can register.
    "broker.heartbeat.interval.ms": 1000,
    "broker.session.timeout.ms": 6000,
    # Modest footprint on a shared 2-core machine.
    "num.network.threads": 2,
    "num.io.threads": 4,
    "log.cleaner.dedupe.buffer.size": 16 * 1024 * 1024,
}

# Only known to 4.x brokers (share groups); unknown keys would just be logged by 3.9.
BROKER_DEFAULTS_4X: dict[str, object] = {
    "share.coordinator.state.topic.replication.factor": 1,
    "share.coordinator.state.topic.min.isr": 1,
}

LOG4J2_PROPERTIES = """\
status = warn
appender.out.type = Console
appender.out.name = OUT
appender.out.layout.type = PatternLayout
appender.out.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = INFO
rootLogger.appenderRef.out.ref = OUT
logger.config.name = kafka.server.KafkaConfig
logger.config.level = WARN
logger.clientconfig.name = org.apache.kafka.common.config.AbstractConfig
logger.clientconfig.level = WARN
logger.request.name = kafka.request.logger
logger.request.level = WARN
logger.state.name = state.change.logger
logger.state.level = WARN
"""


def _major(version: str) -> int:
    return int(version.split(".", 1)[0])


# librdkafka logs every refused connection while the broker starts: only errors that end a
# probe matter, and those are raised.
QUIET: dict[str, str | int | float] = {"log_level": 0, "socket.timeout.ms": 5000}


def _admin(bootstrap: str) -> Any:
    from confluent_kafka.admin import AdminClient

    return AdminClient({"bootstrap.servers": bootstrap, **QUIET})


def probe_broker(bootstrap: str, timeout: float = 5.0) -> bool | None:
    """True when metadata is served and a transactional producer can init; else None."""
    from confluent_kafka import Producer

    metadata = _admin(bootstrap).list_topics(timeout=timeout)
    if not metadata.brokers:
        return None
    producer = Producer({
        "bootstrap.servers": bootstrap,
        "transactional.id": f"testbed-probe-{uuid.uuid4().hex}",
        "transaction.timeout.ms": 10000,
        **QUIET,
    })
    producer.init_transactions(timeout)  # raises KafkaException until the coordinator is up
    return True


def wait_broker_ready(bootstrap: str, timeout: float = 90.0,
                      on_timeout: Callable[[], str] = lambda: "") -> None:
    """Wait until ``bootstrap`` serves metadata and transactions (coordinator loaded)."""
    wait_for(lambda: probe_broker(bootstrap), timeout, f"Kafka at {bootstrap}",
             interval=1.0, on_timeout=on_timeout)


def create_topic(bootstrap: str, name: str, partitions: int = 3,
                 config: Mapping[str, str] | None = None, timeout: float = 30.0) -> None:
    """Create a topic and wait until every partition has a leader in the metadata."""
    from confluent_kafka.admin import NewTopic

    admin = _admin(bootstrap)
    topic = NewTopic(name, num_partitions=partitions, replication_factor=1,
                     config=dict(config or {}))
    admin.create_topics([topic], request_timeout=timeout)[name].result(timeout=timeout)

    def ready() -> bool | None:
        meta = admin.list_topics(topic=name, timeout=5).topics.get(name)
        if meta is None or meta.error is not None or len(meta.partitions) != partitions:
            return None
        return all(p.leader >= 0 for p in meta.partitions.values()) or None

    wait_for(ready, timeout, f"metadata of topic {name}")


class KafkaBroker:
    """A single-node KRaft Kafka broker+controller on loopback ports, data in ``workdir``.

    Ports are chosen on the first start and kept, so ``restart()`` gives the same bootstrap
    address and the same data.
    """

    def __init__(self, workdir: Path | str, version: str | None = None,
                 extra_config: Mapping[str, object] | None = None, heap: str = "768m",
                 detached: bool = False) -> None:
        self.workdir = Path(workdir).resolve()
        self._version = version or default_kafka_version()
        self.extra_config = dict(extra_config or {})
        self.heap = heap
        self.detached = detached
        self._port: int | None = None
        self._controller_port: int | None = None
        self._proc: subprocess.Popen[bytes] | None = None

    # ---- properties -------------------------------------------------------------------------

    @property
    def version(self) -> str:
        return self._version

    @property
    def bootstrap(self) -> str:
        if self._port is None:
            raise TestbedError("the broker has not been started yet")
        return f"{LOOPBACK}:{self._port}"

    @property
    def log_path(self) -> Path:
        return self.workdir / "broker.log"

    @property
    def config_path(self) -> Path:
        return self.workdir / "server.properties"

    @property
    def data_dir(self) -> Path:
        return self.workdir / "data"

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    def is_running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    # ---- configuration ------------------------------------------------------------------------

    def config(self) -> dict[str, object]:
        """The effective server.properties: defaults, listeners, then ``extra_config``."""
        assert self._port is not None and self._controller_port is not None
        conf: dict[str, object] = dict(BROKER_DEFAULTS)
        if _major(self.version) >= 4:
            conf.update(BROKER_DEFAULTS_4X)
        conf.update({
            "listeners": f"PLAINTEXT://{LOOPBACK}:{self._port},"
                         f"CONTROLLER://{LOOPBACK}:{self._controller_port}",
            "advertised.listeners": f"PLAINTEXT://{LOOPBACK}:{self._port}",
            "controller.quorum.voters": f"1@{LOOPBACK}:{self._controller_port}",
            "log.dirs": str(self.data_dir),
        })
        conf.update(self.extra_config)
        return conf

    def _write_files(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        lines = [f"{key}={value}" for key, value in self.config().items()]
        self.config_path.write_text("\n".join(lines) + "\n")
        (self.workdir / "log4j2.properties").write_text(LOG4J2_PROPERTIES)

    def _java(self, *args: str, server: bool = False) -> list[str]:
        java = shutil.which("java") or "/usr/bin/java"
        # The broker: G1 and a modest heap; the short-lived tools: start fast.
        tuning = ([f"-Xmx{self.heap}", "-XX:+UseG1GC"] if server else
                  ["-Xmx256m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1"])
        return [
            java, *tuning,
            f"-Dlog4j2.configurationFile={self.workdir / 'log4j2.properties'}",
            "-cp", f"{kafka_jars(self.version)}/*", *args,
        ]

    def _format_storage(self) -> None:
        """Format ``log.dirs`` once (KRaft needs a cluster id and meta.properties)."""
        if (self.data_dir / "meta.properties").exists():
            return
        uuid_run = self._run_tool("kafka.tools.StorageTool", "random-uuid")
        cluster_id = uuid_run.strip().splitlines()[-1].strip()
        self._run_tool("kafka.tools.StorageTool", "format", "-t", cluster_id,
                       "-c", str(self.config_path))

    def _run_tool(self, *args: str) -> str:
        done = subprocess.run(self._java(*args), capture_output=True, text=True, timeout=120,
                              check=False, cwd=self.workdir)
        if done.returncode != 0:
            raise TestbedError(f"{' '.join(args)} failed ({done.returncode}):\n"
                               f"{done.stdout[-2000:]}{done.stderr[-2000:]}")
        return done.stdout

    # ---- lifecycle ----------------------------------------------------------------------------

    def start(self, timeout: float = 90.0) -> str:
        """Start (or start again) the broker and wait until transactions work."""
        if self.is_running():
            return self.bootstrap
        if self._port is None:
            self._port, self._controller_port = free_port(), free_port()
        self._write_files()
        self._format_storage()
        cmd = self._java("kafka.Kafka", str(self.config_path), server=True)
        self._proc = _spawn(cmd, self.log_path, self.workdir, self.detached)
        def ready() -> bool | None:
            if not self.is_running():
                raise TestbedError(f"the Kafka broker exited during start\n{self._diagnose()}")
            return probe_broker(self.bootstrap)

        try:
            wait_for(ready, timeout, f"Kafka {self.version} at {self.bootstrap}", interval=1.0,
                     on_timeout=self._diagnose)
        except BaseException:
            self.kill()
            raise
        return self.bootstrap

    def _diagnose(self) -> str:
        state = "running" if self.is_running() else f"exited ({self._exit_code()})"
        return f"broker {self.version} pid {self.pid} {state}\n{tail(self.log_path, 50)}"

    def _exit_code(self) -> int | None:
        return self._proc.poll() if self._proc is not None else None

    def stop(self, timeout: float = 30.0) -> None:
        """Graceful shutdown (SIGTERM), SIGKILL after ``timeout``."""
        if self._proc is not None:
            _terminate(self._proc, timeout)

    def kill(self) -> None:
        """Crash the broker: SIGKILL, no shutdown hooks."""
        if self._proc is not None:
            _terminate(self._proc, timeout=30.0, sig=signal.SIGKILL)

    def restart(self, timeout: float = 90.0, graceful: bool = True) -> str:
        """Stop (or kill) and start again: same ports, same data."""
        if graceful:
            self.stop()
        else:
            self.kill()
        return self.start(timeout)

    def create_topic(self, name: str, partitions: int = 3,
                     config: Mapping[str, str] | None = None, timeout: float = 30.0) -> str:
        create_topic(self.bootstrap, name, partitions, config, timeout)
        return name

    def __repr__(self) -> str:
        port = self._port or "-"
        return f"KafkaBroker(version={self.version}, port={port}, workdir={self.workdir})"


class ExternalKafkaBroker:
    """A broker the developer brought (``KTS_KAFKA_BOOTSTRAP``): usable, not controllable."""

    def __init__(self, bootstrap: str) -> None:
        self._bootstrap = bootstrap
        self.version: str | None = None
        self.log_path: Path | None = None

    @property
    def bootstrap(self) -> str:
        return self._bootstrap

    def start(self, timeout: float = 90.0) -> str:
        wait_broker_ready(self.bootstrap, timeout)
        return self.bootstrap

    def create_topic(self, name: str, partitions: int = 3,
                     config: Mapping[str, str] | None = None, timeout: float = 30.0) -> str:
        create_topic(self.bootstrap, name, partitions, config, timeout)
        return name

    def _refuse(self, *_: object, **__: object) -> str:
        raise TestbedError(f"the broker at {self.bootstrap} is external (KTS_KAFKA_BOOTSTRAP): "
                           "it cannot be stopped, killed or restarted from the tests")

    stop = kill = restart = _refuse


# --------------------------------------------------------------------------------------------
# S3 (moto server mode)
# --------------------------------------------------------------------------------------------

S3_CREDENTIALS = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
}


def set_default_aws_env() -> None:
    """Dummy credentials and region so that boto3 talks to the local S3 server."""
    for key, value in S3_CREDENTIALS.items():
        os.environ.setdefault(key, value)


def probe_http(url: str, timeout: float = 2.0) -> bool | None:
    """True once ``url`` answers HTTP at all (any status)."""
    try:
        with urllib.request.urlopen(url, timeout=timeout):
            return True
    except urllib.error.HTTPError:
        return True
    except (urllib.error.URLError, OSError):
        return None


class S3Server:
    """moto's S3-compatible server (``python -m moto.server``) on a loopback port."""

    def __init__(self, workdir: Path | str | None = None, python: str | None = None,
                 detached: bool = False) -> None:
        self.workdir = Path(workdir).resolve() if workdir else cache_dir() / "moto"
        self.python = python or sys.executable
        self.detached = detached
        self._port: int | None = None
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def endpoint(self) -> str:
        if self._port is None:
            raise TestbedError("the S3 server has not been started yet")
        return f"http://{LOOPBACK}:{self._port}"

    @property
    def log_path(self) -> Path:
        return self.workdir / "moto.log"

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    def is_running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def start(self, timeout: float = 30.0) -> str:
        if self.is_running():
            return self.endpoint
        if self._port is None:
            self._port = free_port()
        cmd = [self.python, "-m", "moto.server", "-H", LOOPBACK, "-p", str(self._port)]
        env = {**os.environ, **S3_CREDENTIALS}
        self._proc = _spawn(cmd, self.log_path, self.workdir, self.detached, env=env)

        def ready() -> bool | None:
            if not self.is_running():
                raise TestbedError(f"moto server exited\n{tail(self.log_path)}")
            return probe_http(f"{self.endpoint}/moto-api/")

        try:
            wait_for(ready, timeout, f"S3 server at {self.endpoint}", interval=0.2,
                     on_timeout=lambda: tail(self.log_path))
        except BaseException:
            self.stop()
            raise
        return self.endpoint

    def stop(self, timeout: float = 10.0) -> None:
        if self._proc is not None:
            _terminate(self._proc, timeout)

    def pause(self) -> None:
        """Freeze the server (SIGSTOP): requests hang until ``resume()``."""
        if self._proc is not None:
            _signal_group(self._proc.pid, signal.SIGSTOP)

    def resume(self) -> None:
        if self._proc is not None:
            _signal_group(self._proc.pid, signal.SIGCONT)


class ExternalS3Server:
    """An S3 endpoint the developer brought (``KTS_S3_ENDPOINT``): usable, not controllable."""

    def __init__(self, endpoint: str) -> None:
        self.endpoint = endpoint.rstrip("/")

    def _refuse(self, *_: object, **__: object) -> None:
        raise TestbedError(f"the S3 endpoint {self.endpoint} is external (KTS_S3_ENDPOINT): "
                           "it cannot be stopped, paused or resumed from the tests")

    stop = pause = resume = _refuse


@contextlib.contextmanager
def kafka_bootstrap(workdir: Path) -> Iterator[str]:
    """``KTS_KAFKA_BOOTSTRAP``, or a broker of ours under ``workdir`` until the block ends."""
    external = os.environ.get("KTS_KAFKA_BOOTSTRAP")
    if external:
        yield external
        return
    broker = KafkaBroker(workdir / "broker")
    bootstrap = broker.start()
    try:
        yield bootstrap
    finally:
        broker.stop()


@contextlib.contextmanager
def s3_endpoint(workdir: Path) -> Iterator[str]:
    """``KTS_S3_ENDPOINT``, or an S3 server of ours under ``workdir`` until the block ends."""
    external = os.environ.get("KTS_S3_ENDPOINT")
    if external:
        yield external
        return
    server = S3Server(workdir / "s3")
    endpoint = server.start()
    try:
        yield endpoint
    finally:
        server.stop()


# --------------------------------------------------------------------------------------------
# Command line
# --------------------------------------------------------------------------------------------


def _read_env_file(path: Path) -> dict[str, str]:
    return read_versions(path) if path.exists() else {}


def cmd_fetch(args: argparse.Namespace) -> int:
    started = time.monotonic()
    kafka_dir = kafka_jars(args.kafka_version)
    print(f"kafka {args.kafka_version or default_kafka_version()}: {kafka_dir}")
    print(f"pyspark {pyspark_version()}; spark packages {spark_package_versions()}")
    for jar in spark_jars():
        print(f"spark jar: {jar}")
    print(f"fetched in {time.monotonic() - started:.1f}s")
    return 0


def cmd_up(args: argparse.Namespace) -> int:
    base = Path(args.dir).resolve()
    env_file = base / "env"
    if any(_pid_alive(int(v)) for k, v in _read_env_file(env_file).items() if k.endswith("_PID")):
        print(f"a test bed is already up ({env_file}); run `down` first", file=sys.stderr)
        return 1
    shutil.rmtree(base / "kafka", ignore_errors=True)
    started = time.monotonic()
    s3 = S3Server(base / "s3", detached=True)
    broker = KafkaBroker(base / "kafka", version=args.kafka_version, detached=True)
    try:
        s3.start()
        broker.start()
    except BaseException:
        s3.stop()
        broker.kill()
        raise
    values = {
        "KTS_KAFKA_BOOTSTRAP": broker.bootstrap,
        "KTS_S3_ENDPOINT": s3.endpoint,
        "KTS_KAFKA_VERSION": broker.version,
        "KTS_KAFKA_PID": str(broker.pid),
        "KTS_S3_PID": str(s3.pid),
        "KTS_KAFKA_LOG": str(broker.log_path),
        "KTS_S3_LOG": str(s3.log_path),
    }
    env_file.write_text("".join(f"{k}={v}\n" for k, v in values.items()))
    print("".join(f"{k}={v}\n" for k, v in values.items()), end="")
    print(f"# up in {time.monotonic() - started:.1f}s; `set -a; . {env_file}; set +a` to use it")
    return 0


def cmd_down(args: argparse.Namespace) -> int:
    env_file = Path(args.dir).resolve() / "env"
    values = _read_env_file(env_file)
    pids = [int(v) for k, v in values.items() if k.endswith("_PID")]
    if not pids:
        print(f"nothing is up ({env_file} has no pids)")
        return 0
    for pid in pids:
        terminate_pid(pid)
        print(f"stopped process group {pid}")
    env_file.unlink()
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="testbed.py", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    fetch = sub.add_parser("fetch", help="resolve the broker and Spark jars into the cache")
    fetch.add_argument("--kafka-version", default=None)
    fetch.set_defaults(func=cmd_fetch)
    up = sub.add_parser("up", help="start broker + S3 in the background, write DIR/env")
    up.add_argument("--dir", default=str(DEFAULT_UP_DIR))
    up.add_argument("--kafka-version", default=None)
    up.set_defaults(func=cmd_up)
    down = sub.add_parser("down", help="stop what `up` started")
    down.add_argument("--dir", default=str(DEFAULT_UP_DIR))
    down.set_defaults(func=cmd_down)
    return parser


def main(argv: Iterable[str] | None = None) -> int:
    args = build_parser().parse_args(list(argv) if argv is not None else None)
    try:
        return int(args.func(args))
    except TestbedError as exc:
        print(f"testbed: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
