"""The bench's world: a 2-day simulated fleet, a model trained on its first day and published
in a private registry, the Redis history its completions seed, and day 2's submissions
widened to 20 candidates (docs/benchmarks.md)."""

from __future__ import annotations

import shutil
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import orjson
import pandas as pd

from leap_stream.settings import Settings
from leap_stream.store.connection import connect
from leap_stream.store.online import OnlineStore
from leap_stream.tools.bench.pending import PendingCompletions
from leap_stream.tools.bench.stats import widen_candidates

T = TypeVar("T")


SUBMISSION_SCHEMA = "job-submitted"


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
    # what the mixed loads may still send: completions of ranked, uncompleted attempts
    pending: PendingCompletions = field(init=False)

    def __post_init__(self) -> None:
        self.pending = PendingCompletions(self.submissions, self.completions)

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
    from leap_stream.tools.sim.config import SimConfig
    from leap_stream.tools.sim.events import completion_events, submission_events
    from leap_stream.tools.sim.fleet import simulate
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
