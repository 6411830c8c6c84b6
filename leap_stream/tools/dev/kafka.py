"""A real Apache Kafka broker (KRaft, one combined node) from Maven Central jars: no Docker, no tarball.

Kafka's published `kafka_2.13` pom brings the broker and its dependencies but no logging backend;
we add log4j2 (the 4.x backend) plus an slf4j 2 API, because Kafka's own slf4j 1.7 API cannot see
log4j-slf4j2-impl and the broker would then log nothing at all.
"""

from __future__ import annotations

import base64
import logging
import os
import shlex
import shutil
import subprocess
import time
import uuid
from pathlib import Path

import orjson

from leap_stream.settings import Settings
from leap_stream.store.files import write_atomic
from leap_stream.stream.kafka import KafkaClients
from leap_stream.tools.dev import state
from leap_stream.tools.dev.state import Paths, ServiceState

NAME = "kafka"
MAIN_CLASS = "kafka.Kafka"
DEFAULT_PORT = 9092
DEFAULT_CONTROLLER_PORT = 9093
LOG4J_VERSION = "2.24.3"
SLF4J_VERSION = "2.0.16"
MAX_MESSAGE_BYTES = 16 * 1024 * 1024  # fault tests send 10 MB that must reach the worker
COMPLETE_MARKER = ".complete"


def render_pom(version: str) -> str:
    deps = [
        ("org.apache.kafka", "kafka_2.13", version),
        ("org.apache.logging.log4j", "log4j-core", LOG4J_VERSION),
        ("org.apache.logging.log4j", "log4j-slf4j2-impl", LOG4J_VERSION),
        ("org.slf4j", "slf4j-api", SLF4J_VERSION),
    ]
    body = "\n".join(
        f"    <dependency><groupId>{g}</groupId><artifactId>{a}</artifactId>"
        f"<version>{v}</version></dependency>"
        for g, a, v in deps
    )
    return f"""<?xml version="1.0" encoding="UTF-8"?>
<!-- written by leap-stream dev up: only used to fetch the broker jars into lib/ -->
<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>leap-stream.dev</groupId>
  <artifactId>kafka-dist</artifactId>
  <version>{version}</version>
  <packaging>pom</packaging>
  <dependencies>
{body}
  </dependencies>
</project>
"""


def render_server_properties(
    *,
    port: int,
    controller_port: int,
    data_dir: Path,
    auto_create_topics: bool = False,
    num_partitions: int = 4,
    host: str = "127.0.0.1",
) -> str:
    props = {
        "process.roles": "broker,controller",
        "node.id": "1",
        "controller.quorum.voters": f"1@{host}:{controller_port}",
        "listeners": f"PLAINTEXT://{host}:{port},CONTROLLER://{host}:{controller_port}",
        "advertised.listeners": f"PLAINTEXT://{host}:{port}",
        "controller.listener.names": "CONTROLLER",
        "inter.broker.listener.name": "PLAINTEXT",
        "listener.security.protocol.map": "CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT",
        "log.dirs": str(data_dir),
        "num.partitions": str(num_partitions),
        "offsets.topic.replication.factor": "1",
        "offsets.topic.num.partitions": "4",
        "transaction.state.log.replication.factor": "1",
        "transaction.state.log.min.isr": "1",
        "share.coordinator.state.topic.replication.factor": "1",
        "share.coordinator.state.topic.min.isr": "1",
        "group.initial.rebalance.delay.ms": "0",
        "auto.create.topics.enable": "true" if auto_create_topics else "false",
        "message.max.bytes": str(MAX_MESSAGE_BYTES),
        "replica.fetch.max.bytes": str(MAX_MESSAGE_BYTES),
        "delete.topic.enable": "true",
        "log.retention.check.interval.ms": "60000",
        "log.segment.bytes": str(64 * 1024 * 1024),
    }
    lines = ["# written by leap-stream dev up; edits are overwritten on the next up"]
    lines += [f"{k}={v}" for k, v in props.items()]
    return "\n".join(lines) + "\n"


def render_log4j2(log_file: Path) -> str:
    """log4j2 properties: one rolling file, so `dev status` can point at a useful log."""
    return f"""# written by leap-stream dev up
status = warn
appender.file.type = RollingFile
appender.file.name = FILE
appender.file.fileName = {log_file}
appender.file.filePattern = {log_file}.%i
appender.file.layout.type = PatternLayout
appender.file.layout.pattern = [%d] %p %m (%c)%n
appender.file.policies.type = Policies
appender.file.policies.size.type = SizeBasedTriggeringPolicy
appender.file.policies.size.size = 50MB
appender.file.strategy.type = DefaultRolloverStrategy
appender.file.strategy.max = 3
rootLogger.level = INFO
rootLogger.appenderRef.file.ref = FILE
logger.request.name = kafka.request.logger
logger.request.level = WARN
logger.clients.name = org.apache.kafka.clients
logger.clients.level = WARN
"""


def fetch_jars(paths: Paths, version: str, log: logging.Logger) -> Path:
    """lib/ with the broker's runtime jars, fetched with Maven once per version (then reused)."""
    dist = paths.kafka_dist(version)
    lib = dist / "lib"
    if (dist / COMPLETE_MARKER).exists() and any(lib.glob("kafka_2.13-*.jar")):
        return lib
    mvn = shutil.which("mvn")
    if mvn is None:
        raise RuntimeError(
            "Maven (`mvn`) is needed once to fetch the Kafka jars: apt-get install -y maven "
            "(or run .ci/run, which installs it), or set LEAP_KAFKA_BOOTSTRAP to an existing broker"
        )
    dist.mkdir(parents=True, exist_ok=True)
    (dist / "pom.xml").write_text(render_pom(version))
    tmp_lib = dist / f"lib.tmp.{os.getpid()}"  # unique: another process may be fetching too
    shutil.rmtree(tmp_lib, ignore_errors=True)
    log.info("fetching Kafka %s jars with Maven into %s (once)", version, lib)
    out_file = paths.logs / f"maven-kafka-{version}.{os.getpid()}.log"
    paths.logs.mkdir(parents=True, exist_ok=True)
    cmd = [
        mvn,
        "-q",
        "-B",
        "-f",
        str(dist / "pom.xml"),
        "dependency:copy-dependencies",
        "-DincludeScope=runtime",
        f"-DoutputDirectory={tmp_lib}",
    ]
    with out_file.open("wb") as out:
        rc = subprocess.call(cmd, stdout=out, stderr=subprocess.STDOUT, cwd=dist)
    if rc != 0 or not any(tmp_lib.glob("kafka_2.13-*.jar")):
        tail = tail_file(out_file, 15)
        raise RuntimeError(
            f"Maven could not fetch org.apache.kafka:kafka_2.13:{version} (exit {rc}); "
            f"see {out_file}:\n{tail}"
        )
    if (dist / COMPLETE_MARKER).exists() and any(lib.glob("kafka_2.13-*.jar")):
        shutil.rmtree(tmp_lib, ignore_errors=True)  # someone else finished first
        return lib
    shutil.rmtree(lib, ignore_errors=True)
    os.replace(tmp_lib, lib)
    (dist / COMPLETE_MARKER).write_text(f"{len(list(lib.glob('*.jar')))} jars\n")
    return lib


def java_binary() -> str:
    java_home = os.environ.get("JAVA_HOME")
    if java_home and (Path(java_home) / "bin" / "java").exists():
        return str(Path(java_home) / "bin" / "java")
    java = shutil.which("java")
    if java is None:
        raise RuntimeError(
            "Java 17+ is needed for the local broker: apt-get install -y openjdk-17-jre-headless "
            "(or set LEAP_KAFKA_BOOTSTRAP to an existing broker)"
        )
    return java


def java_command(
    lib: Path, log4j_file: Path, heap: str, main: str, *args: str, jvm_opts: str = ""
) -> list[str]:
    return [
        java_binary(),
        *shlex.split(heap),
        *shlex.split(jvm_opts),
        "-Djava.awt.headless=true",
        f"-Dlog4j2.configurationFile={log4j_file}",
        "-cp",
        f"{lib}/*",
        main,
        *args,
    ]


def new_cluster_id() -> str:
    """16 random bytes in URL-safe base64 without padding, as Kafka's `Uuid.randomUuid()`.

    Like Kafka, never one that starts with "-": the command-line tools would read it as an option.
    """
    while True:
        cid = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if not cid.startswith("-"):
            return cid


def format_storage(lib: Path, run_dir: Path, props_file: Path, log4j_file: Path) -> bool:
    """Format the KRaft metadata directory once; returns True when it formatted now."""
    data_dir = run_dir / "data"
    if (data_dir / "meta.properties").exists():
        return False
    cluster_file = run_dir / "cluster.id"
    if not cluster_file.exists():
        cluster_file.write_text(new_cluster_id() + "\n")
    cid = cluster_file.read_text().strip()
    cmd = java_command(
        lib,
        log4j_file,
        "-Xmx256m",
        "kafka.tools.StorageTool",
        "format",
        f"--cluster-id={cid}",  # one token: an id may not be mistaken for an option
        "-c",
        str(props_file),
        "--ignore-formatted",
    )
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise RuntimeError(
            f"kafka StorageTool format failed (exit {proc.returncode}):\n{proc.stdout}{proc.stderr}"
        )
    return True


def spawn_detached(cmd: list[str], out_file: Path, cwd: Path) -> int:
    """Start `cmd` in its own session, detached from us, and return its pid.

    A throwaway `sh` backgrounds the command and exits at once, so the service is not our child:
    no zombie in a long-lived test process and no Popen "still running" warning at exit. The pid
    is returned once the backgrounded shell has exec'd the command, so a liveness check by
    command line right after the start sees the service, not the shell.
    """
    script = 'out=$1; shift; "$@" >>"$out" 2>&1 </dev/null & echo $!'
    proc = subprocess.run(
        ["sh", "-c", script, "sh", str(out_file), *cmd],
        capture_output=True,
        text=True,
        cwd=cwd,
        start_new_session=True,
        check=True,
    )
    pid = int(proc.stdout.strip())
    deadline = time.monotonic() + 5.0
    while script in (state._proc_cmdline(pid) or "") and time.monotonic() < deadline:
        time.sleep(0.01)
    return pid


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except FileNotFoundError:
        return 0


def tail_file(path: Path, lines: int = 20, since: int = 0) -> str:
    """Last lines of a log, only from offset `since` (this start), not an earlier run's."""
    try:
        with path.open("rb") as fh:
            fh.seek(0, os.SEEK_END)
            fh.seek(max(since, fh.tell() - 16384))
            return b"\n".join(fh.read().splitlines()[-lines:]).decode(errors="replace")
    except FileNotFoundError:
        return "(no log yet)"


def is_ready(bootstrap: str, timeout: float = 2.0, cfg: Settings | None = None) -> bool:
    """A real metadata round trip through librdkafka, not just an open port."""
    from confluent_kafka import KafkaException

    host, port = state.split_hostport(bootstrap, DEFAULT_PORT)
    if not state.tcp_reachable(host, port, timeout=min(timeout, 1.0)):
        return False
    kafka = KafkaClients.of(cfg or Settings.from_env(), bootstrap)
    try:
        # silent: refused connections are expected while the broker starts
        md = kafka.admin({"log_level": 0}).list_topics(timeout=timeout)
    except KafkaException:
        return False
    return bool(md.brokers)


def start(
    paths: Paths,
    log: logging.Logger,
    owner: str,
    previous: ServiceState | None,
    cfg: Settings,
) -> ServiceState:
    """Fetch (once), configure, format (once) and start the broker; returns once it answers."""
    version = cfg.kafka_version
    lib = fetch_jars(paths, version, log)
    run_dir = paths.kafka_dir
    run_dir.mkdir(parents=True, exist_ok=True)
    ports_file = run_dir / "ports.json"  # kept across down/up: dev.env exports stay valid
    old = dict(previous.extra) if previous else {}
    if ports_file.exists():
        old.update(orjson.loads(ports_file.read_bytes()))
    # the previous ports first: a formatted KRaft directory and clients' dev.env keep working
    port = state.pick_port(cfg.kafka_port, int(old.get("port", DEFAULT_PORT)))
    controller_port = state.pick_port(
        cfg.kafka_controller_port,
        int(old.get("controller_port", DEFAULT_CONTROLLER_PORT)),
        avoid=[port],
    )
    write_atomic(ports_file, orjson.dumps({"port": port, "controller_port": controller_port}))
    log_file = paths.log_file(NAME)
    props_file = run_dir / "server.properties"
    log4j_file = run_dir / "log4j2.properties"
    props_file.write_text(
        render_server_properties(
            port=port,
            controller_port=controller_port,
            data_dir=run_dir / "data",
            auto_create_topics=cfg.kafka_auto_create_topics,
        )
    )
    log4j_file.write_text(render_log4j2(log_file))
    format_storage(lib, run_dir, props_file, log4j_file)
    out_file = paths.logs / "kafka.out"
    cmd = java_command(
        lib,
        log4j_file,
        cfg.kafka_heap,
        MAIN_CLASS,
        str(props_file),
        jvm_opts=cfg.kafka_jvm_opts,
    )
    offsets = {"log_offset": _size(log_file), "stdout_offset": _size(out_file)}
    log.info("starting Kafka %s on 127.0.0.1:%d (controller %d)", version, port, controller_port)
    pid = spawn_detached(cmd, out_file, run_dir)
    bootstrap = f"127.0.0.1:{port}"
    st = ServiceState(
        name=NAME,
        pid=pid,
        address=bootstrap,
        port=port,
        log=str(log_file),
        marker=str(props_file),
        owner=owner,
        started_at=time.time(),
        extra={
            "port": port,
            "controller_port": controller_port,
            "version": version,
            "stdout": str(out_file),
            "data": str(run_dir / "data"),
            **offsets,
        },
    )
    state.save_state(paths, st)
    wait_ready(st, cfg.dev_ready_timeout_s)
    return st


def wait_ready(st: ServiceState, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not state.pid_alive(st.pid, st.marker):
            log_tail = tail_file(Path(st.log), since=int(st.extra.get("log_offset", 0)))
            out = Path(str(st.extra.get("stdout")))
            out_tail = tail_file(out, 10, since=int(st.extra.get("stdout_offset", 0)))
            raise RuntimeError(
                f"Kafka exited during start-up; see {st.log} and {out}:\n{log_tail}\n{out_tail}"
            )
        if is_ready(st.address, timeout=2.0):
            return
        time.sleep(0.5)
    raise RuntimeError(
        f"Kafka (pid {st.pid}) did not answer on {st.address} within {timeout:.0f} s "
        f"(LEAP_DEV_READY_TIMEOUT_S); it is left running, see {st.log}:\n{tail_file(Path(st.log))}"
    )
