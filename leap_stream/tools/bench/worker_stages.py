"""The bench stages that run the real `leap-stream worker`: its backlog, a burst, the open-loop
load and the mixed load, and how their latencies are read."""

from __future__ import annotations

import math
import os
import signal
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import orjson

from leap_stream.stream.client import RankingsClient
from leap_stream.stream.kafka import KafkaClients, produce_waiting
from leap_stream.tools.bench.capacity import (
    WORKER_P99_MS,
    CapacityPlan,
    Cores,
    pinned,
    search,
)
from leap_stream.tools.bench.stats import due, percentile_ms, rate
from leap_stream.tools.bench.world import BenchWorld
from leap_stream.tools.harness import (
    WorkerProcess,
    free_port,
    wait_for,
    worker_env,
)

T = TypeVar("T")


# --- the real worker


@dataclass
class WorkerProc:
    """``count`` `leap-stream worker` processes in one group (the worker scales by process)."""

    world: BenchWorld
    topics: dict[str, str]
    count: int = 1
    # one process per role (LEAP_WORKER_ROLES) instead of both in each: count pairs
    split_roles: bool = False
    group: str = field(default_factory=lambda: f"bench-worker-{uuid.uuid4().hex[:8]}")
    procs: list[WorkerProcess] = field(default_factory=list)

    def env(self, i: int, roles: str | None = None) -> dict[str, str]:
        # tuning settings (LEAP_BATCH_*, LEAP_COMPILED_TREES, …) pass through; where the worker
        # reads and writes is the bench's own
        return worker_env(
            bootstrap=self.world.bootstrap,
            redis_url=self.world.redis_url,
            prefix=self.world.prefix,
            topics=self.topics,
            group=self.group,
            home=self.world.tmp / f"worker-home-{i}",
            dataset_dir=self.world.tmp / "dataset",
            registry_dir=self.world.registry_dir,
            metrics_port=free_port(),
            settings={
                "LEAP_REDIS_CLUSTER": "1" if self.world.settings.redis_cluster else "0",
                **({"LEAP_WORKER_ROLES": roles} if roles else {}),
            },
            inherit_leap=True,
        )

    def wait_compiled(self, timeout: float = 180.0) -> float:
        """Seconds until every worker serves compiled trees (`leap_model_compiled 1`)."""
        pending = list(self.procs)

        def all_compiled() -> bool:
            for w in list(pending):
                try:
                    if w.metric("leap_model_compiled") == 1.0:
                        pending.remove(w)
                except OSError:
                    pass
            return not pending

        def guard() -> None:
            if not self.alive():
                raise RuntimeError("a worker died:\n" + self.log_tail())

        try:
            return wait_for("compiled trees in every worker", all_compiled, timeout, guard=guard)
        except TimeoutError as exc:
            raise RuntimeError(f"{exc}:\n{self.log_tail()}") from None

    def start(self) -> None:
        if self.procs:
            return
        roles = ["submissions", "completions"] if self.split_roles else [None]
        for i in range(self.count):
            for role in roles:
                name = f"worker-{i}" + (f"-{role}" if role else "")
                w = WorkerProcess(
                    self.env(i, role), self.world.tmp / f"{name}.log", self.world.tmp, "warning"
                )
                w.start()
                self.procs.append(w)

    def alive(self) -> bool:
        return bool(self.procs) and all(w.alive() for w in self.procs)

    def cpu_s(self) -> float:
        """utime + stime of the worker processes so far (Linux /proc; 0 elsewhere)."""
        total = 0.0
        tick = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
        for w in self.procs:
            try:
                assert w.proc is not None
                fields = Path(f"/proc/{w.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
                total += (int(fields[11]) + int(fields[12])) / tick
            except (OSError, IndexError, ValueError):
                return 0.0
        return total

    def log_tail(self, n: int = 30) -> str:
        out = []
        for i, w in enumerate(self.procs):
            out += [f"--- worker {i}", w.log_tail(n)]
        return "\n".join(out)

    def stop(self) -> None:
        for w in self.procs:
            if w.alive() and w.proc is not None:
                w.proc.send_signal(signal.SIGTERM)
        for w in self.procs:
            w.stop()
        self.procs = []


def read_rankings(
    bootstrap: str, topic: str, n: int, alive: Callable[[], bool], timeout: float = 600
) -> Iterator[tuple[float, dict[str, Any]]]:
    """(receive time, ranking) until n rankings are read."""
    client = RankingsClient(KafkaClients(bootstrap), topic)
    got = 0
    end = time.monotonic() + timeout
    try:
        while got < n and time.monotonic() < end:
            arrivals = client.poll_stamped(timeout=0.2)
            for a in arrivals:
                got += 1
                yield a.arrived, a.ranking
            if not arrivals and not alive():
                raise RuntimeError("the worker died")
    finally:
        client.close()
    if got < n:
        raise RuntimeError(f"{topic}: {got} of {n} rankings within {timeout}s")


def worker_backlog(world: BenchWorld, worker: WorkerProc, n: int) -> dict[str, Any]:
    """The worker drains a backlog of n submissions; rate over its produced_at span."""
    from leap_stream.contracts import parse_ts

    t0 = time.monotonic()
    worker.start()
    stamps: list[float] = []
    t_first = 0.0
    cpu_first = 0.0
    sources: dict[str, int] = {}
    try:
        for _recv, r in read_rankings(world.bootstrap, worker.topics["rank"], n, worker.alive):
            if not stamps:
                t_first = time.monotonic()
                cpu_first = worker.cpu_s()
            stamps.append(parse_ts(r["produced_at"]))
            sources[r["source"]] = sources.get(r["source"], 0) + 1
    except RuntimeError as exc:
        raise RuntimeError(f"{exc}; worker log:\n{worker.log_tail()}") from None
    span = max(stamps) - min(stamps)
    cpu = worker.cpu_s() - cpu_first
    return {
        "events": n,
        "eps": rate(n - 1, span),
        "cpu_s": round(cpu, 2),
        "eps_per_cpu_s": rate(n - 1, cpu),
        "span_s": round(span, 3),
        "start_to_first_s": round(t_first - t0, 2),
        "wall_s": round(time.monotonic() - t0, 2),
        "sources": sources,
    }


def _load_submissions(world: BenchWorld, total: int, kind: str = "load") -> list[dict[str, Any]]:
    """``total`` submissions with fresh ids (``kind`` names the stage), cycling through the
    world's."""
    return [
        dict(
            world.submissions[i % len(world.submissions)],
            job_id=f"{kind}-{world.run_id}-{i}",
            event_id=f"sub-{kind}-{world.run_id}-{i}",
        )
        for i in range(total)
    ]


def burst(world: BenchWorld, worker: WorkerProc, n: int, first: int = 1000) -> dict[str, Any]:
    """``n`` submissions produced at once (a sweep) into the running worker: the time from the
    first send to the last ranking, and the latency of the ``first`` ones sent."""
    from leap_stream.contracts import format_ts

    subs = _load_submissions(world, n, kind="burst")
    reader = RankingsClient(
        KafkaClients(world.bootstrap),
        worker.topics["rank"],
        consumer_extra={"fetch.wait.max.ms": 5},
    )
    reader.start_at_end()
    p = KafkaClients(world.bootstrap).producer({"linger.ms": 5, "acks": "all"})
    sent: dict[str, float] = {}
    t_start = time.time()
    for s in subs:
        now = time.time()
        s["submitted_at"] = format_ts(now)
        sent[s["job_id"]] = now
        produce_waiting(p, worker.topics["sub"], s["job_id"].encode(), orjson.dumps(s))
    t_produced = time.time()
    if p.flush(120) != 0:
        raise RuntimeError("the burst could not be produced")
    arrived: dict[str, float] = {}
    end = time.monotonic() + 600
    while len(arrived) < n and time.monotonic() < end:
        for a in reader.poll_stamped(0.05, max_messages=5000):
            job = str(a.ranking["job_id"])
            if job in sent and job not in arrived:
                arrived[job] = a.arrived
        if not worker.alive():
            raise RuntimeError("the worker died in the burst:\n" + worker.log_tail())
    reader.close()
    firsts = [s["job_id"] for s in subs[:first]]
    lat_first = [arrived[j] - sent[j] for j in firsts if j in arrived]
    return {
        "events": n,
        "ranked": len(arrived),
        "produce_s": round(t_produced - t_start, 3),
        "clear_s": round(max(arrived.values()) - t_start, 3) if arrived else math.nan,
        "eps": rate(len(arrived), max(arrived.values()) - t_start) if arrived else 0.0,
        f"p50_ms_first_{first}": percentile_ms(lat_first, 50),
        f"p99_ms_first_{first}": percentile_ms(lat_first, 99),
    }


@dataclass
class _Sent:
    """When each job was produced (the load's clock), shared with the reader."""

    at: dict[str, float] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)
    errors: list[str] = field(default_factory=list)

    def get(self, job_id: str) -> float | None:
        with self.lock:
            return self.at.get(job_id)


def _produce_paced(
    bootstrap: str,
    topic: str,
    events: list[dict[str, Any]],
    per_s: float,
    sent: _Sent,
    stamp: bool = True,
) -> None:
    """Open loop: event i goes out at i / per_s. With ``stamp`` (submissions) it is dated and
    its send time recorded for the latency; completions go out as they are."""
    from leap_stream.contracts import format_ts

    p = KafkaClients(bootstrap).producer({"linger.ms": 1, "acks": "all"})
    t0 = time.perf_counter()
    i = 0
    while i < len(events):
        target = due(time.perf_counter() - t0, per_s, len(events))
        while i < target:
            e = events[i]
            if stamp:
                now = time.time()
                e["submitted_at"] = format_ts(now)
                with sent.lock:
                    sent.at[e["job_id"]] = now
            p.produce(topic, key=e["job_id"].encode(), value=orjson.dumps(e))
            i += 1
        p.poll(0)
        # sleep until event i is due (a fixed 0.5 ms nap was 2,000 wake-ups/s of the
        # bench's own CPU on the cores the worker needs)
        wait = i / per_s - (time.perf_counter() - t0)
        if wait > 0:
            time.sleep(wait)
    if p.flush(60) != 0:
        sent.errors.append(f"load producer could not flush {topic}")


def _in_thread(fn: Callable[[], None], errors: list[str]) -> threading.Thread:
    """``fn`` in a daemon thread; what it raises lands in ``errors`` (the figures show it)."""

    def run() -> None:
        try:
            fn()
        except Exception as exc:
            errors.append(repr(exc))

    th = threading.Thread(target=run, name="bench-load", daemon=True)
    th.start()
    return th


def _latency_figures(
    sent: _Sent, lat: list[float], sent_order: list[float], in_worker: list[float], wall: float
) -> dict[str, Any]:
    # p50 per second of sending: shows whether latency is flat or grows (a queue building up)
    t_base = min(sent_order) if sent_order else 0.0
    by_second: dict[int, list[float]] = {}
    for ts, la in zip(sent_order, lat, strict=True):
        by_second.setdefault(int(ts - t_base), []).append(la)
    return {
        "p50_ms_by_second": [round(percentile_ms(v, 50), 1) for _k, v in sorted(by_second.items())],
        "sent": len(sent.at),
        "ranked": len(lat),
        "achieved_per_s": round(rate(len(lat), wall), 1),
        "p50_ms": percentile_ms(lat, 50),
        "p90_ms": percentile_ms(lat, 90),
        "p99_ms": percentile_ms(lat, 99),
        "worker_stamp_p50_ms": percentile_ms(in_worker, 50),
        "worker_stamp_p99_ms": percentile_ms(in_worker, 99),
        "max_ms": percentile_ms(lat, 100),
        "errors": sent.errors,
    }


def offered_load(
    world: BenchWorld,
    worker: WorkerProc,
    per_s: float,
    seconds: float,
    mixed_run: int | None = None,
) -> dict[str, Any]:
    """Open-loop load at per_s for seconds; latency = ranking received − submission produced.

    ``mixed_run`` (a run number) adds the real traffic mix: beside the submissions, the
    completions of earlier jobs at the same rate, in the simulator's ended_at order: jobs the
    worker ranked (the backlog, then earlier runs' submissions) and that have not completed,
    so every one is applied (`PendingCompletions`). In steady state every job completes once,
    so completions arrive as fast as submissions; the simulator's hours between a job's
    submission and its completion do not fit a 20 s run, its order does."""
    kind = "load" if mixed_run is None else f"mixed{mixed_run}"
    subs = _load_submissions(world, int(per_s * seconds), kind=kind)
    comps = [] if mixed_run is None else world.pending.take(len(subs))
    # the reader starts at the end of the rankings topic, assigned before the first send
    reader = RankingsClient(
        KafkaClients(world.bootstrap),
        worker.topics["rank"],
        consumer_extra={"fetch.wait.max.ms": 5},
    )
    reader.start_at_end()
    sent = _Sent()
    t_start = time.perf_counter()
    th = _in_thread(
        lambda: _produce_paced(world.bootstrap, worker.topics["sub"], subs, per_s, sent),
        sent.errors,
    )
    th_comp = _in_thread(
        lambda: _produce_paced(
            world.bootstrap, worker.topics["comp"], comps, per_s, sent, stamp=False
        ),
        sent.errors,
    )
    lat: list[float] = []
    sent_order: list[float] = []
    in_worker: list[float] = []  # submitted_at → the worker's batch clock (ranking latency_ms)
    end = time.monotonic() + seconds + 60
    while len(lat) < len(subs) and time.monotonic() < end:
        arrivals = reader.poll_stamped(0.01)
        for a in arrivals:
            t_sent = sent.get(str(a.ranking["job_id"]))
            if t_sent is not None:
                lat.append(a.arrived - t_sent)
                sent_order.append(t_sent)
                in_worker.append(float(a.ranking.get("latency_ms", 0.0)) / 1000.0)
        if not arrivals and not worker.alive():
            raise RuntimeError("the worker died under load:\n" + worker.log_tail())
    th.join(30)
    th_comp.join(30)
    reader.close()
    world.pending.add_run(subs)  # ranked now: their completions may come in a later run
    figures = _latency_figures(sent, lat, sent_order, in_worker, time.perf_counter() - t_start)
    return {"offered_per_s": per_s, "seconds": seconds, "completions": len(comps), **figures}


def worker_capacity(
    world: BenchWorld, worker: WorkerProc, plan: CapacityPlan, cores: Cores, others: list[int]
) -> dict[str, Any]:
    """The highest mixed rate (submissions + the completions mixed in at the same rate, as
    many as the world has) at which the worker's p99 stays under `WORKER_P99_MS` in
    `plan.need` of `plan.runs` runs, bisected over the submission rate: the worker
    processes pinned to `cores.service`, `others` (the broker, Redis) and this process (the
    load generator) to `cores.rest`."""
    workers = [w.proc.pid for w in worker.procs if w.proc is not None]
    with pinned(workers, cores.service) as on_service, pinned([*others, os.getpid()], cores.rest):
        return {**_worker_capacity(world, worker, plan), "pinned": on_service}


def _worker_capacity(world: BenchWorld, worker: WorkerProc, plan: CapacityPlan) -> dict[str, Any]:
    mixed: dict[float, float] = {0.0: 0.0}  # submissions/s → submissions + completions per s
    runs_done = [0]

    def one_run(per_s: float) -> float:
        time.sleep(1.0)  # the previous run's tail drains
        runs_done[0] += 1
        d = offered_load(world, worker, per_s, plan.seconds, mixed_run=1000 + runs_done[0])
        mixed[per_s] = per_s + d["completions"] / plan.seconds
        return float(d["p99_ms"])

    found, tried = search(plan, WORKER_P99_MS, one_run)
    return {"capacity": mixed[found], "submissions_per_s": found, "p99_ms_by_rate": tried}
