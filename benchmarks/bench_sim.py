"""How fast the fleet simulator generates events, on one core.

Prints figures, asserts nothing. "events" = submissions + completions. Three stages:
  frames  — simulate(): submissions, completions, dataset and truth DataFrames
  dicts   — frames + schema-shaped event dicts (submission_events / completion_events)
  lines   — frames + the events as JSON bytes (what --to-kafka produces and the files hold)
  written — frames + write_jsonl(): both JSONL files and the two Parquet files
CPU time (process_time) is reported next to wall time because the machine is shared.

    .venv/bin/python benchmarks/bench_sim.py --days 2 --rate 30000
"""

from __future__ import annotations

import argparse
import tempfile
import time
from collections.abc import Callable
from typing import Any

import orjson

from leap_stream.tools.sim.config import SimConfig, SimResult
from leap_stream.tools.sim.events import (
    completion_events,
    completion_lines,
    submission_events,
    submission_lines,
    write_jsonl,
)
from leap_stream.tools.sim.fleet import simulate


def _timed(fn: Callable[[], Any]) -> tuple[Any, float, float]:
    w, c = time.perf_counter(), time.process_time()
    out = fn()
    return out, time.perf_counter() - w, time.process_time() - c


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--days", type=int, default=2)
    ap.add_argument("--rate", type=int, default=30000)
    ap.add_argument("--repeat", type=int, default=2, help="best of N")
    args = ap.parse_args()
    cfg = SimConfig(seed=args.seed, days=args.days, rate=args.rate)
    simulate(SimConfig(seed=0, days=1, rate=200))  # warm caches (model catalog, schemas)

    best: dict[str, tuple[float, float]] = {}
    result: SimResult | None = None
    for _ in range(args.repeat):
        result, w_sim, c_sim = _timed(lambda: simulate(cfg))
        assert result is not None
        r: SimResult = result

        def events(r: SimResult = r) -> object:
            return submission_events(r.submissions), completion_events(r.completions)

        def lines(r: SimResult = r) -> object:
            return submission_lines(r.submissions), completion_lines(r.completions)

        _, w_ev, c_ev = _timed(events)
        _, w_ln, c_ln = _timed(lines)
        with tempfile.TemporaryDirectory() as tmp:

            def write(r: SimResult = r, tmp: str = tmp) -> object:
                return write_jsonl(r, tmp)

            _, w_wr, c_wr = _timed(write)
        for key, w, c in (
            ("frames", w_sim, c_sim),
            ("dicts", w_sim + w_ev, c_sim + c_ev),
            ("lines", w_sim + w_ln, c_sim + c_ln),
            ("written", w_sim + w_wr, c_sim + c_wr),
        ):
            prev = best.get(key)
            if prev is None or c < prev[1]:
                best[key] = (w, c)
    assert result is not None
    n_events = len(result.submissions) + len(result.completions)
    figures = {
        "events": n_events,
        "truth_rows": len(result.truth),
        **{f"{k}_events_per_s_cpu": round(n_events / c) for k, (w, c) in best.items()},
        **{f"{k}_events_per_s_wall": round(n_events / w) for k, (w, c) in best.items()},
    }
    for k, (w, c) in best.items():
        print(
            f"{k:8s} {n_events / c:>10,.0f} events/s cpu   {n_events / w:>10,.0f} events/s wall"
            f"   ({c:.2f} s cpu, {w:.2f} s wall)"
        )
    print(orjson.dumps(figures).decode())


if __name__ == "__main__":
    main()
