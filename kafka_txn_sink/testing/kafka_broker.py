"""Apache Kafka's own broker (KRaft, one node) on loopback ports, from jars of Maven Central.

``KafkaBroker`` is ours (start, stop, kill, restart); ``ExternalKafkaBroker`` is one the developer
brought with ``KTS_KAFKA_BOOTSTRAP``. ``confluent_kafka`` is imported only where a broker is
probed or a topic created.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import uuid
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any, ClassVar

from kafka_txn_sink.testing.errors import TestbedError
from kafka_txn_sink.testing.jars import default_kafka_version, kafka_jars
from kafka_txn_sink.testing.processes import (
    LOOPBACK,
    free_port,
    java_executable,
    spawn,
    tail,
    terminate,
    wait_for,
)

BROKER_DEFAULTS: dict[str, object] = {
    "process.roles": "broker,controller",
    "node.id": 1,
    "controller.listener.names": "CONTROLLER",
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


SettingValue = str | int | float | bool
"""The value of one librdkafka setting."""
Settings = Mapping[str, SettingValue]
"""librdkafka settings of a client, other than ``bootstrap.servers`` (e.g. its security)."""


def admin_client(bootstrap: str, settings: Settings | None = None) -> Any:
    """A quiet ``confluent_kafka`` AdminClient of ``bootstrap`` with ``settings``."""
    from confluent_kafka.admin import AdminClient

    return AdminClient({"bootstrap.servers": bootstrap, **QUIET, **(settings or {})})


def probe_broker(
    bootstrap: str, timeout: float = 5.0, settings: Settings | None = None
) -> bool | None:
    """True when metadata is served, a transactional producer can init and the group coordinator
    answers an offset fetch; else None."""
    from confluent_kafka import Consumer, Producer, TopicPartition

    metadata = admin_client(bootstrap, settings).list_topics(timeout=timeout)
    if not metadata.brokers:
        return None
    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "transactional.id": f"testbed-probe-{uuid.uuid4().hex}",
            "transaction.timeout.ms": 10000,
            **QUIET,
            **(settings or {}),
        }
    )
    producer.init_transactions(timeout)  # raises KafkaException until the coordinator is up
    # The first group request creates the offsets topic; until its partitions are loaded the
    # coordinator answers NOT_COORDINATOR, which librdkafka's AdminClient turns into a segfault
    # of the whole process (librdkafka issue 5040, docs/development.md). The sink no longer asks
    # through it; tests still may (the crash suite's group oracle). A running cluster has its
    # offsets topic loaded long before: so has the test bed, once this answers.
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"testbed-probe-{uuid.uuid4().hex}",
            "enable.auto.commit": False,
            **QUIET,
            **(settings or {}),
        }
    )
    try:
        consumer.committed([TopicPartition("testbed-probe", 0)], timeout=timeout)
    finally:
        consumer.close()
    return True


def wait_broker_ready(
    bootstrap: str, timeout: float = 90.0, on_timeout: Callable[[], str] = lambda: ""
) -> None:
    """Wait until ``bootstrap`` serves metadata and transactions (coordinator loaded)."""
    wait_for(
        lambda: probe_broker(bootstrap),
        timeout,
        f"Kafka at {bootstrap}",
        interval=1.0,
        on_timeout=on_timeout,
    )


def create_topic(
    bootstrap: str,
    name: str,
    partitions: int = 3,
    config: Mapping[str, str] | None = None,
    timeout: float = 30.0,
    settings: Settings | None = None,
    replication_factor: int = 1,
) -> None:
    """Create a topic and wait until every partition has a leader in the metadata."""
    from confluent_kafka.admin import NewTopic

    admin = admin_client(bootstrap, settings)
    topic = NewTopic(
        name,
        num_partitions=partitions,
        replication_factor=replication_factor,
        config=dict(config or {}),
    )
    admin.create_topics([topic], request_timeout=timeout)[name].result(timeout=timeout)

    def ready() -> bool | None:
        meta = admin.list_topics(topic=name, timeout=5).topics.get(name)
        if meta is None or meta.error is not None or len(meta.partitions) != partitions:
            return None
        return all(p.leader >= 0 for p in meta.partitions.values()) or None

    wait_for(ready, timeout, f"metadata of topic {name}")


CONTROLLER = "CONTROLLER"


class KafkaBroker:
    """A single-node KRaft Kafka broker+controller on loopback ports, data in ``workdir``.

    Ports are chosen on the first start and kept, so ``restart()`` gives the same bootstrap
    address and the same data. A subclass changes the listeners (``LISTENERS``), the broker's
    settings (``config``), what is written before a start (``_write_files``), the class path
    of its JVMs (``_classpath``), the options of the storage format and the client the test bed
    itself uses (``setup_settings``).
    """

    #: Listener name -> security protocol; ``bootstrap`` is the first one's address and
    #: ``CONTROLLER`` the KRaft controller's own (never advertised).
    LISTENERS: ClassVar[Mapping[str, str]] = {"PLAINTEXT": "PLAINTEXT", CONTROLLER: "PLAINTEXT"}
    #: The listener the broker talks to itself on.
    INTER_BROKER_LISTENER: ClassVar[str] = "PLAINTEXT"

    def __init__(
        self,
        workdir: Path | str,
        version: str | None = None,
        extra_config: Mapping[str, object] | None = None,
        heap: str = "768m",
        detached: bool = False,
    ) -> None:
        self.workdir = Path(workdir).resolve()
        self._version = version or default_kafka_version()
        self.extra_config = dict(extra_config or {})
        self.heap = heap
        self.detached = detached
        self._ports: dict[str, int] = {}
        self._proc: subprocess.Popen[bytes] | None = None

    # ---- properties -------------------------------------------------------------------------

    @property
    def version(self) -> str:
        """The broker's Kafka version."""
        return self._version

    @property
    def bootstrap(self) -> str:
        """``127.0.0.1:port`` of the first listener (known once started)."""
        return self.address(next(iter(self.LISTENERS)))

    def address(self, listener: str) -> str:
        """``127.0.0.1:port`` of ``listener`` (known once started)."""
        if listener not in self._ports:
            raise TestbedError(f"the broker has not been started yet (listener {listener})")
        return f"{LOOPBACK}:{self._ports[listener]}"

    @property
    def log_path(self) -> Path:
        """The broker's console log."""
        return self.workdir / "broker.log"

    @property
    def config_path(self) -> Path:
        """The server.properties it was started with."""
        return self.workdir / "server.properties"

    @property
    def data_dir(self) -> Path:
        """``log.dirs``: kept across restarts."""
        return self.workdir / "data"

    @property
    def pid(self) -> int | None:
        """The broker process's id (None before the first start)."""
        return self._proc.pid if self._proc is not None else None

    def is_running(self) -> bool:
        """Whether the broker process is alive."""
        return self._proc is not None and self._proc.poll() is None

    # ---- configuration ------------------------------------------------------------------------

    def config(self) -> dict[str, object]:
        """The effective server.properties: defaults, listeners, then ``extra_config``."""
        conf: dict[str, object] = dict(BROKER_DEFAULTS)
        if _major(self.version) >= 4:
            conf.update(BROKER_DEFAULTS_4X)
        conf.update(self._listener_config())
        conf["log.dirs"] = str(self.data_dir)
        conf.update(self.extra_config)
        return conf

    def _listener_config(self) -> dict[str, object]:
        """The settings of the listeners (and, in a subclass, of their security)."""
        return {
            "listeners": ",".join(f"{name}://{self.address(name)}" for name in self.LISTENERS),
            "advertised.listeners": ",".join(
                f"{name}://{self.address(name)}" for name in self.LISTENERS if name != CONTROLLER
            ),
            "listener.security.protocol.map": ",".join(
                f"{name}:{protocol}" for name, protocol in self.LISTENERS.items()
            ),
            "inter.broker.listener.name": self.INTER_BROKER_LISTENER,
            "controller.quorum.voters": self._quorum_voters(),
        }

    def _quorum_voters(self) -> str:
        """``controller.quorum.voters``: this node alone (``node.id`` 1)."""
        return f"1@{self.address(CONTROLLER)}"

    def setup_settings(self) -> dict[str, SettingValue]:
        """librdkafka settings (besides ``bootstrap.servers``) of the client the test bed uses
        for probes and topics: none on this plaintext broker."""
        return {}

    def _write_files(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        lines = [f"{key}={value}" for key, value in self.config().items()]
        self.config_path.write_text("\n".join(lines) + "\n")
        (self.workdir / "log4j2.properties").write_text(LOG4J2_PROPERTIES)

    def _java(self, *args: str, server: bool = False) -> list[str]:
        java = java_executable(
            "it runs Apache Kafka's broker (or set KTS_KAFKA_BOOTSTRAP to a broker of your own)"
        )
        # The broker: G1 and a modest heap; the short-lived tools: start fast.
        tuning = (
            [f"-Xmx{self.heap}", "-XX:+UseG1GC"]
            if server
            else ["-Xmx256m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1"]
        )
        return [
            java,
            *tuning,
            f"-Dlog4j2.configurationFile={self.workdir / 'log4j2.properties'}",
            "-cp",
            os.pathsep.join(self._classpath()),
            *args,
        ]

    def _classpath(self) -> list[str]:
        """The class path of every JVM of this broker (the broker and its tools): Kafka's jars;
        a subclass appends its own classes (e.g. a SASL callback handler)."""
        return [f"{kafka_jars(self.version)}/*"]

    def _format_storage(self) -> None:
        """Format ``log.dirs`` once (KRaft needs a cluster id and meta.properties)."""
        if (self.data_dir / "meta.properties").exists():
            return
        self._run_tool(
            "kafka.tools.StorageTool",
            "format",
            "-t",
            self._cluster_id(),
            "-c",
            str(self.config_path),
            *self._format_options(),
        )

    def _cluster_id(self) -> str:
        """The cluster id the storage is formatted with: a new one from Kafka's tool."""
        return self.new_cluster_id()

    def new_cluster_id(self) -> str:
        """A new KRaft cluster id, made by Kafka's own storage tool."""
        self.workdir.mkdir(parents=True, exist_ok=True)
        uuid_run = self._run_tool("kafka.tools.StorageTool", "random-uuid")
        return uuid_run.strip().splitlines()[-1].strip()

    def _format_options(self) -> list[str]:
        """More options of the storage format (e.g. SCRAM credentials): none here."""
        return []

    def _run_tool(self, *args: str) -> str:
        done = subprocess.run(
            self._java(*args),
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
            cwd=self.workdir,
        )
        if done.returncode != 0:
            raise TestbedError(
                f"{' '.join(args)} failed ({done.returncode}):\n"
                f"{done.stdout[-2000:]}{done.stderr[-2000:]}"
            )
        return done.stdout

    # ---- lifecycle ----------------------------------------------------------------------------

    def start(self, timeout: float = 90.0) -> str:
        """Start (or start again) the broker and wait until transactions work."""
        if self.is_running():
            return self.bootstrap
        self.launch()
        self.wait_ready(timeout)
        return self.bootstrap

    def launch(self) -> None:
        """Start the broker's process without waiting for it (ports chosen on the first launch,
        storage formatted once); ``wait_ready`` waits."""
        if not self._ports:
            self._ports = {name: free_port() for name in self.LISTENERS}
        self._write_files()
        self._format_storage()
        cmd = self._java("kafka.Kafka", str(self.config_path), server=True)
        self._proc = spawn(cmd, self.log_path, self.workdir, self.detached)

    def wait_ready(self, timeout: float = 90.0) -> None:
        """Wait until the launched broker serves metadata and transactions; kill it if it does
        not within ``timeout``."""

        def ready() -> bool | None:
            if not self.is_running():
                raise TestbedError(f"the Kafka broker exited during start\n{self._diagnose()}")
            return probe_broker(self.bootstrap, settings=self.setup_settings())

        try:
            wait_for(
                ready,
                timeout,
                f"Kafka {self.version} at {self.bootstrap}",
                interval=1.0,
                on_timeout=self._diagnose,
            )
        except BaseException:
            self.kill()
            raise

    def _diagnose(self) -> str:
        state = "running" if self.is_running() else f"exited ({self._exit_code()})"
        return f"broker {self.version} pid {self.pid} {state}\n{tail(self.log_path, 50)}"

    def _exit_code(self) -> int | None:
        return self._proc.poll() if self._proc is not None else None

    def stop(self, timeout: float = 30.0) -> None:
        """Graceful shutdown (SIGTERM), SIGKILL after ``timeout``."""
        if self._proc is not None:
            terminate(self._proc, timeout)

    def kill(self) -> None:
        """Crash the broker: SIGKILL, no shutdown hooks."""
        if self._proc is not None:
            terminate(self._proc, timeout=30.0, sig=signal.SIGKILL)

    def restart(self, timeout: float = 90.0, graceful: bool = True) -> str:
        """Stop (or kill) and start again: same ports, same data."""
        if graceful:
            self.stop()
        else:
            self.kill()
        return self.start(timeout)

    def create_topic(
        self,
        name: str,
        partitions: int = 3,
        config: Mapping[str, str] | None = None,
        timeout: float = 30.0,
    ) -> str:
        """Create topic ``name`` on this broker (see ``create_topic``); returns the name."""
        create_topic(
            self.bootstrap, name, partitions, config, timeout, settings=self.setup_settings()
        )
        return name

    def __repr__(self) -> str:
        port = self._ports.get(next(iter(self.LISTENERS)), "-")
        return f"{type(self).__name__}(version={self.version}, port={port}, workdir={self.workdir})"


class ExternalKafkaBroker:
    """A broker the developer brought (``KTS_KAFKA_BOOTSTRAP``): usable, not controllable."""

    def __init__(self, bootstrap: str) -> None:
        self._bootstrap = bootstrap
        self.version: str | None = None
        self.log_path: Path | None = None

    @property
    def bootstrap(self) -> str:
        """The bootstrap address the developer gave."""
        return self._bootstrap

    def start(self, timeout: float = 90.0) -> str:
        """Wait until the external broker serves transactions; returns its address."""
        wait_broker_ready(self.bootstrap, timeout)
        return self.bootstrap

    def create_topic(
        self,
        name: str,
        partitions: int = 3,
        config: Mapping[str, str] | None = None,
        timeout: float = 30.0,
    ) -> str:
        """Create topic ``name`` on this broker (see ``create_topic``); returns the name."""
        create_topic(self.bootstrap, name, partitions, config, timeout)
        return name

    def _refuse(self, *_: object, **__: object) -> str:
        raise TestbedError(
            f"the broker at {self.bootstrap} is external (KTS_KAFKA_BOOTSTRAP): "
            "it cannot be stopped, killed or restarted from the tests"
        )

    stop = kill = restart = _refuse


AnyKafkaBroker = KafkaBroker | ExternalKafkaBroker
"""A broker of the test bed: ours, or the one of ``KTS_KAFKA_BOOTSTRAP``."""


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
