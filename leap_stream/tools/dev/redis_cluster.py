"""A real local Redis Cluster: three masters (Debian's redis-server with ``--cluster-enabled
yes``) joined by ``redis-cli --cluster create``, in one folder on free ports.

The test fixtures start one with `LocalRedisCluster`; ``leap-stream dev up --redis-cluster``
runs one as a dev service (`start`, `is_ready`, `wait_ready`: the interface of the other
services). Masters only (``--cluster-replicas 0``): a dev cluster needs the slot routing and the
one-slot rule of multi-key scripts, not failover. It keeps nothing across restarts: each start
creates a new cluster (its node ids and slots live in files a restart could not reuse).
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from leap_stream.settings import Settings
from leap_stream.tools.dev import state
from leap_stream.tools.dev.kafka import tail_file
from leap_stream.tools.dev.redis import answers, find_redis_server
from leap_stream.tools.dev.state import Paths, ServiceState, free_port, stop_pid

MASTERS = 3
NAME = "redis-cluster"


BUS_OFFSET = 10_000  # each node also listens on port + 10000 (the cluster bus)


def cluster_port() -> int:
    """A free port whose cluster-bus port (+10000) exists and is free too."""
    for _ in range(200):
        port = free_port()
        if port + BUS_OFFSET > 65535:
            continue
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", port + BUS_OFFSET))
            except OSError:
                continue
        return port
    raise RuntimeError("no free port with a free cluster-bus port (+10000)")


class LocalRedisCluster:
    """``masters`` redis-server processes under ``folder``, joined into one cluster."""

    def __init__(self, folder: Path, masters: int = MASTERS) -> None:
        self.folder = folder
        self.ports = [cluster_port() for _ in range(masters)]
        self.pids: list[int] = []

    @property
    def url(self) -> str:
        """A seed node; cluster clients discover the others (``redis://host:port``)."""
        return f"redis://127.0.0.1:{self.ports[0]}"

    def start(self, timeout: float = 60.0) -> None:
        binary = find_redis_server()
        cli = str(Path(binary).with_name("redis-cli"))
        for port in self.ports:
            node = self.folder / str(port)
            node.mkdir(parents=True, exist_ok=True)
            proc = subprocess.Popen(
                [
                    binary, "--port", str(port), "--bind", "127.0.0.1",
                    "--cluster-enabled", "yes", "--cluster-config-file", str(node / "nodes.conf"),
                    "--cluster-node-timeout", "3000", "--save", "", "--appendonly", "no",
                    "--dir", str(node), "--logfile", str(node / "redis.log"),
                ],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
            )  # fmt: skip
            self.pids.append(proc.pid)
        self._wait(lambda port: self._cli(cli, port, "PING") == "PONG", timeout)
        nodes = [f"127.0.0.1:{p}" for p in self.ports]
        create = subprocess.run(
            [cli, "--cluster", "create", *nodes, "--cluster-replicas", "0", "--cluster-yes"],
            capture_output=True, text=True, timeout=timeout,
        )  # fmt: skip
        if create.returncode != 0:
            raise RuntimeError(f"redis-cli --cluster create failed: {create.stdout[-2000:]}")
        self._wait(
            lambda port: "cluster_state:ok" in self._cli(cli, port, "CLUSTER", "INFO"), timeout
        )

    @staticmethod
    def _cli(cli: str, port: int, *args: str) -> str:
        proc = subprocess.run(
            [cli, "-p", str(port), *args], capture_output=True, text=True, timeout=10
        )
        return proc.stdout.strip()

    def _wait(self, ok: Callable[[int], bool], timeout: float) -> None:
        """Until ``ok(port)`` holds for every node."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if all(ok(p) for p in self.ports):
                return
            time.sleep(0.2)
        logs = "\n".join(tail_file(self.folder / str(p) / "redis.log", 5) for p in self.ports)
        raise RuntimeError(f"the Redis Cluster did not come up in {timeout:.0f} s:\n{logs}")

    def kill(self, index: int, sig: int = signal.SIGKILL) -> None:
        """Signal one master (a fault test's kill -9)."""
        os.kill(self.pids[index], sig)

    def stop(self) -> None:
        for pid, port in zip(self.pids, self.ports, strict=False):
            stop_pid(pid, marker=f":{port}")  # redis-server titles itself with its address


def is_ready(url: str, timeout: float = 1.0, cfg: Settings | None = None) -> bool:
    """The seed node answers and says the cluster is ok (every slot served)."""

    def ok(client: Any) -> bool:
        return bool(client.cluster("INFO").get("cluster_state") == "ok")

    return answers(url, ok, timeout, cfg)


def start(
    paths: Paths,
    log: logging.Logger,
    owner: str,
    previous: ServiceState | None,
    cfg: Settings,
) -> ServiceState:
    """A new cluster under ``paths.redis_cluster_dir`` (whatever an earlier one left there is
    removed first); the state's pid is the first master's, ``members`` lists every master."""
    folder = paths.redis_cluster_dir
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    cluster = LocalRedisCluster(folder)
    log.info("starting a Redis Cluster of %d masters on ports %s", MASTERS, cluster.ports)
    try:
        cluster.start(timeout=cfg.dev_ready_timeout_s)
    except RuntimeError:
        cluster.stop()
        raise
    first = cluster.ports[0]
    st = ServiceState(
        name=NAME,
        pid=cluster.pids[0],
        address=cluster.url,
        port=first,
        log=str(folder / str(first) / "redis.log"),
        marker=f":{first}",
        owner=owner,
        started_at=time.time(),
        extra={
            "members": [
                [pid, f":{port}"] for pid, port in zip(cluster.pids, cluster.ports, strict=True)
            ],
            "ports": cluster.ports,
        },
    )
    state.save_state(paths, st)
    return st


def wait_ready(st: ServiceState, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if is_ready(st.address, timeout=0.5):
            return
        time.sleep(0.2)
    raise RuntimeError(
        f"the Redis Cluster at {st.address} is not ok after {timeout:.0f} s; see {st.log}"
    )


__all__ = ["BUS_OFFSET", "MASTERS", "LocalRedisCluster", "cluster_port", "is_ready", "start"]
