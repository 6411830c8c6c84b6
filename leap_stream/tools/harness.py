"""Running the real worker from outside: one harness for the tests, the demo and the bench.

`worker_env` says where one worker reads and writes (its topics, group, key prefix, folders and
metrics port) as ``LEAP_*`` variables; `WorkerProcess` runs ``python -m leap_stream worker``
with them and reads its log and its ``/metrics``; `WorkerStack` is one worker's whole world for
a test (it can be stopped and started again on the same state). `wait_for` and `free_port` are
the polling and port helpers they all use (`free_port` is the dev tooling's).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Container, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from prometheus_client.parser import text_string_to_metric_families

from leap_stream.core.history import HistoryBook
from leap_stream.tools.dev.state import free_port

if TYPE_CHECKING:
    from leap_stream.store.online import OnlineStore

Samples = dict[str, list[tuple[dict[str, str], float, str]]]


def wait_for(
    what: str,
    cond: Callable[[], bool],
    timeout: float,
    every: float = 0.2,
    guard: Callable[[], None] | None = None,
) -> float:
    """Seconds until ``cond()`` held; TimeoutError after ``timeout``; ``guard`` may raise to stop
    waiting early (a worker that died)."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        if guard is not None:
            guard()
        if cond():
            return time.monotonic() - t0
        time.sleep(every)
    raise TimeoutError(f"timed out after {timeout:.0f} s waiting for {what}")


def worker_topics(make: Callable[..., str], hint: str = "") -> dict[str, str]:
    """A worker's four topics from ``make(hint, partitions=n)`` (a test's topic factory).

    The completions get one partition: they are then applied in exactly the order produced,
    so the order-dependent aggregates can be compared bit for bit with a replay."""
    return {
        "sub": make(f"{hint}sub", partitions=4),
        "comp": make(f"{hint}comp", partitions=1),
        "rank": make(f"{hint}rank", partitions=4),
        "dlq": make(f"{hint}dlq", partitions=2),
    }


def worker_env(
    *,
    bootstrap: str,
    redis_url: str,
    prefix: str,
    topics: Mapping[str, str],
    group: str,
    home: Path,
    dataset_dir: Path,
    registry_dir: Path,
    metrics_port: int,
    settings: Mapping[str, str] | None = None,
    inherit_leap: bool = False,
) -> dict[str, str]:
    """The environment of one worker. ``topics`` has the keys sub, comp, rank and dlq;
    ``settings``: more LEAP_* values, by variable name; ``inherit_leap``: keep this process's
    other LEAP_* settings (the bench's tuning knobs)."""
    env = {k: v for k, v in os.environ.items() if inherit_leap or not k.startswith("LEAP_")}
    env.update(
        LEAP_KAFKA_BOOTSTRAP=bootstrap,
        LEAP_REDIS_URL=redis_url,
        LEAP_REDIS_PREFIX=prefix,
        LEAP_TOPIC_SUBMISSIONS=topics["sub"],
        LEAP_TOPIC_COMPLETIONS=topics["comp"],
        LEAP_TOPIC_RANKINGS=topics["rank"],
        LEAP_TOPIC_DEAD_LETTER=topics["dlq"],
        LEAP_CONSUMER_GROUP=group,
        LEAP_HOME=str(home),
        LEAP_DATASET_DIR=str(dataset_dir),
        LEAP_REGISTRY_DIR=str(registry_dir),
        LEAP_METRICS_PORT=str(metrics_port),
        # these workers replay the simulator's history, dated by its calendar and not by this
        # clock: only the fixed time range applies (tests of the window set their own)
        LEAP_EVENT_MAX_AGE_S="0",
        LEAP_EVENT_MAX_LEAD_S="0",
    )
    env.update(settings or {})
    return env


def serve_ready(serve: WorkerProcess, base: str) -> Callable[[], bool]:
    """A `wait_for` condition: ``leap-stream serve`` at ``base`` answers /readyz with 200
    (raises when the process has exited, with its log)."""
    import httpx

    def ready() -> bool:
        if not serve.alive():
            raise RuntimeError("leap-stream serve exited:\n" + serve.log_tail())
        try:
            return httpx.get(base + "/readyz", timeout=1.0).status_code == 200
        except httpx.HTTPError:
            return False

    return ready


@dataclass
class WorkerProcess:
    """One ``leap-stream worker`` subprocess (or another command, e.g. ``serve``), its log file
    and its metrics endpoint."""

    env: dict[str, str]
    log_path: Path
    cwd: Path | None = None
    loglevel: str = "info"
    proc: subprocess.Popen[bytes] | None = None
    killed: bool = False
    command: tuple[str, ...] = ("worker",)

    @property
    def metrics_port(self) -> int:
        return int(self.env["LEAP_METRICS_PORT"])

    def start(self) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "leap_stream", *self.command, *self._loglevel_args()],
            env=self.env,
            cwd=self.cwd,
            stdout=open(self.log_path, "wb"),  # noqa: SIM115 - closed with the process
            stderr=subprocess.STDOUT,
        )

    def _loglevel_args(self) -> list[str]:
        return ["-l", self.loglevel] if self.command[0] == "worker" else []

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def blocked_signals(self) -> set[signal.Signals]:
        """The signals the process holds blocked now, from Linux's /proc (empty once it ended):
        what lets a test send a signal after the worker has started holding it."""
        if self.proc is None:
            return set()
        try:
            status = Path(f"/proc/{self.proc.pid}/status").read_text()
        except (FileNotFoundError, ProcessLookupError):
            return set()
        mask = next(
            int(line.split()[1], 16) for line in status.splitlines() if line[:7] == "SigBlk:"
        )
        return {s for s in signal.Signals if mask >> (s.value - 1) & 1}

    def log_tail(self, n: int = 60) -> str:
        if not self.log_path.exists():
            return ""
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 60.0) -> int | None:
        """Send ``sig`` and wait; a worker that does not stop in ``timeout`` is killed (and
        ``killed`` set). The exit status; None when it never started."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.killed = True
                self.proc.kill()
                self.proc.wait(10)
        return self.proc.returncode

    def metrics_text(self) -> str:
        url = f"http://127.0.0.1:{self.metrics_port}/metrics"
        return str(urllib.request.urlopen(url, timeout=5).read().decode())

    def probe(self, path: str) -> tuple[int, dict[str, Any]]:
        """Status and JSON body of /healthz or /readyz on the metrics port."""
        import urllib.error

        url = f"http://127.0.0.1:{self.metrics_port}{path}"
        try:
            with urllib.request.urlopen(url, timeout=5) as resp:
                return resp.status, json.loads(resp.read())
        except urllib.error.HTTPError as err:
            return err.code, json.loads(err.read())

    def samples(self) -> Samples:
        """Every sample by family name: (labels, value, sample name)."""
        out: Samples = {}
        for fam in text_string_to_metric_families(self.metrics_text()):
            for s in fam.samples:
                out.setdefault(fam.name, []).append((dict(s.labels), s.value, s.name))
        return out

    def metric(self, name: str, **labels: str) -> float:
        """Sum of the samples of one metric (counters: the ``_total`` sample) with these labels."""
        total = 0.0
        for fam in text_string_to_metric_families(self.metrics_text()):
            for s in fam.samples:
                if s.name in (name, name + "_total") and all(
                    s.labels.get(k) == v for k, v in labels.items()
                ):
                    total += s.value
        return total

    def metric_labels(self, name: str) -> list[dict[str, str]]:
        return [
            dict(s.labels)
            for fam in text_string_to_metric_families(self.metrics_text())
            for s in fam.samples
            if s.name == name
        ]


@dataclass
class WorkerStack:
    """One worker's world in a test: topics (sub, comp, rank, dlq), group, key prefix and
    folders under ``tmp``; ``start`` runs a worker on it (again after a stop, on the same state).

    Its workers serve with LightGBM's own trees (``LEAP_COMPILED_TREES=0``): compiling them is a
    few CPU-seconds per model load that no test of the stream needs; tests of the compiled trees
    set ``extra_env["LEAP_COMPILED_TREES"]`` themselves."""

    bootstrap: str
    redis_url: str
    prefix: str
    tmp: Path
    topics: dict[str, str]
    group: str
    extra_env: dict[str, str] = field(default_factory=dict)
    metrics_port: int = field(default_factory=free_port)
    worker: WorkerProcess | None = None
    starts: int = 0

    @property
    def env(self) -> dict[str, str]:
        return worker_env(
            bootstrap=self.bootstrap,
            redis_url=self.redis_url,
            prefix=self.prefix,
            topics=self.topics,
            group=self.group,
            home=self.tmp / "home",
            dataset_dir=self.tmp / "dataset",
            registry_dir=self.tmp / "registry",
            metrics_port=self.metrics_port,
            settings={"LEAP_COMPILED_TREES": "0", **self.extra_env},
        )

    @property
    def proc(self) -> subprocess.Popen[bytes] | None:
        return self.worker.proc if self.worker is not None else None

    def online_store(self) -> OnlineStore:
        """A client of the online store this world's worker writes (a Redis Cluster when
        ``extra_env`` says LEAP_REDIS_CLUSTER=1); the caller closes ``.r``."""
        from leap_stream.store.connection import connect
        from leap_stream.store.online import OnlineStore

        cluster = self.extra_env.get("LEAP_REDIS_CLUSTER") == "1"
        return OnlineStore(connect(self.redis_url, cluster=cluster), prefix=self.prefix)

    @property
    def log_path(self) -> Path | None:
        return self.worker.log_path if self.worker is not None else None

    def start(self, name: str | None = None) -> None:
        self.starts += 1
        log = self.tmp / f"{name or f'worker-{self.starts}'}.log"
        self.worker = WorkerProcess(self.env, log, cwd=self.tmp)
        self.worker.start()

    def alive(self) -> bool:
        return self.worker is not None and self.worker.alive()

    def blocked_signals(self) -> set[signal.Signals]:
        return self._started().blocked_signals()

    def log_tail(self, n: int = 60) -> str:
        return self.worker.log_tail(n) if self.worker is not None else ""

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 60.0) -> int:
        assert self.worker is not None and self.worker.proc is not None, "no worker started"
        code = self.worker.stop(sig, timeout)
        if self.worker.killed:
            raise AssertionError("worker did not stop:\n" + self.log_tail())
        assert code is not None
        return code

    def _started(self) -> WorkerProcess:
        assert self.worker is not None, "no worker started"
        return self.worker

    def metrics_text(self) -> str:
        return self._started().metrics_text()

    def probe(self, path: str) -> tuple[int, dict[str, Any]]:
        return self._started().probe(path)

    def metrics(self) -> Samples:
        return self._started().samples()

    def metric(self, name: str, **labels: str) -> float:
        return self._started().metric(name, **labels)

    def metric_labels(self, name: str) -> list[dict[str, str]]:
        return self._started().metric_labels(name)


__all__ = ["WorkerProcess", "WorkerStack", "free_port", "wait_for", "worker_env", "worker_topics"]


def aggregate_differences(
    got: Mapping[str, Mapping[str, Any]],
    want: Mapping[str, Mapping[str, Any]],
    skip: Container[str] = (),
) -> dict[str, Any]:
    """Model types whose stored aggregates are not those of a replay by what they count: the
    types measured, the count, the last ``last_at`` (a completion lost or applied twice shows
    there). Not the EWMA: a completion that waited for its submission is applied after later
    ones, and an EWMA weighs by order (with two values, 0.8 against 0.2). ``skip``: model types
    of lineages the guard decided on (`HistoryBook.disputed_types`), order-dependent too."""
    differ: dict[str, Any] = {}
    for mt in (set(got) | set(want)) - {m for m in set(got) | set(want) if m in skip}:
        g, w = got.get(mt) or {}, want.get(mt) or {}
        same = set(g) == set(w) and all(
            (g[h].count, g[h].last_at) == (w[h].count, w[h].last_at) for h in g
        )
        if not same:
            differ[mt] = (g, w)
    return differ


def dispute_worker_holds(book: HistoryBook, dataset: Any) -> None:
    """Count as disputed (`HistoryBook.disputed`, `disputed_types`) the lineages and model types
    of the dataset rows the worker quarantined: a value the worker held that a topic-order
    replay took makes the state depend on arrival order too (`lineage_differences`)."""
    held = dataset.loc[dataset["quarantine"].notna(), ["lineage_id", "model_type"]]
    book.disputed.update(held["lineage_id"].astype(str))
    book.disputed_types.update(held["model_type"].astype(str))


def lineage_differences(
    got: Sequence[Mapping[str, Any]], book: HistoryBook, lineage_ids: Sequence[str]
) -> tuple[list[tuple[str, Any, Any]], int]:
    """Lineages whose stored history is not a replay's, and how many were not compared.

    Honest measurements give the same history in any order (the newest few by ``ended_at``),
    so those must match exactly. A lineage where the replay quarantined or corroborated a
    value is left out: whether a value near the guard's limit is held back depends on what came
    before it, and a completion that waited for its submission is applied later online than
    in the topic-order replay."""
    differ = []
    for lid, stored in zip(lineage_ids, got, strict=True):
        if lid not in book.disputed and stored != book.lineage(lid):
            differ.append((lid, stored, book.lineage(lid)))
    return differ, sum(lid in book.disputed for lid in lineage_ids)
