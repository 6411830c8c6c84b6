"""`leap-stream dev up` twice is idempotent; status and down work; and it all works twice.

Runs in its own LEAP_HOME on free ports, so the session's services are untouched. The jars come
from the shared $LEAP_HOME cache (fetched there first if needed) through a symlink.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path

import orjson
import pytest

from leap_stream.settings import Settings
from leap_stream.tools.dev import kafka, state

pytestmark = pytest.mark.services


def _cli(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("LEAP_KAFKA_BOOTSTRAP", "LEAP_REDIS_URL", "LEAP_REDIS_CLUSTER")
    }
    env["LEAP_HOME"] = str(home)
    return subprocess.run(
        [sys.executable, "-m", "leap_stream", "dev", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )


def _status(home: Path) -> dict:
    out = _cli(home, "status", "--json")
    assert out.returncode == 0, out.stderr
    return orjson.loads(out.stdout)


@pytest.fixture
def home(tmp_path: Path) -> Path:
    version = Settings.from_env().kafka_version
    shared_paths = state.Paths.from_env()
    lib = kafka.fetch_jars(shared_paths, version, logging.getLogger("test"))  # once, shared
    dist = tmp_path / f"kafka-{version}"
    dist.mkdir()
    (dist / "lib").symlink_to(lib)
    (dist / ".complete").write_text("linked\n")
    yield tmp_path
    _cli(tmp_path, "down", "--timeout", "5")  # never leave a broker behind, even on failure


def test_up_twice_status_down_twice(home: Path) -> None:
    exports: list[dict[str, str]] = []
    for cycle in range(2):
        up = _cli(home, "up", "--env")
        assert up.returncode == 0, up.stderr
        env = state.parse_env(up.stdout)
        assert set(env) == {"LEAP_KAFKA_BOOTSTRAP", "LEAP_REDIS_URL"}, up.stdout
        exports.append(env)
        assert state.parse_env((home / "dev.env").read_text()) == env
        first = _status(home)
        for name in ("kafka", "redis"):
            assert first[name]["running"] and first[name]["ready"], (cycle, first[name])
            assert Path(first[name]["log"]).is_file()
        assert first["kafka"]["address"] == env["LEAP_KAFKA_BOOTSTRAP"]
        assert first["redis"]["address"] == env["LEAP_REDIS_URL"]

        again = _cli(home, "up")  # reuses: same pids, nothing started
        assert again.returncode == 0, again.stderr
        assert "already running" in again.stderr
        assert state.parse_env(again.stdout) == env
        second = _status(home)
        assert [second[n]["pid"] for n in ("kafka", "redis")] == [
            first[n]["pid"] for n in ("kafka", "redis")
        ]

        down = _cli(home, "down")
        assert down.returncode == 0, down.stderr
        assert "kafka: stopped" in down.stdout and "redis: stopped" in down.stdout
        after = _status(home)
        assert not after["kafka"]["running"] and not after["redis"]["running"]
        for name in ("kafka", "redis"):
            assert not state.pid_alive(first[name]["pid"])
    assert exports[1] == exports[0]  # same ports again: exports in a shell stay valid
    assert (home / "logs" / "kafka.log").read_text().count("Kafka Server started") == 2


def test_up_with_a_redis_cluster_exports_it_and_down_stops_every_master(tmp_path: Path) -> None:
    from leap_stream.store.connection import connect

    up = _cli(tmp_path, "up", "--no-kafka", "--redis-cluster", "--env")
    try:
        assert up.returncode == 0, up.stderr
        env = state.parse_env(up.stdout)
        assert env["LEAP_REDIS_CLUSTER"] == "1", up.stdout
        assert (
            state.parse_env((tmp_path / "dev.env").read_text())["LEAP_REDIS_URL"]
            == (env["LEAP_REDIS_URL"])
        )
        info = _status(tmp_path)["redis-cluster"]
        assert info["running"] and info["ready"], info
        members = info["members"]
        assert len(members) == 3 and all(state.pid_alive(pid) for pid, _m in members)
        client = connect(env["LEAP_REDIS_URL"], cluster=True)
        try:
            for i in range(30):
                client.set(f"k{{{i}}}", i)
            owners = {client.get_node_from_key(f"k{{{i}}}").name for i in range(30)}
            assert len(owners) == 3  # the keys really spread over the three masters
        finally:
            client.close()
        again = _cli(tmp_path, "up", "--no-kafka", "--redis-cluster", "--env")
        assert again.returncode == 0 and state.parse_env(again.stdout) == env
        assert _status(tmp_path)["redis-cluster"]["pid"] == info["pid"]  # reused
    finally:
        down = _cli(tmp_path, "down", "--timeout", "5")
    assert down.returncode == 0, down.stderr
    assert "redis-cluster: stopped" in down.stdout
    assert not any(state.pid_alive(pid) for pid, _m in members)
    assert not _status(tmp_path)["redis-cluster"]["running"]
