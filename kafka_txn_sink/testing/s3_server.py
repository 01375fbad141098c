"""An S3-compatible HTTP server for the test bed: moto in server mode, on a loopback port.

``S3Server`` is ours (start, stop, pause, resume); ``ExternalS3Server`` is an endpoint the
developer brought with ``KTS_S3_ENDPOINT``. moto is run as a separate process
(``python -m moto.server``), so it is needed at run time only (the ``testing`` extra).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path

from kafka_txn_sink.storage.settings import S3Settings
from kafka_txn_sink.testing.errors import TestbedError
from kafka_txn_sink.testing.jars import cache_dir
from kafka_txn_sink.testing.processes import (
    LOOPBACK,
    free_port,
    signal_group,
    spawn,
    tail,
    terminate,
    wait_for,
)

S3_CREDENTIALS = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
}


def set_default_aws_env() -> None:
    """Dummy credentials and region so that boto3 talks to the local S3 server."""
    for key, value in S3_CREDENTIALS.items():
        os.environ.setdefault(key, value)


def s3_settings(endpoint: str) -> S3Settings:
    """How the sink's storage code reaches the test S3 server at ``endpoint``."""
    return S3Settings(
        endpoint_url=endpoint,
        region=S3_CREDENTIALS["AWS_DEFAULT_REGION"],
        access_key_id=S3_CREDENTIALS["AWS_ACCESS_KEY_ID"],
        secret_access_key=S3_CREDENTIALS["AWS_SECRET_ACCESS_KEY"],
    )


def sink_s3_options(endpoint: str) -> dict[str, str]:
    """The sink's ``s3.*`` options that reach the test S3 server at ``endpoint``."""
    settings = s3_settings(endpoint)
    return {
        "s3.endpoint": endpoint,
        "s3.region": str(settings.region),
        "s3.accessKeyId": str(settings.access_key_id),
        "s3.secretAccessKey": str(settings.secret_access_key),
    }


def create_bucket(endpoint: str, name: str | None = None) -> str:
    """Create bucket ``name`` (a new random name by default) on the S3 server; its name."""
    from kafka_txn_sink.storage.s3 import make_client  # boto3: only where a bucket is made

    bucket = name or f"kts-{uuid.uuid4().hex[:12]}"
    make_client(s3_settings(endpoint)).create_bucket(Bucket=bucket)
    return bucket


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

    def __init__(
        self, workdir: Path | str | None = None, python: str | None = None, detached: bool = False
    ) -> None:
        self.workdir = Path(workdir).resolve() if workdir else cache_dir() / "moto"
        self.python = python or sys.executable
        self.detached = detached
        self._port: int | None = None
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def endpoint(self) -> str:
        """``http://127.0.0.1:port`` (known once started)."""
        if self._port is None:
            raise TestbedError("the S3 server has not been started yet")
        return f"http://{LOOPBACK}:{self._port}"

    @property
    def log_path(self) -> Path:
        """moto's log."""
        return self.workdir / "moto.log"

    @property
    def pid(self) -> int | None:
        """The server process's id (None before the first start)."""
        return self._proc.pid if self._proc is not None else None

    def is_running(self) -> bool:
        """Whether the server process is alive."""
        return self._proc is not None and self._proc.poll() is None

    def start(self, timeout: float = 30.0) -> str:
        """Start (or start again) the server and wait until it answers HTTP."""
        if self.is_running():
            return self.endpoint
        if self._port is None:
            self._port = free_port()
        cmd = [self.python, "-m", "moto.server", "-H", LOOPBACK, "-p", str(self._port)]
        env = {**os.environ, **S3_CREDENTIALS}
        self._proc = spawn(cmd, self.log_path, self.workdir, self.detached, env=env)

        def ready() -> bool | None:
            if not self.is_running():
                raise TestbedError(f"moto server exited\n{tail(self.log_path)}")
            return probe_http(f"{self.endpoint}/moto-api/")

        try:
            wait_for(
                ready,
                timeout,
                f"S3 server at {self.endpoint}",
                interval=0.2,
                on_timeout=lambda: tail(self.log_path),
            )
        except BaseException:
            self.stop()
            raise
        return self.endpoint

    def stop(self, timeout: float = 10.0) -> None:
        """Stop the server (SIGTERM, SIGKILL after ``timeout``); its objects are lost."""
        if self._proc is not None:
            terminate(self._proc, timeout)

    def pause(self) -> None:
        """Freeze the server (SIGSTOP): requests hang until ``resume()``."""
        if self._proc is not None:
            signal_group(self._proc.pid, signal.SIGSTOP)

    def resume(self) -> None:
        """Thaw a server frozen by ``pause()``."""
        if self._proc is not None:
            signal_group(self._proc.pid, signal.SIGCONT)


class ExternalS3Server:
    """An S3 endpoint the developer brought (``KTS_S3_ENDPOINT``): usable, not controllable."""

    def __init__(self, endpoint: str) -> None:
        self.endpoint = endpoint.rstrip("/")

    def _refuse(self, *_: object, **__: object) -> None:
        raise TestbedError(
            f"the S3 endpoint {self.endpoint} is external (KTS_S3_ENDPOINT): "
            "it cannot be stopped, paused or resumed from the tests"
        )

    stop = pause = resume = _refuse


AnyS3Server = S3Server | ExternalS3Server
"""An S3 server of the test bed: ours, or the endpoint of ``KTS_S3_ENDPOINT``."""


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
