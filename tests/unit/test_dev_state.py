"""Pid files, liveness, stopping, ports, leases and the env file: no broker, no Redis."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from leap_stream.tools.dev import state
from leap_stream.tools.dev.kafka import spawn_detached
from leap_stream.tools.dev.state import Paths, ServiceState


def test_pid_file_round_trip_and_garbage(tmp_path: Path) -> None:
    f = tmp_path / "x.pid"
    assert state.read_pid(f) is None
    state.write_pid(f, 4242)
    assert state.read_pid(f) == 4242
    for junk in ("", "abc", "-3", "0", "12 13"):
        f.write_text(junk)
        assert state.read_pid(f) is None, junk


def test_pid_alive_checks_the_marker() -> None:
    me = os.getpid()
    assert state.pid_alive(me)
    assert state.pid_alive(me, marker="python")
    assert not state.pid_alive(me, marker="definitely-not-in-my-cmdline-7f3a")
    assert not state.pid_alive(None)
    assert not state.pid_alive(0)


def test_exited_child_is_dead_even_as_a_zombie() -> None:
    proc = subprocess.Popen(["true"])
    deadline = time.monotonic() + 5
    while not state._is_zombie(proc.pid) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert state._is_zombie(proc.pid)  # exited, not yet reaped
    assert not state.pid_alive(proc.pid)
    proc.returncode = 0  # reaped by pid_alive; keep Popen from waiting again


def test_stop_pid_terminates_then_kills(tmp_path: Path) -> None:
    polite = spawn_detached(["sleep", "300"], tmp_path / "a.out", tmp_path)
    assert state.pid_alive(polite, "sleep 300")
    assert state.stop_pid(polite, "sleep 300", timeout=5) == "stopped"
    assert not state.pid_alive(polite)

    stubborn = spawn_detached(
        ["sh", "-c", "trap '' TERM; exec sleep 301"], tmp_path / "b.out", tmp_path
    )
    deadline = time.monotonic() + 5
    while state._proc_cmdline(stubborn) != "sleep 301 " and time.monotonic() < deadline:
        time.sleep(0.02)  # until the trap is set and sleep is exec'd
    assert state.stop_pid(stubborn, "sleep 301", timeout=0.5) == "killed"
    assert not state.pid_alive(stubborn)
    assert state.stop_pid(stubborn, "sleep 301") == "not running"


def test_spawned_service_is_not_our_child(tmp_path: Path) -> None:
    pid = spawn_detached(["sleep", "302"], tmp_path / "c.out", tmp_path)
    try:
        with pytest.raises(ChildProcessError):
            os.waitpid(pid, os.WNOHANG)
        assert os.getsid(pid) != os.getsid(0)  # own session: a Ctrl-C in our terminal spares it
    finally:
        state.stop_pid(pid, timeout=5)


def test_pick_port_prefers_then_falls_back() -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        taken = busy.getsockname()[1]
        assert not state.port_is_free(taken)
        other = state.pick_port(0, preferred=taken)
        assert other != taken and state.port_is_free(other)
        with pytest.raises(RuntimeError, match="already in use"):
            state.pick_port(taken, preferred=0)
    free = state.free_port()
    assert state.pick_port(0, preferred=free) == free
    assert state.pick_port(free, preferred=1) == free
    assert state.pick_port(0, preferred=free, avoid=[free]) != free


def test_split_hostport() -> None:
    assert state.split_hostport("127.0.0.1:9092", 9092) == ("127.0.0.1", 9092)
    assert state.split_hostport("a:1,b:2", 9092) == ("a", 1)
    assert state.split_hostport("kafka", 9092) == ("kafka", 9092)
    assert state.split_hostport("redis://:pw@h:6380/0", 6379) == ("h", 6380)
    assert state.split_hostport("rediss://h/1", 6379) == ("h", 6379)
    assert state.split_hostport("[::1]:9093", 9092) == ("::1", 9093)


def test_env_file_is_eval_safe() -> None:
    values = {"LEAP_KAFKA_BOOTSTRAP": "127.0.0.1:9092", "LEAP_REDIS_URL": "redis://:p w'$x@h:1/0"}
    text = state.render_env({**values, "EMPTY": ""})
    assert "EMPTY" not in text
    assert state.parse_env(text) == values
    out = subprocess.run(
        ["sh", "-c", text + 'printf %s "$LEAP_REDIS_URL"'], capture_output=True, text=True
    )
    assert out.stdout == values["LEAP_REDIS_URL"]


def test_state_round_trip_and_corrupt_file(tmp_path: Path) -> None:
    paths = Paths(tmp_path)
    st = ServiceState("kafka", 123, "127.0.0.1:1", 1, "/l", "m", extra={"controller_port": 2})
    state.save_state(paths, st)
    assert state.load_state(paths, "kafka") == st
    assert state.read_pid(paths.pid_file("kafka")) == 123
    paths.state_file("kafka").write_text("{not json")
    assert state.load_state(paths, "kafka") is None
    state.clear_state(paths, "kafka")
    assert not paths.pid_file("kafka").exists()


def test_leases_of_dead_processes_are_dropped(tmp_path: Path) -> None:
    paths = Paths(tmp_path)
    state.acquire_lease(paths, "kafka")
    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True
    )
    state.acquire_lease(paths, "kafka", pid=int(dead.stdout))
    assert state.live_leases(paths, "kafka") == [os.getpid()]
    assert len(list(paths.leases.glob("kafka.*"))) == 1
    state.release_lease(paths, "kafka")
    assert state.live_leases(paths, "kafka") == []


def _fake_service(paths: Paths, tmp_path: Path, seconds: int, owner: str) -> int:
    """A `sleep` standing in for redis-server: ownership rules need no real service."""
    pid = spawn_detached(["sleep", str(seconds)], tmp_path / "fake.out", tmp_path)
    st = ServiceState("redis", pid, "redis://127.0.0.1:1/0", 1, "/l", f"sleep {seconds}", owner)
    state.save_state(paths, st)
    return pid


def test_auto_service_is_stopped_by_the_last_session_only(tmp_path: Path) -> None:
    from leap_stream.tools.dev import DevServices, stop_services

    paths = Paths(tmp_path)
    pid = _fake_service(paths, tmp_path, 303, state.OWNER_AUTO)
    other_session = spawn_detached(["sleep", "304"], tmp_path / "o.out", tmp_path)
    state.acquire_lease(paths, "redis")
    state.acquire_lease(paths, "redis", pid=other_session)
    mine = DevServices("", "redis://127.0.0.1:1/0", ["redis"], tmp_path, ["redis"])
    assert stop_services(mine)["redis"].startswith("left running")
    assert state.pid_alive(pid, "sleep 303")

    state.stop_pid(other_session, timeout=5)  # the other session ends without cleaning up
    state.acquire_lease(paths, "redis")
    theirs = DevServices("", "redis://127.0.0.1:1/0", [], tmp_path, ["redis"])
    assert stop_services(theirs) == {"redis": "stopped"}
    assert not state.pid_alive(pid) and state.load_state(paths, "redis") is None


def test_cli_owned_service_outlives_sessions_until_down(tmp_path: Path) -> None:
    from leap_stream.tools.dev import DevServices, stop_services

    paths = Paths(tmp_path)
    pid = _fake_service(paths, tmp_path, 305, state.OWNER_CLI)
    state.acquire_lease(paths, "redis")
    session = DevServices("", "redis://127.0.0.1:1/0", [], tmp_path, ["redis"])
    assert stop_services(session) == {}
    assert state.pid_alive(pid, "sleep 305")
    assert stop_services(home=tmp_path, names=["redis"]) == {"redis": "stopped"}  # `dev down`
    assert not state.pid_alive(pid)


def test_spawned_pid_is_the_command_not_its_shell(tmp_path: Path) -> None:
    pids = [
        spawn_detached(["sleep", f"{303 + i}"], tmp_path / "d.out", tmp_path) for i in range(10)
    ]
    try:
        seen = [state._proc_cmdline(pid) for pid in pids]
        assert seen == [f"sleep {303 + i} " for i in range(10)]
    finally:
        for pid in pids:
            state.stop_pid(pid, timeout=5)
