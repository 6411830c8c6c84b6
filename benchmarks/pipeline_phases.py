"""Where a ranked job's CPU goes, without Kafka: the bench's pipeline stage in-process, by phase.

    .venv/bin/python benchmarks/pipeline_phases.py --events 20000 --runs 3

Needs Redis (`leap-stream dev up`, or LEAP_REDIS_URL). Builds the bench's world (the same
simulated fleet, model and Redis history as `leap-stream bench`, 20 candidates a job), then runs
`SubmissionProcessor.process` over the submissions in batches of 500 under the worker's
collector policy, and encodes the rankings as the worker does. Each phase is timed with
process_time around the function that does it; a phase's time includes the phases inside it.
Prints CPU per job by phase and the in-process overhead ratio (pipeline CPU / the trees' CPU,
as the bench's `overhead_ratio`, but with no consume, produce or flush). Asserts nothing.
"""

from __future__ import annotations

import argparse
import time
from collections import defaultdict
from datetime import UTC, datetime
from typing import Any

import orjson

# (label, module, attribute path): the phases of SubmissionProcessor.process; a function is
# wrapped where its caller looks it up (a name imported into the caller's module there)
PHASES: tuple[tuple[str, str, str], ...] = (
    ("process (all)", "leap_stream.stream.batch", "SubmissionProcessor.process"),
    ("  decode + validate", "leap_stream.stream.batch", "decode_records"),
    ("  redis round trip", "leap_stream.store.online", "OnlineStore.read_and_remember"),
    ("    reply decode", "leap_stream.store.online", "OnlineStore._decode_reads"),
    ("    script call", "leap_stream.store.online", "OnlineStore._execute"),
    ("  rank", "leap_stream.core.ranker", "Ranker.rank_batch"),
    ("    feature build", "leap_stream.core.features", "build_columns"),
    ("    model (with trees)", "leap_stream.core.predictor.model", "ThroughputModel.predict"),
    ("      input matrices", "leap_stream.core.predictor.model", "_matrix"),
    ("      ratio-model matrix", "leap_stream.core.predictor.model", "_ratio_matrix"),
    ("      learned roofline", "leap_stream.core.roofline", "LearnedRoofline.predict"),
    ("    candidate entries", "leap_stream.core.ranker", "_RankedRows.of"),
    ("  stored predictions", "leap_stream.stream.batch", "SubmissionProcessor._keep_predictions"),
)


def timed_phases() -> dict[str, float]:
    """Wrap every phase's function to add its CPU seconds to the returned totals."""
    import importlib

    from leap_stream.tools.bench.loops import cpu_timed

    spent: dict[str, float] = defaultdict(float)
    for label, module, path in PHASES:
        owner: Any = importlib.import_module(module)
        *parents, name = path.split(".")
        for p in parents:
            owner = getattr(owner, p)
        raw = owner.__dict__[name] if isinstance(owner, type) else getattr(owner, name)
        fn = raw.__func__ if isinstance(raw, classmethod | staticmethod) else raw
        wrapped: Any = cpu_timed(fn, spent, label)
        if isinstance(raw, classmethod):
            wrapped = classmethod(wrapped)
        elif isinstance(raw, staticmethod):
            wrapped = staticmethod(wrapped)
        setattr(owner, name, wrapped)
    return spent


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--events", type=int, default=20_000)
    ap.add_argument("--candidates", type=int, default=20)
    ap.add_argument("--batch", type=int, default=500)
    ap.add_argument("--runs", type=int, default=1, help="passes over the events after a warm-up")
    args = ap.parse_args()

    from leap_stream.settings import Settings
    from leap_stream.stream.batch import Record
    from leap_stream.tools.bench.loops import pipeline_processor, worker_gc
    from leap_stream.tools.bench.world import build_world

    settings = Settings.from_env()
    redis_url = settings.redis_url or "redis://127.0.0.1:6379/0"
    world = build_world("", redis_url, args.events, args.candidates, settings)
    spent = timed_phases()
    try:
        proc, stats = pipeline_processor(world)
        records = [
            Record("bench", 0, i, str(s["job_id"]).encode(), line)
            for i, (s, line) in enumerate(zip(world.submissions, world.lines, strict=True))
        ]

        def one_pass() -> int:
            ranked = 0
            for i in range(0, len(records), args.batch):
                res = proc.process(records[i : i + args.batch], datetime.now(UTC))
                ranked += len([orjson.dumps(r) for r in res.rankings])
            return ranked

        one_pass()  # warm-up: compiled trees, caches, the first batches' allocations
        with worker_gc(settings):
            for run in range(args.runs):
                spent.clear()
                stats["trees_cpu_s"] = 0.0
                cpu = time.process_time()
                n = one_pass()
                cpu = time.process_time() - cpu
                trees = stats["trees_cpu_s"]
                print(
                    f"run {run + 1}: {n} jobs, {cpu / n * 1e6:.1f} us CPU per job, trees "
                    f"{trees / n * 1e6:.1f} us: in-process overhead ratio {cpu / trees:.2f}"
                )
                for label, _m, _p in PHASES:
                    print(f"  {label:28s} {spent[label] / n * 1e6:7.1f} us per job")
                rest = cpu - spent["process (all)"]
                print(f"  {'rankings encoded, the loop':28s} {rest / n * 1e6:7.1f} us per job")
    finally:
        world.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
