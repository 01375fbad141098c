"""A Prometheus server for the test bed: Debian's `prometheus` package, scraping the sink's
metrics endpoint on loopback.

The package is fetched with `apt-get download` and unpacked (`dpkg-deb -x`) into the cache
(`$KTS_CACHE` or ``~/.cache/kafka_txn_sink``), not installed: no service starts, no root is
needed beyond reaching the archive, and `promtool` comes with it (the alert rules' checks).
`Prometheus` writes a scrape configuration for the targets it is given, runs the server on a
loopback port with its data in its work directory, and answers PromQL through the HTTP API.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import tempfile
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from types import TracebackType
from typing import Any

from kafka_txn_sink.testing.errors import TestbedError
from kafka_txn_sink.testing.jars import MARKER, cache_dir
from kafka_txn_sink.testing.processes import (
    LOOPBACK,
    free_port,
    spawn,
    tail,
    terminate,
    wait_for,
)
from kafka_txn_sink.testing.schema_registry import probe_ready

PACKAGE = "prometheus"
_FETCH_TIMEOUT = 600.0


def prometheus_dir() -> Path:
    """The unpacked package (`usr/bin/prometheus`, `usr/bin/promtool`), fetched on first use.

    Raises:
        TestbedError: apt-get or dpkg-deb is missing, or the package could not be fetched.
    """
    out = cache_dir() / "prometheus"
    if (out / MARKER).exists():
        return out
    for tool in ("apt-get", "dpkg-deb"):
        if shutil.which(tool) is None:
            raise TestbedError(f"{tool} is not on PATH: the test bed's Prometheus is Debian's")
    cache_dir().mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=cache_dir()) as staging:
        try:
            _run(["apt-get", "download", PACKAGE], Path(staging))
        except TestbedError:  # a machine whose package lists were never read
            _run(["apt-get", "update", "-qq"], Path(staging))
            _run(["apt-get", "download", PACKAGE], Path(staging))
        debs = sorted(Path(staging).glob(f"{PACKAGE}_*.deb"))
        if not debs:
            raise TestbedError(f"apt-get download {PACKAGE} left no .deb in {staging}")
        unpacked = Path(staging) / "root"
        _run(["dpkg-deb", "-x", str(debs[0]), str(unpacked)], Path(staging))
        (unpacked / MARKER).write_text(debs[0].name + "\n")
        if out.exists():
            shutil.rmtree(out)
        unpacked.rename(out)
    return out


def promtool() -> Path:
    """The package's `promtool` (checks and unit tests of rule files)."""
    return prometheus_dir() / "usr" / "bin" / "promtool"


def _run(cmd: list[str], cwd: Path) -> None:
    try:
        subprocess.run(
            cmd, cwd=cwd, check=True, capture_output=True, text=True, timeout=_FETCH_TIMEOUT
        )
    except subprocess.CalledProcessError as exc:
        raise TestbedError(f"{' '.join(cmd)} failed: {exc.stderr.strip()[-2000:]}") from exc


class Prometheus:
    """Prometheus on a loopback port, scraping `targets` (HOST:PORT) every `interval_s`."""

    def __init__(self, workdir: Path, targets: list[str], interval_s: float = 1.0) -> None:
        self.workdir = Path(workdir).resolve()
        self.targets = targets
        self.interval_s = interval_s
        self._port: int | None = None
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        """``http://127.0.0.1:port`` (known once started)."""
        if self._port is None:
            raise TestbedError("Prometheus has not been started yet")
        return f"http://{LOOPBACK}:{self._port}"

    @property
    def log_path(self) -> Path:
        """The server's log."""
        return self.workdir / "prometheus.log"

    def _config(self) -> Path:
        interval = f"{int(self.interval_s * 1000)}ms"
        config = {
            "global": {"scrape_interval": interval, "evaluation_interval": interval},
            "scrape_configs": [
                {"job_name": "kafka_txn_sink", "static_configs": [{"targets": self.targets}]}
            ],
        }
        path = self.workdir / "prometheus.yml"
        path.write_text(json.dumps(config))  # JSON is YAML
        return path

    def start(self, timeout: float = 60.0) -> str:
        """Start it and wait until it is ready; returns `url`."""
        binary = prometheus_dir() / "usr" / "bin" / "prometheus"
        self.workdir.mkdir(parents=True, exist_ok=True)
        self._port = free_port()
        cmd = [
            str(binary),
            f"--config.file={self._config()}",
            f"--storage.tsdb.path={self.workdir / 'data'}",
            f"--web.listen-address={LOOPBACK}:{self._port}",
            "--web.enable-lifecycle",
        ]
        self._proc = spawn(cmd, self.log_path, self.workdir, detached=False)

        def ready() -> bool | None:
            if self._proc is not None and self._proc.poll() is not None:
                raise TestbedError(f"Prometheus exited during start\n{tail(self.log_path)}")
            return probe_ready(self.url + "/-/ready")

        try:
            wait_for(
                ready,
                timeout,
                f"Prometheus at {self.url}",
                interval=0.25,
                on_timeout=lambda: tail(self.log_path),
            )
        except BaseException:
            self.stop()
            raise
        return self.url

    def query(self, promql: str) -> list[dict[str, Any]]:
        """The instant vector or scalar `promql` evaluates to now (the API's `result`).

        Raises:
            TestbedError: the query was refused.
        """
        url = f"{self.url}/api/v1/query?{urllib.parse.urlencode({'query': promql})}"
        try:
            with urllib.request.urlopen(url, timeout=10) as response:
                body = json.loads(response.read())
        except urllib.error.HTTPError as exc:  # 400: a query it cannot parse
            raise TestbedError(f"Prometheus refused {promql!r}: {exc.read()[:500]!r}") from exc
        if body.get("status") != "success":
            raise TestbedError(f"Prometheus refused {promql!r}: {body}")
        result: list[dict[str, Any]] = body["data"]["result"]
        return result

    def value(self, promql: str) -> float | None:
        """The one value `promql` evaluates to now, or None when it has no series.

        Raises:
            TestbedError: it has more than one series.
        """
        result = self.query(promql)
        if not result:
            return None
        if len(result) > 1:
            raise TestbedError(f"{promql!r} has {len(result)} series: {result}")
        return float(result[0]["value"][1])

    def stop(self, timeout: float = 10.0) -> None:
        """Stop it (SIGTERM, SIGKILL after `timeout`)."""
        if self._proc is not None:
            terminate(self._proc, timeout)

    def __enter__(self) -> Prometheus:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()
