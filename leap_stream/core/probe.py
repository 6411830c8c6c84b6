"""Probes: a short measured run on a few candidates, where what the choice may lose is worth
more than the run.

A ranking is a prediction; for a long job on many devices a wrong first choice costs more than
measuring. Each candidate's predictive distribution is lognormal around its prediction with the
spread of its 80 % interval. Over the job's first `ProbeSettings.top` candidates (by throughput
per cost), the expected regret of choosing now is E[cost of the first] − E[cheapest cost], the
job's cost on a type being its planned samples at the type's throughput × devices × price.
Probing a set of candidates measures each with a short run's noise; the choice then takes the
best by the posterior (the prediction and the probe, weighed by their precisions), and its
expected regret is what is left.

A probe runs the smallest slice of the job that fits the type (`ProbeSettings.size` "slice":
one data-parallel replica, its tensor × pipeline devices with its share of the global batch,
or the fewest replicas whose devices hold the model state; `slice_data_parallel`,
`slice_shape`) for `minutes` at its type's price, and its measurement is carried to the job's
size through the model's own device-count response (`carry`: × the prediction at the job's size
÷ the prediction at the probe's), which adds `ProbeSettings.carry_sd` to its noise. With size "job" a probe runs the
job's own devices, and the first candidate's probe is the job's own start there, whose minutes
are lost only when the probes move the job (`probe_cost_as_run`). A job is probed on the set that saves most
in expectation, net of the probes' expected cost, when that saving is positive and the cost is
at most `budget` × the job's expected cost on its first choice (`LEAP_PROBE_BUDGET`). Jobs
without `planned_samples` count as small: never probed.

Expectations are over fixed draws (common to every job and call): the same inputs give the same
plan. Pure arrays in, arrays out; the ranker marks the candidates, the scheduler runs them and
reports each as a completion marked `probe`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from itertools import combinations
from typing import Final, Literal

import numpy as np

from leap_stream.core.features import FIT_HEADROOM
from leap_stream.core.ranking import best_per_job, rank_order

ProbeSize = Literal["slice", "job"]
PROBE_SIZES: Final[tuple[ProbeSize, ...]] = ("slice", "job")
# The log sd of a slice probe's carry to the job's size: what the model's device-count
# response misses of how the job's throughput scales from a few replicas to all of them
# (docs/decisions/0016).
CARRY_SD: Final = 0.10
Z80: Final = 1.2815515655446004  # the 80 % interval's half-width in standard normals
DRAWS_SEED: Final = 20261207  # the fixed draws' seed: a plan does not depend on the call


@dataclass(frozen=True)
class ProbeSettings:
    """What a probe may cost and what it measures."""

    budget: float = 0.01  # largest share of the job's expected cost its probes may take; 0: none
    minutes: float = 5.0  # a probe's length, warm-up included
    size: ProbeSize = "job"  # what a probe runs: the whole job, or the smallest slice that fits
    carry_sd: float = CARRY_SD  # log sd of carrying a slice's measurement to the job's size
    top: int = 3  # the first candidates a probe chooses among
    draws: int = 256  # draws of the expectations

    @property
    def enabled(self) -> bool:
        return self.budget > 0 and self.minutes > 0

    @property
    def in_place(self) -> bool:
        """Whether the first candidate's probe is the job's own start (a whole-job probe)."""
        return self.size == "job"

    @property
    def noise(self) -> float:
        """The log sd of what a probe says of the job at its own size: a run of `minutes`
        (`probe_noise`), and for a slice the carry to the job's size."""
        carry = 0.0 if self.in_place else self.carry_sd
        return math.hypot(probe_noise(self.minutes), carry)


NOISE_AT_5_MIN: Final = 0.05  # a 5-minute probe's log sd: above a full run's (about 0.035)


def probe_noise(minutes: float) -> float:
    """The log sd of a probe's measurement: `NOISE_AT_5_MIN` at 5 minutes, shrinking with the
    square root of the steps averaged (a shorter probe measures fewer)."""
    return NOISE_AT_5_MIN * math.sqrt(5.0 / max(minutes, 1e-3))


def slice_data_parallel(
    state_gib: np.ndarray,
    acts_gib: np.ndarray,
    num_devices: np.ndarray,
    data_parallel: np.ndarray,
    memory_gib: np.ndarray,
) -> np.ndarray:
    """Per row, the data-parallel degree of the smallest slice of the job a probe can run on a
    type with ``memory_gib`` per device: one replica when its model state (``state_gib``,
    sharded over the slice's devices) and activations (``acts_gib`` per device) fit, else the
    fewest replicas, a power of two, that do (`core.physics.memory_parts_gib`, the bound the
    ranking's `fits` uses); the job's own degree when none smaller does."""
    dp = np.maximum(np.asarray(data_parallel, np.int64), 1)
    per_replica = np.maximum(np.asarray(num_devices, np.int64) // dp, 1)
    free = np.asarray(memory_gib, np.float64) * FIT_HEADROOM - np.asarray(acts_gib, np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        need = np.asarray(state_gib, np.float64) / (np.where(free > 0, free, np.nan) * per_replica)
    need = np.where(np.isfinite(need), np.maximum(need, 1.0), np.inf)
    power = np.exp2(np.ceil(np.log2(np.minimum(need, 2.0**40))))
    return np.asarray(np.where(power < dp, power, dp), np.int64)


def slice_shape(
    num_devices: np.ndarray,
    data_parallel: np.ndarray,
    global_batch: np.ndarray,
    slice_dp: np.ndarray,
) -> tuple[np.ndarray, np.ndarray]:
    """(devices, global batch) of a slice of each job of ``slice_dp`` data-parallel replicas:
    the devices of one replica (its tensor × pipeline) times that, and the global batch in
    proportion, at least 1; all of its replicas: the job as asked."""
    dp = np.maximum(np.asarray(data_parallel, np.int64), 1)
    k = np.clip(np.asarray(slice_dp, np.int64), 1, dp)
    nd, gb = np.asarray(num_devices, np.int64), np.asarray(global_batch, np.int64)
    devices = np.maximum(nd // dp, 1) * k
    batch = np.maximum(np.rint(gb * k / dp), 1).astype(np.int64)
    whole = k >= dp  # all of it: the job as asked
    return np.where(whole, nd, devices), np.where(whole, gb, batch)


def carry(measured: np.ndarray, pred_job: np.ndarray, pred_probe: np.ndarray) -> np.ndarray:
    """A probe's measurement carried to the job's size: × the model's prediction at the job's
    size ÷ its prediction at the probe's (NaN where either is missing)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.asarray(pred_job, np.float64) / np.asarray(pred_probe, np.float64)
    ok = np.isfinite(ratio) & (ratio > 0)
    return np.asarray(np.where(ok, np.asarray(measured, np.float64) * ratio, np.nan))


@dataclass(frozen=True)
class ProbePlan:
    """Per row whether to probe it; per job the expected saving net of the probe's cost and
    that cost (USD), NaN for a job not probed."""

    rows: np.ndarray
    saving: np.ndarray
    cost: np.ndarray

    @classmethod
    def none(cls, n_rows: int, n_jobs: int) -> ProbePlan:
        return cls(np.zeros(n_rows, bool), np.full(n_jobs, np.nan), np.full(n_jobs, np.nan))


def log_sd(low: np.ndarray, high: np.ndarray) -> np.ndarray:
    """The log standard deviation an 80 % interval implies (NaN without one)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.asarray(np.log(np.asarray(high) / np.asarray(low)) / (2.0 * Z80))


def plan_probes(
    job: np.ndarray,
    pred: np.ndarray,
    low: np.ndarray,
    high: np.ndarray,
    usd_per_hour: np.ndarray,
    planned_samples: np.ndarray,
    settings: ProbeSettings,
    probe_usd_per_hour: np.ndarray | None = None,
) -> ProbePlan:
    """The probes of a batch. Per row: its job, predicted samples/s with its 80 % interval,
    what the job costs per hour there (price × devices; NaN where it cannot run) and what a
    probe there costs per hour (price × the probe's devices; default the job's). Per job: its
    planned samples (NaN: unknown)."""
    job = np.asarray(job, np.int64)
    planned = np.asarray(planned_samples, np.float64)
    n_jobs = len(planned)
    plan = ProbePlan.none(len(job), n_jobs)
    if not settings.enabled or not len(job) or not (planned > 0).any():
        return plan
    pred, rate = np.asarray(pred, np.float64), np.asarray(usd_per_hour, np.float64)
    probe_rate = rate if probe_usd_per_hour is None else np.asarray(probe_usd_per_hour, np.float64)
    # the rows of jobs that could pay for a probe at all: cheap per-job bounds before any sort
    sub = np.flatnonzero(planned[job] > 0)
    sd = np.full(len(job), np.nan)
    sd[sub] = log_sd(np.asarray(low)[sub], np.asarray(high)[sub])
    p, c, s_ = pred[sub], rate[sub], sd[sub]
    ok = (p > 0) & np.isfinite(p) & (c > 0) & np.isfinite(c) & (s_ > 0) & (s_ < 5)
    sub, j = sub[ok], job[sub[ok]]
    tpc = pred[sub] / rate[sub]
    best_tpc, low_rate = np.zeros(n_jobs), np.full(n_jobs, np.inf)
    np.maximum.at(best_tpc, j, tpc)
    np.minimum.at(low_rate, j, np.where(np.isfinite(probe_rate[sub]), probe_rate[sub], np.inf))
    with np.errstate(divide="ignore", invalid="ignore"):
        first_cost = planned / (3600.0 * best_tpc)  # the job's cost on its first candidate
    cheapest = settings.minutes / 60.0 * low_rate
    worth = (np.bincount(j, minlength=n_jobs) >= 2) & (cheapest <= settings.budget * first_cost)
    jobs = np.flatnonzero(worth)
    if not len(jobs):
        return plan
    keep = worth[j]
    sub = sub[keep]
    top_sub = _top_rows(job[sub], tpc[keep], n_jobs, settings.top)
    top = np.where(top_sub >= 0, sub[np.maximum(top_sub, 0)], -1)
    rows = top[jobs]
    valid = rows >= 0
    r = np.maximum(rows, 0)
    scale = np.where(valid, planned[jobs, None] * rate[r] / 3600.0, np.nan)  # cost × samples/s
    probe_cost = np.where(valid, settings.minutes / 60.0 * probe_rate[r], np.inf)
    allowance = settings.budget * first_cost[jobs]
    best_set, saving, spend = _best_probe_sets(
        np.where(valid, np.log(pred[r]), 0.0),
        np.where(valid, sd[r], 1.0),
        scale,
        probe_cost,
        valid,
        allowance,
        settings,
    )
    take = saving > 0
    probe_rows = plan.rows.copy()
    probe_rows[rows[best_set & take[:, None]]] = True
    out_saving, out_cost = plan.saving.copy(), plan.cost.copy()
    out_saving[jobs[take]] = saving[take]
    out_cost[jobs[take]] = spend[take]
    return ProbePlan(probe_rows, out_saving, out_cost)


def _top_rows(job: np.ndarray, score: np.ndarray, n_jobs: int, k: int) -> np.ndarray:
    """(jobs, k): each job's best `k` rows by score, best first (positions in `job`); -1 pads."""
    order = rank_order(job, score)
    j = job[order]
    starts = np.searchsorted(j, np.arange(n_jobs))
    rank = np.arange(len(order)) - starts[j]
    keep = rank < k
    out = np.full((n_jobs, k), -1, np.int64)
    out[j[keep], rank[keep]] = order[keep]
    return out


def _masks(k: int, size: int) -> list[list[bool]]:
    """Every subset of `size` of `k` candidates, as masks."""
    return [[i in chosen for i in range(k)] for chosen in combinations(range(k), size)]


def _best_probe_sets(
    mu: np.ndarray,
    sd: np.ndarray,
    scale: np.ndarray,
    probe_cost: np.ndarray,
    valid: np.ndarray,
    allowance: np.ndarray,
    settings: ProbeSettings,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per job (rows of the (jobs, k) arrays, the first candidate first): the candidates to
    probe (bool, (jobs, k)), the expected saving net of their expected cost and that cost,
    among the sets whose expected cost is within the job's `allowance` (saving -inf: none
    is). `mu`, `sd`: the log prediction and its spread; `scale`: cost × throughput (the cost
    is `scale` / throughput)."""
    n, k = mu.shape
    rng = np.random.default_rng(DRAWS_SEED)
    z = rng.standard_normal((k, settings.draws))
    e = rng.standard_normal((k, settings.draws))
    log_true = mu[:, :, None] + sd[:, :, None] * z[None]
    cost = np.where(valid[:, :, None], scale[:, :, None] / np.exp(log_true), np.inf)
    cheapest = cost.min(1)
    regret_now = (cost[:, 0] - cheapest).mean(1)
    measured = log_true + settings.noise * e[None]
    posterior = _posterior(mu[:, :, None], 1.0 / sd[:, :, None] ** 2, measured, settings)
    # every non-empty subset at once, smallest first: (jobs, subsets, candidates, draws)
    subsets = np.asarray([m for size in range(1, k + 1) for m in _masks(k, size)], bool)
    belief = np.where(subsets[None, :, :, None], posterior[:, None], mu[:, None, :, None])
    log_scale = np.where(valid, np.log(np.where(valid, scale, 1.0)), np.inf)
    pick = (log_scale[:, None, :, None] - belief).argmin(2)
    paid = np.take_along_axis(np.broadcast_to(cost[:, None], belief.shape), pick[:, :, None], 2)
    regret_after = (paid[:, :, 0] - cheapest[:, None]).mean(2)
    # a whole-job probe of the first candidate is the job's own start there: its minutes are
    # lost only when the probes move the job
    each = np.where(subsets[None], np.where(valid, probe_cost, 0.0)[:, None], 0.0)
    moved = (pick != 0).mean(2) if settings.in_place else 1.0
    spend = each[:, :, 1:].sum(2) + each[:, :, 0] * moved
    usable = ~(subsets[None] & ~valid[:, None]).any(2) & (spend <= allowance[:, None])
    saving = np.where(usable, regret_now[:, None] - regret_after - spend, -np.inf)
    best = saving.argmax(1)  # ties: the smallest subset
    best_set = subsets[best]
    best_saving = saving[np.arange(n), best]
    return best_set, best_saving, spend[np.arange(n), best]


def _posterior(
    log_pred: np.ndarray, w_prior: np.ndarray, log_measured: np.ndarray, settings: ProbeSettings
) -> np.ndarray:
    """The log throughput a prediction (precision `w_prior`) and a probe's measurement (its
    noise's precision) make together: their precision-weighted mean."""
    w_probe = 1.0 / settings.noise**2
    return np.asarray((log_pred * w_prior + log_measured * w_probe) / (w_prior + w_probe))


def probe_cost_as_run(
    usd_per_hour: dict[str, float], first: str, ran_on: str, settings: ProbeSettings
) -> float:
    """What a job's probes cost once it ran (`usd_per_hour`: per probed type, a probe's cost
    per hour there): every probe, but a whole-job probe of the first candidate only when the
    job moved from it."""
    hours = settings.minutes / 60.0
    return sum(
        hours * r
        for t, r in usd_per_hour.items()
        if not settings.in_place or t != first or ran_on != first
    )


def choose_after_probes(
    job: np.ndarray,
    pred: np.ndarray,
    low: np.ndarray,
    high: np.ndarray,
    usd_per_hour: np.ndarray,
    measured: np.ndarray,
    settings: ProbeSettings,
    n_jobs: int,
) -> np.ndarray:
    """Per job the row to run once its probes are in (-1: none usable): the best throughput
    per cost where a probed row's throughput is the posterior median (its prediction and the
    probe's measurement, weighed by their precisions, as `plan_probes` expects) and any other
    row keeps its prediction. `measured`: per row what the probe says of the job at its own
    size (a slice's measurement `carry`-ed), NaN where none ran."""
    job = np.asarray(job, np.int64)
    pred, measured = np.asarray(pred, np.float64), np.asarray(measured, np.float64)
    sd = log_sd(low, high)
    probed = np.isfinite(measured) & (measured > 0)
    with np.errstate(divide="ignore", invalid="ignore"):
        w_prior = np.where(np.isfinite(sd) & (sd > 0), 1.0 / sd**2, 0.0)
        belief = np.where(
            probed, _posterior(np.log(pred), w_prior, np.log(measured), settings), np.log(pred)
        )
        belief = np.where(probed & ~(pred > 0), np.log(measured), belief)
        score = np.exp(belief) / np.asarray(usd_per_hour, np.float64)
    return best_per_job(job, np.where(score > 0, score, np.nan), n_jobs)


__all__ = [
    "CARRY_SD",
    "NOISE_AT_5_MIN",
    "PROBE_SIZES",
    "Z80",
    "ProbePlan",
    "ProbeSettings",
    "ProbeSize",
    "carry",
    "choose_after_probes",
    "log_sd",
    "plan_probes",
    "probe_cost_as_run",
    "probe_noise",
    "slice_data_parallel",
    "slice_shape",
]
