"""Local Kafka and Redis for development, tests, the bench and the demo (`leap-stream dev`).

`ensure_services()` is the one entry point: it reuses what is configured (LEAP_KAFKA_BOOTSTRAP,
LEAP_REDIS_URL) or already running under $LEAP_HOME, and starts only what is missing. A Redis
Cluster (three masters, `redis_cluster`) is a service of its own, started only when asked
for; while it runs, the exports point LEAP_REDIS_URL at it with LEAP_REDIS_CLUSTER=1.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from leap_stream.settings import Settings
from leap_stream.store.files import write_atomic
from leap_stream.tools.dev import kafka, redis, redis_cluster, state
from leap_stream.tools.dev.state import OWNER_AUTO, OWNER_CLI, Paths, ServiceState

log = logging.getLogger("leap_stream.tools.dev")

SERVICES = ("kafka", "redis", "redis-cluster")
_ENV = {
    "kafka": "LEAP_KAFKA_BOOTSTRAP",
    "redis": "LEAP_REDIS_URL",
    "redis-cluster": "LEAP_REDIS_URL",
}


def _configured(cfg: Settings, name: str) -> str:
    if name == "kafka":
        return cfg.kafka_bootstrap
    # LEAP_REDIS_URL names a cluster exactly when LEAP_REDIS_CLUSTER says so
    return cfg.redis_url if cfg.redis_cluster == (name == "redis-cluster") else ""


_MODULES: dict[str, Any] = {"kafka": kafka, "redis": redis, "redis-cluster": redis_cluster}


@dataclass
class DevServices:
    """Addresses to use, and which services this call started (the only ones it may stop)."""

    kafka_bootstrap: str
    redis_url: str
    started: list[str] = field(default_factory=list)
    home: Path | None = None
    leased: list[str] = field(default_factory=list)
    redis_cluster_url: str = ""

    def env(self) -> dict[str, str]:
        if self.redis_cluster_url:
            return _cluster_env(self.kafka_bootstrap, self.redis_cluster_url)
        return {"LEAP_KAFKA_BOOTSTRAP": self.kafka_bootstrap, "LEAP_REDIS_URL": self.redis_url}


def _cluster_env(kafka_bootstrap: str, url: str) -> dict[str, str]:
    return {
        "LEAP_KAFKA_BOOTSTRAP": kafka_bootstrap,
        "LEAP_REDIS_URL": url,
        "LEAP_REDIS_CLUSTER": "1",
    }


def _running(paths: Paths, name: str) -> ServiceState | None:
    st = state.load_state(paths, name)
    if st is not None and state.pid_alive(st.pid, st.marker):
        return st
    return None


def _ensure_one(paths: Paths, name: str, owner: str, cfg: Settings) -> tuple[str, bool]:
    """(address, started_now) for one service."""
    module = _MODULES[name]
    configured = _configured(cfg, name)
    recorded = state.load_state(paths, name)
    if configured:
        if module.is_ready(configured, timeout=3.0, cfg=cfg):
            return configured, False
        # an export left over from an earlier `dev up` of ours: start it again; anything else is
        # somebody's real service that is down, which we must not paper over with a local one
        if recorded is None or recorded.address != configured:
            raise RuntimeError(
                f"{_ENV[name]}={configured} is set but does not answer; fix it or unset it "
                f"to let `leap-stream dev up` start a local {name}"
            )
    running = _running(paths, name)
    if running is not None:
        module.wait_ready(running, cfg.dev_ready_timeout_s)
        if owner == OWNER_CLI and running.owner != OWNER_CLI:
            running.owner = OWNER_CLI  # asked for explicitly: now only `dev down` stops it
            state.save_state(paths, running)
        return running.address, False
    st = module.start(paths, log, owner, recorded, cfg)
    return st.address, True


def ensure_services(
    kafka: bool = True,
    redis: bool = True,
    *,
    redis_cluster: bool = False,
    home: Path | str | None = None,
    lease: bool = False,
    owner: str | None = None,
    cfg: Settings | None = None,
) -> DevServices:
    """Make Kafka and/or Redis answer and return their addresses.

    With `lease=True` (test sessions, bench, demo) services this call starts are owned "auto" and
    the last lease holder's `stop_services` stops them, so concurrent sessions sharing $LEAP_HOME
    never pull a broker from under each other.
    """
    cfg = cfg or Settings.from_env()
    paths = Paths.from_env(home, cfg)
    owner = owner or (OWNER_AUTO if lease else OWNER_CLI)
    asked = (("kafka", kafka), ("redis", redis), ("redis-cluster", redis_cluster))
    wanted = [n for n, on in asked if on]
    addresses = dict.fromkeys(SERVICES, "")
    started: list[str] = []
    leased: list[str] = []
    with state.locked(paths):
        for name in wanted:
            addresses[name], now = _ensure_one(paths, name, owner, cfg)
            if now:
                started.append(name)
            if lease and _running(paths, name) is not None:
                state.acquire_lease(paths, name)
                leased.append(name)
        _write_env_file(paths, cfg)
    return DevServices(
        addresses["kafka"],
        addresses["redis"],
        started,
        paths.home,
        leased,
        redis_cluster_url=addresses["redis-cluster"],
    )


def _write_env_file(paths: Paths, cfg: Settings) -> None:
    def address(name: str) -> str:
        st = _running(paths, name)
        return st.address if st else _configured(cfg, name)

    if cluster := address("redis-cluster"):
        values = _cluster_env(address("kafka"), cluster)
    else:
        values = {_ENV[name]: address(name) for name in ("kafka", "redis")}
    write_atomic(paths.env_file, state.render_env(values).encode())


def stop_services(
    services: DevServices | None = None,
    *,
    names: tuple[str, ...] | list[str] | None = None,
    home: Path | str | None = None,
    timeout: float = 20.0,
    cfg: Settings | None = None,
) -> dict[str, str]:
    """Stop what was started here. Returns service -> what happened.

    Given `services` (from ensure_services): release its leases and stop what it started or what
    was "auto"-owned, unless another live session still holds a lease. Without `services`
    (`dev down`): stop every service recorded under $LEAP_HOME (or only `names`).
    """
    cfg = cfg or Settings.from_env()
    paths = Paths.from_env(home if home is not None else (services.home if services else None), cfg)
    result: dict[str, str] = {}
    with state.locked(paths):
        if services is None:
            targets = list(names or SERVICES)
        else:
            for name in services.leased:
                state.release_lease(paths, name)
            targets = []
            for name in dict.fromkeys([*services.started, *services.leased]):
                st = state.load_state(paths, name)
                if st is None:
                    continue
                if holders := state.live_leases(paths, name):
                    result[name] = f"left running ({len(holders)} other session(s) use it)"
                elif st.owner == OWNER_AUTO or (
                    name in services.started and name not in services.leased
                ):
                    targets.append(name)
        for name in targets:
            st = state.load_state(paths, name)
            if st is None:
                result.setdefault(name, "not running")
                continue
            members = st.extra.get("members") or [[st.pid, st.marker]]
            stopped = [state.stop_pid(pid, marker, timeout=timeout) for pid, marker in members]
            result[name] = ", ".join(dict.fromkeys(stopped))
            state.clear_state(paths, name)
        _write_env_file(paths, cfg)
    return result


def status(
    home: Path | str | None = None, cfg: Settings | None = None
) -> dict[str, dict[str, Any]]:
    """What runs under $LEAP_HOME, for `dev status` (also reports stale pid files)."""
    cfg = cfg or Settings.from_env()
    paths = Paths.from_env(home, cfg)
    out: dict[str, dict[str, Any]] = {}
    for name in SERVICES:
        st = state.load_state(paths, name)
        if st is None:
            out[name] = {"running": False, "log": str(paths.log_file(name))}
            continue
        alive = state.pid_alive(st.pid, st.marker)
        ready = alive and _MODULES[name].is_ready(st.address, timeout=2.0, cfg=cfg)
        out[name] = {
            "running": alive,
            "ready": ready,
            "pid": st.pid,
            "address": st.address,
            "owner": st.owner,
            "log": st.log,
            "leases": state.live_leases(paths, name),
            **{k: v for k, v in st.extra.items() if k != "port"},
        }
        if not alive:
            out[name]["stale_pid_file"] = str(paths.pid_file(name))
    out["home"] = {"path": str(paths.home), "env_file": str(paths.env_file)}
    return out


def with_local_services(cfg: Settings) -> Settings:
    """``cfg`` with an empty broker or Redis address filled in from the services `leap-stream dev
    up` runs under its LEAP_HOME (the CLI does this once, before a command runs)."""
    if cfg.kafka_bootstrap and cfg.redis_url:
        return cfg
    try:
        paths = Paths.from_env(None, cfg)
        found = {name: st.address for name in SERVICES if (st := _running(paths, name))}
    except OSError:  # unreadable state: as if nothing ran
        return cfg
    redis_service = "redis-cluster" if cfg.redis_cluster else "redis"
    return cfg.replace(
        kafka_bootstrap=cfg.kafka_bootstrap or found.get("kafka", ""),
        redis_url=cfg.redis_url or found.get(redis_service, ""),
    )


__all__ = ["DevServices", "ensure_services", "status", "stop_services", "with_local_services"]
