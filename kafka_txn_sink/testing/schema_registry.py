"""A Schema Registry for the test bed: Apicurio Registry, built from Maven Central's jars.

Apicurio Registry serves the Confluent-compatible API at ``/apis/ccompat/v7``, which
``confluent_kafka.schema_registry.SchemaRegistryClient`` and its Avro, JSON Schema and Protobuf
serializers speak. Its release (APICURIO_VERSION of ``versions.env``) is rebuilt by Maven with
Quarkus' augmentation from ``poms/schema-registry/`` (see the pom for the two artifacts Central
does not serve); the runner jar and its ``lib/`` are cached under ``$KTS_CACHE`` or
``~/.cache/kafka_txn_sink``, one directory per version, so only the first use builds.

``SchemaRegistry`` runs it on a loopback port with in-memory storage (H2): each start is empty.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import urllib.error
import urllib.request
from pathlib import Path
from types import TracebackType

from kafka_txn_sink.testing.errors import TestbedError
from kafka_txn_sink.testing.jars import (
    MARKER,
    MAVEN_SETTINGS,
    POMS_DIR,
    _install_dir,
    cache_dir,
    pinned,
)
from kafka_txn_sink.testing.processes import (
    LOOPBACK,
    free_port,
    java_executable,
    maven_executable,
    spawn,
    tail,
    terminate,
    wait_for,
)

REGISTRY_PROJECT = POMS_DIR / "schema-registry"
RUNNER = "apicurio-registry-runner.jar"
CCOMPAT_PATH = "/apis/ccompat/v7"
READY_PATH = "/health/ready"

# The parent's plugins that a rebuild of the release does not need (checks, docs, sources).
_MAVEN_GOALS = [
    "-Pprod",
    "package",
    "-DskipTests",
    "-Dcheckstyle.skip",
    "-Denforcer.skip",
    "-Dmaven.javadoc.skip",
    "-Dmaven.source.skip",
]
_PARENT_VERSION = re.compile(r"<version>[^<]*</version>(?=<!-- APICURIO_VERSION -->)")
_BUILD_TIMEOUT = 1800.0


def apicurio_version() -> str:
    """APICURIO_VERSION of versions.env: the Apicurio Registry release the test bed runs."""
    return pinned("APICURIO_VERSION")


def registry_runner(version: str | None = None) -> Path:
    """The runner jar of Apicurio Registry ``version`` (``lib/`` beside it), built on first use.

    Maven builds a copy of ``poms/schema-registry/`` in a private staging directory that is
    renamed into place with its completion marker, so concurrent callers never see half a
    build and later calls do nothing."""
    version = version or apicurio_version()
    out = cache_dir() / f"apicurio-registry-{version}"
    if not (out / MARKER).exists():
        _build(version, out)
    return out / RUNNER


def _build(version: str, out: Path) -> None:
    mvn = maven_executable()
    settings = ["-s", str(MAVEN_SETTINGS)] if MAVEN_SETTINGS.exists() else []
    staging = out.with_name(f"{out.name}.partial-{os.getpid()}")
    project = staging / "project"
    errors: list[str] = []
    for extra in ([], ["-U"]):  # -U only on retry: re-check what a failed run cached
        shutil.rmtree(staging, ignore_errors=True)
        shutil.copytree(REGISTRY_PROJECT, project, ignore=shutil.ignore_patterns("target"))
        pom = project / "pom.xml"
        text, count = _PARENT_VERSION.subn(f"<version>{version}</version>", pom.read_text())
        if count != 1:
            raise TestbedError(
                f"{REGISTRY_PROJECT / 'pom.xml'}: no parent version marked "
                "<!-- APICURIO_VERSION -->"
            )
        pom.write_text(text)
        cmd = [mvn, "-q", "-B", *settings, *extra, *_MAVEN_GOALS, "-f", str(pom)]
        try:
            done = subprocess.run(
                cmd, capture_output=True, text=True, timeout=_BUILD_TIMEOUT, check=False
            )
        except subprocess.TimeoutExpired:
            errors.append(f"$ {' '.join(cmd)}\n(timed out after {_BUILD_TIMEOUT:.0f} s)")
            continue
        target = project / "target"
        if done.returncode == 0 and (target / RUNNER).is_file() and (target / "lib").is_dir():
            (target / RUNNER).rename(staging / RUNNER)
            (target / "lib").rename(staging / "lib")
            shutil.rmtree(project)
            (staging / MARKER).write_text(" ".join(cmd) + "\n")
            _install_dir(staging, out)
            return
        errors.append(f"$ {' '.join(cmd)}\n{done.stdout[-3000:]}{done.stderr[-3000:]}")
    shutil.rmtree(staging, ignore_errors=True)
    raise TestbedError(f"Maven could not build Apicurio Registry {version}:\n" + "\n".join(errors))


def probe_ready(url: str, timeout: float = 2.0) -> bool | None:
    """True once ``url`` (a health check) answers 200; None while it refuses or answers 503."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return True if response.status == 200 else None
    except (urllib.error.URLError, OSError):  # HTTPError (503: not ready yet) is a URLError
        return None


class SchemaRegistry:
    """Apicurio Registry on a loopback port, storage in memory: a context manager.

    ``url`` is the base URL of the Confluent-compatible API, for ``SchemaRegistryClient``::

        with SchemaRegistry(tmp_path) as registry:
            client = SchemaRegistryClient({"url": registry.url})
    """

    def __init__(
        self,
        workdir: Path | str | None = None,
        version: str | None = None,
        heap: str = "256m",
        detached: bool = False,
    ) -> None:
        self.workdir = Path(workdir).resolve() if workdir else cache_dir() / "schema-registry"
        self._version = version or apicurio_version()
        self.heap = heap
        self.detached = detached
        self._port: int | None = None
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def version(self) -> str:
        """The Apicurio Registry release."""
        return self._version

    @property
    def base_url(self) -> str:
        """``http://127.0.0.1:port`` (known once started)."""
        if self._port is None:
            raise TestbedError("the Schema Registry has not been started yet")
        return f"http://{LOOPBACK}:{self._port}"

    @property
    def url(self) -> str:
        """The Confluent-compatible API: ``http://127.0.0.1:port/apis/ccompat/v7``."""
        return self.base_url + CCOMPAT_PATH

    @property
    def log_path(self) -> Path:
        """The registry's console log (appended to by every start)."""
        return self.workdir / "registry.log"

    @property
    def pid(self) -> int | None:
        """The registry process's id (None before the first start)."""
        return self._proc.pid if self._proc is not None else None

    def is_running(self) -> bool:
        """Whether the registry process is alive."""
        return self._proc is not None and self._proc.poll() is None

    def command(self) -> list[str]:
        """The ``java`` command line that runs the registry (built first if need be)."""
        if self._port is None:
            raise TestbedError("the Schema Registry has no port yet")
        runner = registry_runner(self.version)
        java = java_executable("it runs the test bed's Schema Registry (Apicurio Registry)")
        return [
            java,
            f"-Xmx{self.heap}",
            "-XX:+UseSerialGC",
            "-XX:TieredStopAtLevel=1",
            f"-Dquarkus.http.host={LOOPBACK}",
            f"-Dquarkus.http.port={self._port}",
            "-Dquarkus.profile=prod",
            "-jar",
            str(runner),
        ]

    def start(self, timeout: float = 90.0) -> str:
        """Build it if need be, start it and wait up to ``timeout`` seconds until
        ``/health/ready`` answers 200; returns ``url``.

        Raises:
            TestbedError: it could not be built, exited, or was not ready in time (then it is
                killed); the message ends with the tail of its log.
        """
        if self.is_running():
            return self.url
        if self._port is None:
            self._port = free_port()
        cmd = self.command()  # builds first: the readiness bound is the start's alone
        self.workdir.mkdir(parents=True, exist_ok=True)
        self._proc = spawn(cmd, self.log_path, self.workdir, self.detached)

        def ready() -> bool | None:
            if not self.is_running():
                code = self._proc.poll() if self._proc is not None else None
                raise TestbedError(
                    f"the Schema Registry (Apicurio Registry {self.version}) "
                    f"exited ({code}) during start\n{tail(self.log_path)}"
                )
            return probe_ready(self.base_url + READY_PATH)

        try:
            wait_for(
                ready,
                timeout,
                f"the Schema Registry (Apicurio Registry {self.version}) "
                f"at {self.base_url}{READY_PATH}",
                interval=0.25,
                on_timeout=lambda: tail(self.log_path),
            )
        except BaseException:
            self.stop()
            raise
        return self.url

    def stop(self, timeout: float = 10.0) -> None:
        """Stop it (SIGTERM, SIGKILL after ``timeout``); its schemas are lost."""
        if self._proc is not None:
            terminate(self._proc, timeout)

    def __enter__(self) -> SchemaRegistry:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(version={self.version}, port={self._port or '-'}, "
            f"workdir={self.workdir})"
        )
