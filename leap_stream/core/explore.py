"""Exploration within the noise: among the candidates a ranking cannot tell from its first
(`ranking.within_noise_of_best`), the one whose run would teach the model most.

A fleet measures a job only where it runs, so the types a lineage and its model type never ran
on stay unmeasured, and those are the predictions the choice depends on. When the first
candidate is a type the lineage or its model type has run on, and another candidate within the
noise of it is a type neither has (`never_measured`), running that one costs at most what the
point predictions say it is slower per unit cost, and it brings the first measurement of its
(model type × type) pair. The operator's budget (`LEAP_EXPLORE_BUDGET`) is the largest extra
cost share an exploration may expect: best throughput-per-cost ÷ the explored one's − 1. Of
the candidates that qualify, the one with the best throughput per cost is explored. Pure
arrays in, arrays out; the ranker marks the candidate, the backtest's closed loop runs it.
"""

from __future__ import annotations

from typing import Final

import numpy as np

from leap_stream.core.columns import Frame, f64
from leap_stream.core.ranking import best_per_job

REASON: Final = "never_measured"  # the lineage and its model type have no measurement there


def never_measured(frame: Frame) -> np.ndarray:
    """Per row: neither the lineage (`self_count`) nor its model type (`agg_cand_count`) has a
    measurement on the row's type."""
    own, model_type = f64(frame, "self_count"), f64(frame, "agg_cand_count")
    return np.asarray(~(own > 0) & ~(model_type > 0))


def explorations(
    job: np.ndarray,
    tpc: np.ndarray,
    near: np.ndarray,
    untried: np.ndarray,
    budget: float,
    n_jobs: int,
) -> tuple[np.ndarray, np.ndarray]:
    """(per job the row to explore, -1 for none; per job its expected extra cost share, NaN
    for none). `near`: rows within the noise of their job's best (the best row included);
    `tpc`: the point throughput per cost; `untried`: `never_measured`."""
    job = np.asarray(job, np.int64)
    tpc = np.asarray(tpc, np.float64)
    near = np.asarray(near, bool) & np.isfinite(tpc)
    rows = np.full(n_jobs, -1, np.int64)
    extra = np.full(n_jobs, np.nan)
    if budget <= 0 or not near.any():
        return rows, extra
    best = np.full(n_jobs, -np.inf)
    np.maximum.at(best, job[near], tpc[near])
    is_best = near & (tpc == best[job])
    # a job whose best is itself never measured explores by running its first choice
    best_untried = np.zeros(n_jobs, bool)
    np.logical_or.at(best_untried, job[is_best], np.asarray(untried, bool)[is_best])
    with np.errstate(divide="ignore", invalid="ignore"):
        share = best[job] / tpc - 1.0
    ok = near & ~is_best & np.asarray(untried, bool) & ~best_untried[job] & (share <= budget)
    if not ok.any():
        return rows, extra
    # per job, the qualifying row with the best throughput per cost (ties: the first row)
    rows = best_per_job(job, np.where(ok, tpc, -np.inf), n_jobs)
    explored = rows >= 0
    extra[explored] = share[rows[explored]]
    return rows, extra


__all__ = ["REASON", "explorations", "never_measured"]
