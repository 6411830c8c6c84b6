"""Pure helpers of the bench: figures, ratios, pacing, candidate widening (unit-tested)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

FINAL_KEYS = (
    "passthrough_eps",
    "pipeline_eps",
    "worker_eps",
    "naive_eps",
    "p50_ms_at_1000",
    "p99_ms_at_1000",
    "p99_ms_mixed_at_1000",
    "burst_clear_s",
    "burst_p99_ms_first_1000",
    "http_p50_ms_at_200",
    "http_p99_ms_at_200",
    "http_max_rps",
    "overhead_ratio",
    "pipeline_cpu_us_per_job",
    "trees_cpu_us_per_job",
    "hardware_types",
    "candidates_per_job",
    "workers",
    "redis_cluster",
    "compiled_trees",
    "pipeline_vs_passthrough",
    "pipeline_vs_naive",
    "capacity_at_p99_50ms",
    "serve_capacity_at_p99_10ms",
    "capacity_cores",
)


def rate(events: int, seconds: float) -> float:
    """Events per second; 0 when nothing was timed (never a division by zero)."""
    return events / seconds if seconds > 0 and events > 0 else 0.0


def percentile_ms(latencies_s: Sequence[float], q: float) -> float:
    """q-th percentile (0..100) of latencies given in seconds, in milliseconds; NaN if empty."""
    if len(latencies_s) == 0:
        return math.nan
    return float(np.percentile(np.asarray(latencies_s, np.float64), q) * 1000.0)


def ratio(a: float, b: float) -> float:
    return a / b if b > 0 else math.nan


def final_figures(figs: Mapping[str, Any]) -> dict[str, Any]:
    """The last stdout line: the brief's keys, with the two ratios computed here."""
    out = {
        k: figs.get(k)
        for k in FINAL_KEYS
        if k not in ("pipeline_vs_passthrough", "pipeline_vs_naive")
    }
    out["pipeline_vs_passthrough"] = round(
        ratio(float(figs["pipeline_eps"]), float(figs["passthrough_eps"])), 3
    )
    out["pipeline_vs_naive"] = round(
        ratio(float(figs["pipeline_eps"]), float(figs["naive_eps"])), 2
    )
    for k, v in list(out.items()):
        if isinstance(v, float) and not math.isfinite(v):
            out[k] = None  # JSON has no NaN
        elif isinstance(v, float):
            out[k] = round(v, 3)
    return out


def overhead(cpu_s: float, trees_cpu_s: float, jobs: int) -> dict[str, float]:
    """The pipeline's CPU per ranked job, the model's trees' CPU for that job's rows, and their
    ratio: how much the service spends around the one piece of work it cannot avoid."""
    per_job = cpu_s / jobs * 1e6 if jobs else math.nan
    trees = trees_cpu_s / jobs * 1e6 if jobs else math.nan
    return {
        "pipeline_cpu_us_per_job": per_job,
        "trees_cpu_us_per_job": trees,
        "overhead_ratio": per_job / trees if trees > 0 else math.nan,
    }


def mixed_summary(runs: Sequence[Mapping[str, Any]], limit_ms: float = 50.0) -> dict[str, Any]:
    """The mixed-load runs in one figure: ``p99_ms`` is the run p99 that nine runs in ten
    stay under (the ceil(0.9 n)-th smallest), the figure the target is about; every run's
    p99 is kept beside it."""
    p99s = [float(r["p99_ms"]) for r in runs]
    ordered = sorted(p99s)
    return {
        "p99_ms": ordered[max(0, math.ceil(0.9 * len(ordered)) - 1)] if ordered else math.nan,
        "p99_ms_runs": [round(v, 1) for v in p99s],
        "runs_under_50ms": sum(v < limit_ms for v in p99s),
        "runs": len(p99s),
    }


def due(elapsed_s: float, per_s: float, total: int) -> int:
    """How many events an open-loop generator at ``per_s`` should have sent after ``elapsed_s``."""
    if elapsed_s <= 0:
        return 0
    return min(total, int(elapsed_s * per_s) + 1)


def widen_candidates(
    submission: Mapping[str, Any], types: Sequence[str], k: int, salt: int = 0
) -> dict[str, Any]:
    """The submission with exactly ``k`` candidate types: its default plus others, rotated by salt.

    The bench needs a fixed fan-out (k rows per job) so the figures compare at a known width.
    """
    if k > len(types):
        raise ValueError(f"{k} candidates asked, the catalog has {len(types)} types")
    default = submission["default_hardware"]
    others = [t for t in types if t != default]
    start = salt % len(others)
    rotated = others[start:] + others[:start]
    out = dict(submission)
    out["candidate_hardware"] = [default, *rotated[: k - 1]]
    return out


__all__ = [
    "FINAL_KEYS",
    "due",
    "final_figures",
    "percentile_ms",
    "rate",
    "ratio",
    "widen_candidates",
]
