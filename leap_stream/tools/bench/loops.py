"""The bench's in-process stages and their Kafka plumbing: one broker, one Redis, own topics, run one
after another.

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
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any, TypeVar

import numpy as np
import orjson

from leap_stream.contracts import TimeWindow
from leap_stream.settings import Settings
from leap_stream.stream.kafka import KafkaClients, produce_waiting
from leap_stream.tools.bench.stats import rate
from leap_stream.tools.bench.world import SUBMISSION_SCHEMA, BenchWorld

T = TypeVar("T")


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
    holder = RankerHolder(
        catalog,
        Registry(world.registry_dir),
        Metrics(),
        compile_trees=compiled,
        explore_budget=world.settings.explore_budget,  # the worker's ranking: explorations
        probe=world.settings.probe_settings(),  # and probes planned as it plans them
    )
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
