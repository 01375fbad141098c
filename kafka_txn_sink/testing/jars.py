"""The pinned versions of the test bed and its jars, resolved by Maven from Maven Central.

The pins are ``versions.env`` beside this module (KEY=VALUE; ``ci/setup.sh`` reads it too), the
poms are ``poms/``, and Maven's settings ``maven-settings.xml``. Jars are cached under
``$KTS_CACHE`` or ``~/.cache/kafka_txn_sink``, one directory per resolution.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import warnings
from collections.abc import Mapping
from pathlib import Path

from kafka_txn_sink.testing.errors import TestbedError
from kafka_txn_sink.testing.processes import maven_executable

PACKAGE_DIR = Path(__file__).resolve().parent
POMS_DIR = PACKAGE_DIR / "poms"
VERSIONS_FILE = PACKAGE_DIR / "versions.env"
MAVEN_SETTINGS = PACKAGE_DIR / "maven-settings.xml"
MARKER = ".complete"


# --------------------------------------------------------------------------------------------
# Versions and cache
# --------------------------------------------------------------------------------------------


def read_versions(path: Path = VERSIONS_FILE) -> dict[str, str]:
    """The KEY=VALUE pairs of versions.env (comments and blank lines ignored)."""
    pairs: dict[str, str] = {}
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith("#") or "=" not in line:
            continue
        key, _, value = line.partition("=")
        pairs[key.strip()] = value.strip().strip("'\"")
    return pairs


def pinned(key: str) -> str:
    """One pinned version from versions.env; fails loudly when it is missing."""
    versions = read_versions()
    if key not in versions:
        raise TestbedError(f"{key} is not set in {VERSIONS_FILE}")
    return versions[key]


def default_kafka_version() -> str:
    """``$KTS_KAFKA_VERSION`` or KAFKA_VERSION of versions.env."""
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
# Maven
# --------------------------------------------------------------------------------------------


def _mvn_copy_dependencies(pom: Path, props: Mapping[str, str], out: Path) -> list[Path]:
    """Resolve ``pom``'s runtime dependencies into ``out`` once; a marker records success.

    Maven writes into a private staging directory that is renamed into place, so concurrent
    runs (set-up and a test session) never see half a directory."""
    if (out / MARKER).exists():
        return sorted(out.glob("*.jar"))
    mvn = maven_executable()
    settings = ["-s", str(MAVEN_SETTINGS)] if MAVEN_SETTINGS.exists() else []
    staging = out.with_name(f"{out.name}.partial-{os.getpid()}")
    errors: list[str] = []
    for extra in ([], ["-U"]):  # -U only on retry: re-check what a failed run cached
        shutil.rmtree(staging, ignore_errors=True)
        cmd = [
            mvn,
            "-q",
            "-B",
            *settings,
            *extra,
            "dependency:copy-dependencies",
            "-f",
            str(pom),
            *(f"-D{key}={value}" for key, value in props.items()),
            "-DincludeScope=runtime",
            f"-DoutputDirectory={staging}",
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


# --------------------------------------------------------------------------------------------
# The broker's jars and Spark's
# --------------------------------------------------------------------------------------------


def kafka_jars(version: str | None = None) -> Path:
    """The directory holding the jars of Kafka broker ``version`` (resolved on first use)."""
    version = version or default_kafka_version()
    props = {"kafka.version": version, "log4j.version": pinned("LOG4J_VERSION")}
    out = cache_dir() / f"kafka-{version}"
    _mvn_copy_dependencies(POMS_DIR / "kafka-broker.xml", props, out)
    return out


def kafka_tools_jars(version: str | None = None) -> Path:
    """The directory holding Kafka's command-line tools of ``version`` (resolved on first use):
    what ``kafka-consumer-groups.sh`` runs."""
    version = version or default_kafka_version()
    props = {"kafka.version": version, "log4j.version": pinned("LOG4J_VERSION")}
    out = cache_dir() / f"kafka-tools-{version}"
    _mvn_copy_dependencies(POMS_DIR / "kafka-tools.xml", props, out)
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
    """Warn when pyspark's minor version is not the Kafka connector's, unless versions.env pins
    that pair: the Kafka source of another minor may fail in streaming queries (Spark's internal
    checkpoint classes change)."""
    installed = pyspark_version()
    connector = spark_package_versions()["spark.kafka.version"]
    tested = (pinned("SPARK_NEWEST_VERSION"), pinned("SPARK_NEWEST_CONNECTOR_VERSION"))
    if not installed or installed.split(".")[:2] == connector.split(".")[:2]:
        return
    if (installed, connector) != tested:
        warnings.warn(
            f"pyspark {installed} is installed but the Kafka connector resolved is "
            f"{connector} (versions.env, KTS_SPARK_KAFKA_VERSION)",
            stacklevel=3,
        )


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


def newest_spark_line() -> str:
    """The newest tested Spark line's major.minor (SPARK_NEWEST_VERSION of versions.env)."""
    return ".".join(pinned("SPARK_NEWEST_VERSION").split(".")[:2])


def spark_newest_package_env() -> dict[str, str]:
    """The environment in which ``spark_jars()`` resolves the packages of the newest Spark line
    (SPARK_NEWEST_VERSION of versions.env): every package at SPARK_NEWEST_CONNECTOR_VERSION."""
    version = pinned("SPARK_NEWEST_CONNECTOR_VERSION")
    return {
        "KTS_SPARK_KAFKA_VERSION": version,
        "KTS_SPARK_TOKEN_PROVIDER_VERSION": version,
        "KTS_SPARK_AVRO_VERSION": version,
    }


def spark_jars_of(python: str, env: Mapping[str, str]) -> list[str]:
    """``spark_jars()`` as interpreter ``python`` (another venv, another PySpark) resolves them
    with ``env`` over this process's environment: jars its PySpark does not ship."""
    code = "from kafka_txn_sink.testing import spark_jars; print(','.join(map(str, spark_jars())))"
    done = subprocess.run(
        [python, "-W", "ignore", "-c", code],
        capture_output=True,
        text=True,
        env={**os.environ, **env},
        timeout=1800,
        check=False,
    )
    if done.returncode != 0:
        raise TestbedError(f"{python} could not resolve its Spark jars:\n{done.stderr[-3000:]}")
    return done.stdout.strip().splitlines()[-1].split(",")
