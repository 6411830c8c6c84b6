"""Local state of the dev services under $LEAP_HOME: paths, pid files, ports, leases, env file.

Everything here is plain file and socket logic so the unit tests can drive it without a broker.
Pid files alone are not trusted (pids get reused): a pid counts as ours only while the process
is alive, not a zombie, and its command line carries the marker we started it with.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import signal
import socket
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import orjson

from leap_stream.settings import Settings
from leap_stream.store.files import write_atomic

OWNER_CLI = "cli"  # started by `leap-stream dev up`: only `dev down` stops it
OWNER_AUTO = "auto"  # started by ensure_services(lease=True): the last lease holder stops it


@dataclass(frozen=True)
class Paths:
    """Where each piece of local state lives (one place, so docs and code agree)."""

    home: Path

    @classmethod
    def from_env(cls, home: Path | str | None = None, cfg: Settings | None = None) -> Paths:
        """``home``, else LEAP_HOME of ``cfg`` (of the environment when not given)."""
        if home:
            return cls(Path(home).expanduser().resolve())
        return cls((cfg or Settings.from_env()).home)

    @property
    def logs(self) -> Path:
        return self.home / "logs"

    @property
    def run(self) -> Path:
        return self.home / "run"

    @property
    def leases(self) -> Path:
        return self.run / "leases"

    @property
    def lock_file(self) -> Path:
        return self.run / "dev.lock"

    @property
    def env_file(self) -> Path:
        return self.home / "dev.env"

    def kafka_dist(self, version: str) -> Path:
        return self.home / f"kafka-{version}"

    @property
    def kafka_dir(self) -> Path:
        return self.home / "kafka"

    @property
    def redis_dir(self) -> Path:
        return self.home / "redis"

    @property
    def redis_cluster_dir(self) -> Path:
        return self.home / "redis-cluster"

    def state_file(self, service: str) -> Path:
        return self.run / f"{service}.json"

    def pid_file(self, service: str) -> Path:
        return self.run / f"{service}.pid"

    def log_file(self, service: str) -> Path:
        return self.logs / f"{service}.log"

    def ensure(self) -> None:
        for d in (self.home, self.logs, self.run, self.leases):
            d.mkdir(parents=True, exist_ok=True)


@dataclass
class ServiceState:
    """What `up` recorded about a running service; `status` and `down` read it back."""

    name: str
    pid: int
    address: str  # bootstrap "host:port" or redis URL
    port: int
    log: str
    marker: str  # substring of /proc/<pid>/cmdline that proves the pid is still ours
    owner: str = OWNER_CLI
    started_at: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> bytes:
        return orjson.dumps(asdict(self), option=orjson.OPT_INDENT_2)

    @classmethod
    def from_json(cls, raw: bytes) -> ServiceState:
        data = orjson.loads(raw)
        return cls(**data)


def save_state(paths: Paths, state: ServiceState) -> None:
    paths.ensure()
    write_atomic(paths.state_file(state.name), state.to_json())
    write_pid(paths.pid_file(state.name), state.pid)


def load_state(paths: Paths, service: str) -> ServiceState | None:
    try:
        return ServiceState.from_json(paths.state_file(service).read_bytes())
    except (FileNotFoundError, orjson.JSONDecodeError, TypeError):
        return None


def clear_state(paths: Paths, service: str) -> None:
    for f in (paths.state_file(service), paths.pid_file(service)):
        f.unlink(missing_ok=True)


# --- pid files -------------------------------------------------------------------------------


def write_pid(path: Path, pid: int) -> None:
    write_atomic(path, f"{pid}\n".encode())


def read_pid(path: Path) -> int | None:
    """The pid in a pid file; None when missing or garbage (a garbage pid file is not an error)."""
    try:
        text = path.read_text().strip()
    except (FileNotFoundError, IsADirectoryError, PermissionError):
        return None
    if not text.isdigit() or int(text) <= 0:
        return None
    return int(text)


def _proc_cmdline(pid: int) -> str | None:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    return raw.replace(b"\0", b" ").decode(errors="replace")


def _is_zombie(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return False
    # "pid (comm) S ..." where comm may hold spaces or parentheses: the state follows the last ")"
    return stat.rsplit(")", 1)[-1].split()[:1] == ["Z"]


def pid_alive(pid: int | None, marker: str | None = None) -> bool:
    """True while `pid` runs, is not a zombie and (given a marker) is still the process we started."""
    if pid is None or pid <= 0:
        return False
    with contextlib.suppress(ChildProcessError, OSError):
        os.waitpid(pid, os.WNOHANG)  # reap it if it is our own dead child
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # alive, owned by someone else
    if _is_zombie(pid):
        return False
    if marker is not None and Path("/proc").is_dir():
        cmdline = _proc_cmdline(pid)
        if cmdline is None or marker not in cmdline:
            return False
    return True


def stop_pid(pid: int, marker: str | None = None, timeout: float = 20.0) -> str:
    """SIGTERM, wait up to `timeout`, then SIGKILL. Returns what happened, for `down` to print."""
    if not pid_alive(pid, marker):
        return "not running"
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return "not running"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not pid_alive(pid):
            return "stopped"
        time.sleep(0.1)
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 5.0
    while time.monotonic() < deadline and pid_alive(pid):
        time.sleep(0.05)
    return "killed"


# --- ports -----------------------------------------------------------------------------------


def port_is_free(port: int, host: str = "127.0.0.1") -> bool:
    """Whether a server could listen on host:port now (SO_REUSEADDR, as the JVM and Redis bind)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError as e:
            if e.errno in (errno.EADDRINUSE, errno.EACCES):
                return False
            raise
    return True


def free_port(host: str = "127.0.0.1", avoid: Sequence[int] = ()) -> int:
    """A port the kernel considers free right now (there is a small race until the server binds)."""
    for _ in range(50):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind((host, 0))
            port: int = s.getsockname()[1]
        if port not in avoid:
            return port
    raise RuntimeError("no free TCP port found")


def pick_port(
    requested: int, preferred: int, host: str = "127.0.0.1", avoid: Sequence[int] = ()
) -> int:
    """Port choice for a service: an explicit port must be free; 0 means `preferred` if free, else any."""
    if requested:
        if not port_is_free(requested, host):
            raise RuntimeError(f"port {requested} on {host} is already in use")
        return requested
    if preferred and preferred not in avoid and port_is_free(preferred, host):
        return preferred
    return free_port(host, avoid)


def tcp_reachable(host: str, port: int, timeout: float = 1.0) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def split_hostport(address: str, default_port: int) -> tuple[str, int]:
    """First 'host:port' of a bootstrap list (or of a redis URL's netloc)."""
    first = address.split(",")[0].strip()
    if "://" in first:
        first = first.split("://", 1)[1]
    first = first.split("/", 1)[0].rsplit("@", 1)[-1]
    if first.startswith("["):  # [ipv6]:port
        host, _, rest = first[1:].partition("]")
        return host, int(rest.lstrip(":") or default_port)
    host, _, port = first.partition(":")
    return host or "127.0.0.1", int(port or default_port)


# --- locking and leases ----------------------------------------------------------------------


@contextlib.contextmanager
def locked(paths: Paths) -> Iterator[None]:
    """Serialise up/down across processes: several engineers and test sessions share $LEAP_HOME."""
    paths.ensure()
    with paths.lock_file.open("a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def acquire_lease(paths: Paths, service: str, pid: int | None = None) -> Path:
    """Record that process `pid` uses `service`, so another session does not stop it underneath."""
    paths.ensure()
    pid = pid or os.getpid()
    lease = paths.leases / f"{service}.{pid}"
    write_pid(lease, pid)
    return lease


def release_lease(paths: Paths, service: str, pid: int | None = None) -> None:
    (paths.leases / f"{service}.{pid or os.getpid()}").unlink(missing_ok=True)


def live_leases(paths: Paths, service: str) -> list[int]:
    """Pids holding a lease on `service`; leases of dead processes are removed on the way."""
    pids: list[int] = []
    if not paths.leases.is_dir():
        return pids
    for lease in sorted(paths.leases.glob(f"{service}.*")):
        pid = read_pid(lease)
        if pid_alive(pid):
            pids.append(pid)  # type: ignore[arg-type]
        else:
            lease.unlink(missing_ok=True)
    return pids


# --- env file --------------------------------------------------------------------------------


def render_env(values: dict[str, str]) -> str:
    """Shell exports, quoted so `eval "$(leap-stream dev up --env)"` is safe."""
    import shlex

    return "".join(f"export {k}={shlex.quote(v)}\n" for k, v in values.items() if v)


def parse_env(text: str) -> dict[str, str]:
    import shlex

    out: dict[str, str] = {}
    for line in text.splitlines():
        line = line.strip()
        if line.startswith("export "):
            key, _, value = line[len("export ") :].partition("=")
            parts = shlex.split(value)
            out[key] = parts[0] if parts else ""
    return out
