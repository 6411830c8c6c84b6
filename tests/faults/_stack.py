"""Shared pieces of the fault tests: one worker's world (topics, group, prefix, folders), the
worker as a subprocess, a producer that remembers where each event landed, and the checks that
say "nothing lost, nothing doubled" (rankings, dataset, Redis history against a replay)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
import pandas as pd

from leap_stream.core.history import HistoryBook
from leap_stream.store.artefact import write_model
from leap_stream.store.offline import read_dataset
from leap_stream.stream.kafka import produce_waiting
from leap_stream.tools.harness import (
    WorkerStack,
    aggregate_differences,
    dispute_worker_holds,
    lineage_differences,
)
from leap_stream.tools.sim.config import SimConfig
from leap_stream.tools.sim.events import (
    completion_events,
    completions_in_arrival_order,
    submission_events,
)
from leap_stream.tools.sim.fleet import simulate

# quick timers and short timeouts: faults must show within a test's patience
FAULT_SETTINGS = {
    "LEAP_DATASET_FLUSH_S": "1",
    "LEAP_LAG_INTERVAL_S": "1",
    "LEAP_MODEL_POLL_S": "1",
    "LEAP_COMMIT_INTERVAL_S": "0.5",
    "LEAP_ORPHAN_GRACE_S": "60",
    "LEAP_KAFKA_SESSION_TIMEOUT_S": "6",
    "LEAP_CONSUMER_STALL_S": "20",
    "LEAP_REDIS_TIMEOUT_S": "0.5",
}


@dataclass
class Stack(WorkerStack):
    """One worker's world (tools/harness.py) with the fault tests' settings; a test changes
    ``extra_env`` before ``start``."""

    extra_env: dict[str, str] = field(default_factory=lambda: dict(FAULT_SETTINGS))
    # completion event_id -> offset in the (one-partition) completions topic, filled by `feed`:
    # the order the worker really saw, which a producer's retries may make differ from the
    # order the test sent in
    comp_offsets: dict[str, int] = field(default_factory=dict)


class Feeder:
    """A producer that remembers (topic, partition, offset) of tagged events."""

    def __init__(self, bootstrap: str, **extra: Any) -> None:
        from confluent_kafka import Producer

        conf: dict[str, Any] = {"bootstrap.servers": bootstrap, "linger.ms": 5}
        conf.update(extra)
        self.p = Producer(conf)
        self.placed: dict[Any, tuple[str, int, int]] = {}
        self.errors: list[str] = []

    def send(self, topic: str, key: str | None, value: bytes | None, tag: Any = None) -> None:
        def done(err: Any, msg: Any) -> None:
            if err is not None:
                self.errors.append(str(err))
            elif tag is not None:
                self.placed[tag] = (msg.topic(), msg.partition(), msg.offset())

        produce_waiting(self.p, topic, None if key is None else key.encode(), value, done)

    def flush(self) -> None:
        assert self.p.flush(60) == 0
        assert not self.errors, self.errors


@dataclass
class Fleet:
    subs: list[dict[str, Any]]
    comps: list[dict[str, Any]]

    @property
    def keys(self) -> set[tuple[str, int]]:
        return {(s["job_id"], s["attempt"]) for s in self.subs}

    @property
    def events(self) -> int:
        return len(self.subs) + len(self.comps)


def fleet(seed: int, rate: int) -> Fleet:
    sim = simulate(SimConfig(seed=seed, days=1, rate=rate))
    subs = submission_events(sim.submissions)
    subs.sort(key=lambda s: s["submitted_at"])
    comps = completion_events(completions_in_arrival_order(sim.completions))
    return Fleet(subs, comps)


def feed(
    feeder: Feeder, stack: Stack, subs: Iterable[dict[str, Any]], comps: Iterable[dict[str, Any]]
) -> None:
    for s in subs:
        feeder.send(stack.topics["sub"], s["job_id"], orjson.dumps(s))
    for c in comps:
        feeder.send(stack.topics["comp"], c["job_id"], orjson.dumps(c), tag=("comp", c["event_id"]))
    feeder.flush()
    stack.comp_offsets.update(
        {
            tag[1]: off
            for tag, (_t, _p, off) in feeder.placed.items()
            if isinstance(tag, tuple) and tag[0] == "comp"
        }
    )


def check_nothing_lost(
    stack: Stack, fl: Fleet, latest: dict[tuple[str, int], Any]
) -> dict[str, int]:
    """Every submission ranked; the dataset has every completion once; Redis history equals a
    replay of the completions in arrival order (the completions topic has one partition: its
    offsets, as `feed` recorded them, are that order)."""
    missing_rankings = fl.keys - set(latest)
    assert not missing_rankings, f"{len(missing_rankings)} submissions never ranked"
    frame = read_dataset(stack.tmp / "dataset")
    ids = frame["event_id"].tolist()
    assert len(ids) == len(set(ids)), "a completion appears twice in the dataset"
    want = {c["event_id"] for c in fl.comps}
    lost = want - set(ids)
    assert not lost, (
        f"{len(lost)} completions missing from the dataset: {_whereabouts(stack, fl, lost)}"
    )
    assert set(ids) == want
    book = HistoryBook()
    arrival = stack.comp_offsets
    order = fl.comps
    if arrival:  # fed through `feed`: every completion's offset is known
        unplaced = [c["event_id"] for c in fl.comps if c["event_id"] not in arrival]
        assert not unplaced, f"{len(unplaced)} completions without a recorded offset"
        order = sorted(fl.comps, key=lambda c: arrival[c["event_id"]])
    for c in order:
        book.apply_completion(c)
    store = stack.online_store()
    types_of = {c["lineage_id"]: c["model_type"] for c in fl.comps}
    lineage_types = [types_of[x] for x in book.lineage_ids]
    hist, aggs = store.read_batch(book.lineage_ids, book.model_types, lineage_types)
    dispute_worker_holds(book, frame)
    differ_lin, disputed = lineage_differences(hist, book, book.lineage_ids)
    assert not differ_lin, (
        f"Redis history differs from a replay for {len(differ_lin)} lineages; first (lineage, "
        f"redis, replay): {differ_lin[0]}"
    )
    assert disputed <= max(3, len(book.lineage_ids) // 100), f"{disputed} lineages disputed"
    # every completion applied once: its dedup marker is there (a loss would have none)
    unseen = [
        c["event_id"]
        for c in fl.comps
        if not store.r.exists(store.keys.seen(c["event_id"], c["model_type"]))
    ]
    assert not unseen, f"{len(unseen)} completions never applied, e.g. {unseen[:3]}"
    want_aggs = {m: book.aggregates(m) for m in book.model_types}
    differ = aggregate_differences(aggs, want_aggs, skip=book.disputed_types)
    assert not differ, (
        f"Redis aggregates differ from a replay for {len(differ)} model types; first (redis, "
        f"replay): {next(iter(differ.items()))}"
    )
    store.r.close()
    return {"rankings": len(latest), "dataset_rows": len(ids), "lineages": len(book.lineage_ids)}


def _whereabouts(stack: Stack, fl: Fleet, lost: set[str]) -> str:
    """For a failure message: how many of the missing completions were dead-lettered, by kind
    (not lost, but not expected either), and the first ones' offsets, whether Redis applied
    them (their dedup marker), their status and end."""
    from leap_stream.tools.observe import dead_letters

    dead = dead_letters(stack.bootstrap, stack.topics["dlq"])
    kinds: dict[str, int] = {}
    for e in lost:
        d = dead.get((stack.topics["comp"], 0, stack.comp_offsets.get(e, -1)))
        kind = "not dead-lettered" if d is None else str(d["error"]["kind"])
        kinds[kind] = kinds.get(kind, 0) + 1
    store = stack.online_store()
    by_id = {c["event_id"]: c for c in fl.comps}
    first = []
    for e in sorted(lost)[:10]:
        c = by_id[e]
        seen = store.r.get(store.keys.seen(e, c["model_type"]))
        first.append((e, stack.comp_offsets.get(e), seen, c["status"], c["ended_at"]))
    store.r.close()
    return f"{kinds}; first (event, offset, applied, status, end): {first}"


def promote_model(registry_dir: Path, dataset: pd.DataFrame, rounds: int = 30) -> str:
    from leap_stream.core.lookup import LookupTable
    from leap_stream.store.registry import Registry
    from leap_stream.train.trainer import fit, training_rows

    model = fit(training_rows(dataset), num_rounds=rounds)
    d = write_model(registry_dir.parent / f"build-{model.version}", model, LookupTable.fit(dataset))
    reg = Registry(registry_dir)
    version = reg.publish(d)
    reg.promote(version)
    return version
