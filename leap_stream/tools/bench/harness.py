"""The bench's world and its stages: one broker, one Redis, own topics, run one after another.

Every stage reads the same pre-loaded backlog of submissions (N events, 20 candidates each) from
its own input topic and writes to its own output topic, so no stage's work leaks into the next:

* passthrough: batched ``consume(num_messages=…)`` → produce → flush, no work (the ceiling);
* pipeline: the same loop with `SubmissionProcessor.process` in the middle, the function the
  worker's submissions loop runs (decode, one Redis round trip, features, one model call, rank);
* worker: the real `leap-stream worker` as a subprocess on its own backlog;
* naive: per event decode, a Redis round trip, one predict call per candidate row, produce;
* load: 1,000 submissions/s, open loop, through the running worker, latency at a consumer.
"""

from __future__ import annotations

import functools
import gc
import math
import os
import shutil
import signal
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import orjson
import pandas as pd

from leap_stream.contracts import TimeWindow
from leap_stream.settings import Settings
from leap_stream.store.connection import connect
from leap_stream.store.online import OnlineStore
from leap_stream.stream.client import RankingsClient
from leap_stream.stream.kafka import KafkaClients, produce_waiting
from leap_stream.tools.bench.stats import due, percentile_ms, rate, widen_candidates
from leap_stream.tools.harness import (
    WorkerProcess,
    free_port,
    serve_ready,
    wait_for,
    worker_env,
)

SUBMISSION_SCHEMA = "job-submitted"


T = TypeVar("T")


def log(msg: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


@dataclass
class BenchWorld:
    bootstrap: str
    redis_url: str
    prefix: str
    tmp: Path
    registry_dir: Path
    model_dir: Path
    submissions: list[dict[str, Any]]
    lines: list[bytes]
    types: tuple[str, ...]
    candidates: int
    settings: Settings
    # the completion of each submission (same index), in the simulator's ended_at order; only
    # those that ran on one of the submission's (widened) candidates
    completions: list[dict[str, Any]] = field(default_factory=list)
    topics: list[str] = field(default_factory=list)
    run_id: str = field(default_factory=lambda: uuid.uuid4().hex[:8])

    def store(self) -> OnlineStore:
        """The bench's online store (a Redis Cluster when LEAP_REDIS_CLUSTER=1)."""

        client = connect(self.redis_url, cluster=self.settings.redis_cluster)
        return OnlineStore(client, prefix=self.prefix)

    def topic(self, hint: str, partitions: int = 4) -> str:
        from leap_stream.tools.dev.topics import create_topics

        name = f"bench.{hint}.{self.run_id}"
        create_topics(self.bootstrap, [name], partitions=partitions)
        self.topics.append(name)
        return name

    def close(self) -> None:
        from leap_stream.tools.dev.topics import delete_topics

        try:
            if self.topics:
                delete_topics(self.bootstrap, self.topics)
        finally:
            r = self.store().r
            keys = list(r.scan_iter(match=f"{self.prefix}*", count=2000))
            for i in range(0, len(keys), 1000):
                r.delete(*keys[i : i + 1000])
            r.close()
            shutil.rmtree(self.tmp, ignore_errors=True)


def build_world(
    bootstrap: str,
    redis_url: str,
    events: int,
    candidates: int,
    settings: Settings,
    seed: int = 11,
) -> BenchWorld:
    """Simulated fleet: day 1 trains the model and seeds the Redis history, day 2 is the input."""
    from leap_stream.catalog import load_catalog
    from leap_stream.core.lookup import LookupTable
    from leap_stream.store.artefact import write_model
    from leap_stream.store.registry import Registry
    from leap_stream.tools.sim.events import completion_events, submission_events
    from leap_stream.tools.sim.fleet import SimConfig, simulate
    from leap_stream.train.trainer import fit, training_rows

    tmp = Path(tempfile.mkdtemp(prefix="leap-bench-"))
    types = load_catalog().types
    t0 = time.perf_counter()
    sim = simulate(SimConfig(seed=seed, days=2, rate=max(5000, min(events, 40_000))))
    first_day = sim.submissions["submitted_at"].min().normalize() + pd.Timedelta(days=1)
    past = sim.dataset[sim.dataset["submitted_at"] < first_day]
    day2 = sim.submissions[sim.submissions["submitted_at"] >= first_day]
    model = fit(training_rows(past), num_rounds=80)
    built = write_model(tmp / "build", model, LookupTable.fit(past))
    registry = Registry(tmp / "registry")
    registry.promote(registry.publish(built))
    log(f"fleet simulated and model {model.version} trained in {time.perf_counter() - t0:.1f}s")

    prefix = f"bench:{uuid.uuid4().hex[:8]}:"
    store = OnlineStore(connect(redis_url, cluster=settings.redis_cluster), prefix=prefix)
    past_comp = sim.completions[sim.completions["ended_at"] < first_day]  # known before day 2
    comps = completion_events(past_comp.sort_values("ended_at"))
    for i in range(0, len(comps), 2000):
        store.apply_completions(comps[i : i + 2000])
    base = submission_events(day2)
    subs: list[dict[str, Any]] = []
    i = 0
    while len(subs) < events:
        s: dict[str, Any] = dict(base[i % len(base)])
        rnd = i // len(base)
        if rnd:
            s.update(job_id=f"{s['job_id']}-r{rnd}", event_id=f"{s['event_id']}-r{rnd}")
        subs.append(widen_candidates(s, types, candidates, salt=i))
        i += 1
    lines = [orjson.dumps(s) for s in subs]
    later = completion_events(
        sim.completions[sim.completions["ended_at"] >= first_day].sort_values("ended_at")
    )
    completions = _completions_of(subs, later, len(base))
    head = subs[:5000]
    types_of_head = [s["model"]["model_type"] for s in head]
    with_prior = sum(
        bool(h) for h in store.read_batch([s["lineage_id"] for s in head], [], types_of_head)[0]
    )
    log(
        f"{len(subs)} submissions x {candidates} candidates over {len(types)} types; "
        f"{len(comps)} completions seed the history ({with_prior / min(5000, len(subs)):.0%} "
        "of jobs have a prior)"
    )
    return BenchWorld(
        bootstrap=bootstrap,
        redis_url=redis_url,
        prefix=prefix,
        tmp=tmp,
        registry_dir=tmp / "registry",
        model_dir=registry.current_dir() or built,
        submissions=subs,
        lines=lines,
        types=types,
        candidates=candidates,
        settings=settings,
        completions=completions,
    )


def _completions_of(
    subs: list[dict[str, Any]], later: list[dict[str, Any]], n_base: int
) -> list[dict[str, Any]]:
    """The completions of ``subs`` (repeats of the day's ``n_base`` jobs carry ``-rN`` ids) in
    the simulator's ended_at order: each job's simulated completion, renamed like its
    submission, kept when the type it ran on is among the submission's candidates."""
    index = {(s["job_id"], s["attempt"]): s for s in subs}
    out = []
    for rnd in range((len(subs) + n_base - 1) // n_base):
        suffix = f"-r{rnd}" if rnd else ""
        for c in later:
            s = index.get((c["job_id"] + suffix, c["attempt"]))
            if s is None or c["hardware_type"] not in s["candidate_hardware"]:
                continue
            out.append(dict(c, job_id=s["job_id"], event_id=f"{c['event_id']}{suffix}"))
    return out


# --- Kafka plumbing


def load_topic(bootstrap: str, topic: str, subs: list[dict[str, Any]], lines: list[bytes]) -> None:
    p = KafkaClients(bootstrap).producer(
        {"linger.ms": 20, "compression.type": "lz4", "batch.num.messages": 5000}
    )
    for s, line in zip(subs, lines, strict=True):
        produce_waiting(p, topic, s["job_id"].encode(), line)
    if p.flush(120) != 0:
        raise RuntimeError(f"could not load {topic}")


def consumer(bootstrap: str, topics: list[str], **extra: Any) -> Any:
    conf: dict[str, Any] = {
        "auto.offset.reset": "earliest",
        "enable.auto.commit": False,
        "enable.partition.eof": False,
        **extra,
    }
    c = KafkaClients(bootstrap).consumer(f"bench-{uuid.uuid4().hex[:10]}", conf)
    c.subscribe(topics)
    return c


Work = Callable[[list[Any]], tuple[list[tuple[bytes | None, bytes]], list[tuple[bytes, bytes]]]]


def batch_loop(
    bootstrap: str,
    src: str,
    dst: str,
    dlq: str,
    n: int,
    work: Work,
    batch: int = 500,
    poll_s: float = 0.5,
) -> dict[str, Any]:
    """consume(num_messages=batch) → work → produce → flush (durable) per batch, until n read.

    Timed from the first non-empty batch (the group join is not throughput). ``consume`` waits
    up to ``poll_s`` for a full batch: keep it short when latency, not throughput, matters."""
    from leap_stream.stream.output import OutputProducer

    out = OutputProducer(KafkaClients(bootstrap))
    c = consumer(bootstrap, [src])
    seen = batches = produced = 0
    t_first: float | None = None
    cpu0 = time.process_time()
    deadline = time.monotonic() + 600
    try:
        while seen < n and time.monotonic() < deadline:
            msgs = [m for m in c.consume(num_messages=batch, timeout=poll_s) if m.error() is None]
            if not msgs:
                continue
            if t_first is None:
                t_first = time.perf_counter()
                cpu0 = time.process_time()
            seen += len(msgs)
            batches += 1
            outs, dead = work(msgs)
            for key, value in outs:
                out.send(dst, key, value)
            for key, value in dead:
                out.send(dlq, key, value)
            produced += out.flush()
        elapsed = time.perf_counter() - (t_first or time.perf_counter())
        cpu = time.process_time() - cpu0
    finally:
        c.close()
        out.close()
    if seen < n:
        raise RuntimeError(f"{src}: read {seen} of {n} events")
    return {
        "events": seen,
        "seconds": round(elapsed, 3),
        "eps": rate(seen, elapsed),
        # CPU seconds of this process (all threads): events per CPU-second does not depend on
        # what else the shared machine runs, unlike events per wall-second
        "cpu_s": round(cpu, 3),
        "eps_per_cpu_s": rate(seen, cpu),
        "batches": batches,
        "produced": produced,
    }


def passthrough_work(msgs: list[Any]) -> tuple[list[tuple[bytes | None, bytes]], list[Any]]:
    return [(m.key(), m.value()) for m in msgs], []


def pipeline_processor(world: BenchWorld) -> tuple[Any, dict[str, Any]]:
    """The worker's batch function (`SubmissionProcessor`) on the world's store and model, and
    the stats its trees' CPU is added to (`time_the_trees`)."""
    from leap_stream.catalog import load_catalog
    from leap_stream.store.registry import Registry
    from leap_stream.stream.batch import SubmissionProcessor
    from leap_stream.stream.compiled import wanted
    from leap_stream.stream.metrics import Metrics
    from leap_stream.stream.models import RankerHolder

    catalog = load_catalog()
    compiled = wanted(world.settings.compiled_trees)
    holder = RankerHolder(catalog, Registry(world.registry_dir), Metrics(), compile_trees=compiled)
    holder.poll()
    if holder.version is None:
        raise RuntimeError("the bench model did not load")
    if compiled and not holder.wait_compiled(300):
        raise RuntimeError("compiled trees asked for but they did not compile (see the log)")
    proc = SubmissionProcessor(
        world.store(),
        holder.get,
        max_bytes=world.settings.max_message_bytes,
        known_hardware=set(catalog.types),
        window=TimeWindow(0, 0),  # simulated dates; the check itself still runs
    )
    stats: dict[str, Any] = {"valid": 0, "dead": 0, "model": 0, "trees_cpu_s": 0.0}
    time_the_trees(holder.get().model, stats)
    return proc, stats


def pipeline_work(world: BenchWorld) -> tuple[Work, Any]:
    """The worker's batch function (`SubmissionProcessor.process`), same store and ranker."""
    from leap_stream.stream.batch import Record
    from leap_stream.stream.deps import dead_letter_key

    proc, stats = pipeline_processor(world)

    def work(msgs: list[Any]) -> tuple[list[tuple[bytes | None, bytes]], list[tuple[bytes, bytes]]]:
        records = [Record(m.topic(), m.partition(), m.offset(), m.key(), m.value()) for m in msgs]
        res = proc.process(records, datetime.now(UTC))
        stats["valid"] += res.valid
        stats["dead"] += len(res.dead_letters)
        stats["model"] += sum(r["source"] == "model" for r in res.rankings)
        rankings: list[tuple[bytes | None, bytes]] = [
            (str(r["job_id"]).encode(), orjson.dumps(r)) for r in res.rankings
        ]
        dead = [(dead_letter_key(d), orjson.dumps(d)) for d in res.dead_letters]
        return rankings, dead

    return work, stats


@contextmanager
def worker_gc(settings: Settings) -> Iterator[None]:
    """The worker's garbage-collector policy (`tune_gc`) while the pipeline stage runs, undone
    after it: what the bench built before (the world, the model) is frozen as the worker's
    start-up is, so a full collection does not scan the bench's own data."""
    from leap_stream.stream.worker import tune_gc

    before = gc.get_threshold()
    tune_gc(settings)
    try:
        yield
    finally:
        gc.set_threshold(*before)
        gc.unfreeze()


def cpu_timed(fn: Callable[..., T], totals: dict[str, Any], key: str) -> Callable[..., T]:
    """``fn``, adding the process CPU seconds of each call to ``totals[key]`` (process, not
    thread: the compiled trees may run on more than one thread)."""

    @functools.wraps(fn)
    def call(*args: Any, **kwargs: Any) -> T:
        t = time.process_time()
        try:
            return fn(*args, **kwargs)
        finally:
            totals[key] += time.process_time() - t

    return call


def time_the_trees(model: Any, stats: dict[str, Any]) -> None:
    """Add the CPU seconds the model's trees take (its scorers: LightGBM's or the compiled
    ones, the booster and the ratio model) to ``stats["trees_cpu_s"]``: the one piece of the
    pipeline's work that cannot be avoided, against which the overhead ratio is measured."""
    if model is None:
        raise RuntimeError("the bench model did not load")
    model.score = cpu_timed(model.score, stats, "trees_cpu_s")
    model.ratio_score = cpu_timed(model.ratio_score, stats, "trees_cpu_s")


class PerRowModel:
    """A `ThroughputModel` called once per (job, candidate) row: the naive serving pattern."""

    def __init__(self, model: Any) -> None:
        self.inner = model
        self.version = model.version
        self.feature_names = model.feature_names
        self.calls = 0

    def support_excess(self, frame: Any) -> np.ndarray:
        return np.asarray(self.inner.support_excess(frame))

    def few_measurements(self, frame: Any) -> np.ndarray:
        return np.asarray(self.inner.few_measurements(frame))

    def predict(
        self, frame: Any, excess: np.ndarray | None = None
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Row by row (each row computes its own excess: the naive pattern)."""
        parts = []
        for i in range(len(frame)):  # `take` by position: a DataFrame or the serving Columns
            parts.append(self.inner.predict(frame.take(np.asarray([i]))))
            self.calls += 1
        if not parts:
            empty = np.zeros(0)
            return empty, empty, empty
        return (
            np.concatenate([p[0] for p in parts]),
            np.concatenate([p[1] for p in parts]),
            np.concatenate([p[2] for p in parts]),
        )


def naive_loop(world: BenchWorld, src: str, dst: str, n: int) -> dict[str, Any]:
    """One event at a time: poll, decode, a Redis round trip for its lineage (HGETALLs) and one
    for remembering it, features, one predict call per candidate row, produce."""
    from leap_stream.catalog import load_catalog
    from leap_stream.contracts import Ok, decode
    from leap_stream.core.ranker import Ranker
    from leap_stream.store.artefact import read_artefact
    from leap_stream.stream.output import OutputProducer

    catalog = load_catalog()
    known = set(catalog.types)
    base, lookup = read_artefact(world.model_dir)
    model = PerRowModel(base)
    ranker = Ranker(catalog, model=model, lookup=lookup)  # type: ignore[arg-type]
    store = world.store()
    max_bytes = world.settings.max_message_bytes
    out = OutputProducer(KafkaClients(world.bootstrap))
    c = consumer(world.bootstrap, [src])
    seen = 0
    t_first: float | None = None
    deadline = time.monotonic() + 600
    try:
        while seen < n and time.monotonic() < deadline:
            m = c.poll(0.5)
            if m is None or m.error() is not None:
                continue
            if t_first is None:
                t_first = time.perf_counter()
            seen += 1
            res = decode(m.value(), SUBMISSION_SCHEMA, max_bytes=max_bytes, known_hardware=known)
            if not isinstance(res, Ok):
                continue
            sub = res.event
            mt = sub["model"]["model_type"]
            hist, aggs = store.read_batch([sub["lineage_id"]], [mt], [mt])
            store.remember_submissions([sub])
            ranking = ranker.rank_batch([sub], list(hist), aggs, datetime.now(UTC))[0]
            if ranking["reason"] in ("model_error", "no_model"):  # a broken per-row path must
                raise RuntimeError("naive stage ranked without the model")  # not pass as a figure
            out.send(dst, sub["job_id"].encode(), orjson.dumps(ranking))
            out._producer.poll(0)
        out.flush()
        elapsed = time.perf_counter() - (t_first or time.perf_counter())
    finally:
        c.close()
        out.close()
    return {
        "events": seen,
        "seconds": round(elapsed, 3),
        "eps": rate(seen, elapsed),
        "predict_calls": model.calls,
    }


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
    completions of earlier jobs (the backlog the worker stage ranked, so their submissions are
    stored) at the same rate, in the simulator's ended_at order. In steady state every job
    completes once, so completions arrive as fast as submissions; the simulator's hours between
    a job's submission and its completion do not fit a 20 s run, its order does. Each run's
    completions get their own event ids, so no run replays another's as duplicates."""
    kind = "load" if mixed_run is None else f"mixed{mixed_run}"
    subs = _load_submissions(world, int(per_s * seconds), kind=kind)
    comps: list[dict[str, Any]] = []
    if mixed_run is not None:
        comps = [
            dict(c, event_id=f"{c['event_id']}-m{mixed_run}")
            for c in world.completions[: len(subs)]
        ]
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
    figures = _latency_figures(sent, lat, sent_order, in_worker, time.perf_counter() - t_start)
    return {"offered_per_s": per_s, "seconds": seconds, "completions": len(comps), **figures}


def http_latency(
    world: BenchWorld, rank_topic: str, per_s: float, seconds: float
) -> dict[str, Any]:
    """`leap-stream serve` on this world: single-job requests open-loop at ``per_s`` for
    ``seconds`` (latency = request sent → ranking received), then the most requests one
    process answers a second with 4 clients back to back."""
    import httpx

    from leap_stream.stream.compiled import wanted

    port = free_port()
    env = worker_env(
        bootstrap=world.bootstrap,
        redis_url=world.redis_url,
        prefix=world.prefix,
        topics={"sub": rank_topic, "comp": rank_topic, "rank": rank_topic, "dlq": rank_topic},
        group=f"bench-serve-{uuid.uuid4().hex[:8]}",
        home=world.tmp / "serve-home",
        dataset_dir=world.tmp / "dataset",
        registry_dir=world.registry_dir,
        metrics_port=0,
        settings={
            "LEAP_SERVE_PORT": str(port),
            "LEAP_LOG_LEVEL": "WARNING",
            "LEAP_REDIS_CLUSTER": "1" if world.settings.redis_cluster else "0",
        },
        inherit_leap=True,
    )
    serve = WorkerProcess(env, world.tmp / "serve.log", world.tmp, command=("serve",))
    serve.start()
    base = f"http://127.0.0.1:{port}"
    try:
        wait_for("leap-stream serve ready", serve_ready(serve, base), 120)
        if wanted(world.settings.compiled_trees):  # the compile would run during the figures

            def compiled() -> bool:
                text = httpx.get(base + "/metrics", timeout=2.0).text
                return "\nleap_model_compiled 1.0" in text

            wait_for("compiled trees serving in leap-stream serve", compiled, 180)
        bodies = world.lines
        lat = _http_open_loop(base, bodies, per_s, seconds)
        rps = _http_max_rate(base, bodies, clients=4, seconds=min(seconds, 5.0))
    finally:
        serve.stop()
    return {
        "offered_per_s": per_s,
        "seconds": seconds,
        "requests": len(lat),
        "p50_ms": percentile_ms(lat, 50),
        "p90_ms": percentile_ms(lat, 90),
        "p99_ms": percentile_ms(lat, 99),
        "max_ms": percentile_ms(lat, 100),
        "max_rps": rps,
    }


class _Caller:
    """One keep-alive HTTP/1.1 connection posting job-submitted events to /v1/rank.

    The stdlib client, not httpx: the load generator shares the two cores with the service,
    and httpx's own per-request work (~0.5 ms of Python) showed up in the measured tail."""

    def __init__(self, base: str) -> None:
        import http.client
        from urllib.parse import urlsplit

        url = urlsplit(base)
        self._conn = http.client.HTTPConnection(url.hostname or "127.0.0.1", url.port, timeout=10)
        self._headers = {"Content-Type": "application/json"}

    def post(self, body: bytes) -> int:
        self._conn.request("POST", "/v1/rank", body=body, headers=self._headers)
        resp = self._conn.getresponse()
        resp.read()
        return resp.status

    def close(self) -> None:
        self._conn.close()


def _http_open_loop(base: str, bodies: list[bytes], per_s: float, seconds: float) -> list[float]:
    """Requests sent on schedule (i / per_s) by a small pool, so a slow answer does not delay
    the next one (open loop); latency counts from the scheduled send time, so a request that
    waited for a free caller is not flattered (no coordinated omission)."""
    from concurrent.futures import ThreadPoolExecutor

    total = int(per_s * seconds)
    lat: list[float] = []
    lock = threading.Lock()
    local = threading.local()
    t0 = time.perf_counter()

    def one(i: int) -> None:
        caller = getattr(local, "caller", None)
        if caller is None:
            caller = local.caller = _Caller(base)
        status = caller.post(bodies[i % len(bodies)])
        took = time.perf_counter() - (t0 + i / per_s)
        if status == 200:
            with lock:
                lat.append(took)

    with ThreadPoolExecutor(8) as pool:
        for i in range(total):
            wait = i / per_s - (time.perf_counter() - t0)
            if wait > 0:
                time.sleep(wait)
            pool.submit(one, i)
    return lat


def _http_max_rate(base: str, bodies: list[bytes], clients: int, seconds: float) -> float:
    """Answers per second with ``clients`` callers each sending the next request at once."""
    done = [0] * clients
    end = time.perf_counter() + seconds

    def call(k: int) -> None:
        caller = _Caller(base)
        i = k
        while time.perf_counter() < end:
            done[k] += caller.post(bodies[i % len(bodies)]) == 200
            i += clients
        caller.close()

    threads = [threading.Thread(target=call, args=(k,)) for k in range(clients)]
    t0 = time.perf_counter()
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    return rate(sum(done), time.perf_counter() - t0)


__all__ = [
    "BenchWorld",
    "PerRowModel",
    "WorkerProc",
    "batch_loop",
    "build_world",
    "burst",
    "cpu_timed",
    "http_latency",
    "load_topic",
    "naive_loop",
    "offered_load",
    "passthrough_work",
    "pipeline_processor",
    "pipeline_work",
    "time_the_trees",
    "worker_backlog",
    "worker_gc",
]
