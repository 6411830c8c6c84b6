"""A local redis-server (Debian package) for the online store: no persistence, a pid file, a log."""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from leap_stream.settings import Settings
from leap_stream.store.files import write_atomic
from leap_stream.tools.dev import state
from leap_stream.tools.dev.kafka import _size, spawn_detached, tail_file
from leap_stream.tools.dev.state import Paths, ServiceState

NAME = "redis"
DEFAULT_PORT = 6379
_SEARCH = ("/usr/bin/redis-server", "/usr/sbin/redis-server", "/usr/local/bin/redis-server")


def find_redis_server(install: bool = True) -> str:
    """Path of redis-server; installs the Debian package when missing and we are root."""
    found = shutil.which("redis-server") or next((p for p in _SEARCH if Path(p).exists()), None)
    if found:
        return found
    if not install or os.geteuid() != 0 or shutil.which("apt-get") is None:
        raise RuntimeError(
            "redis-server is not installed: run `sudo apt-get install -y redis-server` "
            "(or .ci/run), or set LEAP_REDIS_URL to an existing Redis"
        )
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    subprocess.run(["apt-get", "update", "-q"], check=True, env=env)
    subprocess.run(["apt-get", "install", "-y", "-q", "redis-server"], check=True, env=env)
    return find_redis_server(install=False)


def redis_command(
    binary: str, port: int, run_dir: Path, log_file: Path, pid_file: Path
) -> list[str]:
    return [
        binary,
        "--port",
        str(port),
        "--bind",
        "127.0.0.1",
        "--save",
        "",
        "--appendonly",
        "no",
        "--daemonize",
        "no",
        "--protected-mode",
        "yes",
        "--dir",
        str(run_dir),
        "--pidfile",
        str(pid_file),
        "--logfile",
        str(log_file),
    ]


def is_ready(url: str, timeout: float = 1.0, cfg: Settings | None = None) -> bool:
    host, port = state.split_hostport(url, DEFAULT_PORT)
    if not state.tcp_reachable(host, port, timeout=timeout):
        return False
    return answers(url, lambda client: bool(client.ping()), timeout, cfg)


def answers(
    url: str, question: Callable[[Any], bool], timeout: float, cfg: Settings | None = None
) -> bool:
    """``question(client)`` for a short-lived client of the Redis at ``url`` (with the
    configured password); False when it cannot be asked."""
    import redis as redis_py

    password = (cfg or Settings.from_env()).redis_password or None
    client = redis_py.Redis.from_url(
        url, password=password, socket_timeout=timeout, socket_connect_timeout=timeout
    )
    try:
        return question(client)
    except (redis_py.RedisError, OSError):
        return False
    finally:
        client.close()


def start(
    paths: Paths,
    log: logging.Logger,
    owner: str,
    previous: ServiceState | None,
    cfg: Settings,
) -> ServiceState:
    binary = find_redis_server()
    run_dir = paths.redis_dir
    run_dir.mkdir(parents=True, exist_ok=True)
    port_file = run_dir / "port"  # kept across down/up: dev.env exports stay valid
    old_port = int(previous.port) if previous else DEFAULT_PORT
    if port_file.exists() and port_file.read_text().strip().isdigit():
        old_port = int(port_file.read_text())
    port = state.pick_port(cfg.redis_port, old_port)
    write_atomic(port_file, f"{port}\n".encode())
    log_file = paths.log_file(NAME)
    paths.logs.mkdir(parents=True, exist_ok=True)
    redis_pid_file = run_dir / "redis-server.pid"  # redis writes this one itself
    cmd = redis_command(binary, port, run_dir, log_file, redis_pid_file)
    log_offset = _size(log_file)
    log.info("starting redis-server on 127.0.0.1:%d", port)
    pid = spawn_detached(cmd, paths.logs / "redis.out", run_dir)
    url = f"redis://127.0.0.1:{port}/0"
    st = ServiceState(
        name=NAME,
        pid=pid,
        address=url,
        port=port,
        log=str(log_file),
        marker=f":{port}",  # redis rewrites its title to "redis-server 127.0.0.1:<port>"
        owner=owner,
        started_at=time.time(),
        extra={"binary": binary, "stdout": str(paths.logs / "redis.out"), "log_offset": log_offset},
    )
    state.save_state(paths, st)
    wait_ready(st, cfg.dev_ready_timeout_s)
    return st


def wait_ready(st: ServiceState, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not state.pid_alive(st.pid):
            raise RuntimeError(
                f"redis-server exited during start-up; see {st.log}:\n"
                f"{tail_file(Path(st.log), since=int(st.extra.get('log_offset', 0)))}\n"
                f"{tail_file(Path(str(st.extra.get('stdout'))), 10)}"
            )
        if is_ready(st.address, timeout=0.5):
            return
        time.sleep(0.1)
    raise RuntimeError(
        f"redis-server (pid {st.pid}) did not answer on {st.address} within {timeout:.0f} s; "
        f"see {st.log}:\n{tail_file(Path(st.log))}"
    )
