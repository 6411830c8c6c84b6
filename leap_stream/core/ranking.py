"""Turning per-candidate predictions into the hardware-ranking event (pure, no I/O)."""

from __future__ import annotations

import hashlib
from typing import Literal

import numpy as np

SCHEMA_VERSION: Literal[1] = 1
# source codes of a scored row
SRC_MODEL, SRC_LOOKUP, SRC_NONE = 0, 1, 2
_ID_PREFIX = "rank:"
_ID_MAX = 128


def ranking_event_id(submission_event_id: str) -> str:
    """Deterministic, so a repeat ranking of the same submission is recognisable downstream."""
    eid = _ID_PREFIX + submission_event_id
    if len(eid) <= _ID_MAX:
        return eid
    return _ID_PREFIX + hashlib.sha256(submission_event_id.encode()).hexdigest()


def throughput_per_cost(
    samples_per_s: np.ndarray, cost_per_device_hour: np.ndarray, num_devices: np.ndarray
) -> np.ndarray:
    """Samples per USD: samples/s × 3600 / (price per device-hour × devices)."""
    return np.asarray(
        np.asarray(samples_per_s, np.float64)
        * 3600.0
        / (np.asarray(cost_per_device_hour, np.float64) * np.asarray(num_devices, np.float64))
    )


def rank_order(job: np.ndarray, score: np.ndarray, first: np.ndarray | None = None) -> np.ndarray:
    """Row order grouping by job, best score first within a job (ties: input order); with
    ``first``, those rows of a job before its others."""
    keys = [np.arange(len(job)), -np.asarray(score, np.float64), job]
    if first is not None:
        keys.insert(2, ~np.asarray(first, bool))
    return np.lexsort(keys)


def best_per_job(job: np.ndarray, score: np.ndarray, n_jobs: int) -> np.ndarray:
    """Per job the row with the best finite score (ties: the first row), -1 where it has none;
    ``job`` sorted or not."""
    job = np.asarray(job, np.int64)
    score = np.asarray(score, np.float64)
    out = np.full(n_jobs, -1, np.int64)
    rows = np.flatnonzero(np.isfinite(score))
    if not len(rows):
        return out
    order = rows[rank_order(job[rows], score[rows])]
    first = np.ones(len(order), bool)
    first[1:] = job[order][1:] != job[order][:-1]
    out[job[order][first]] = order[first]
    return out


def within_noise_of_best(
    job: np.ndarray, tpc: np.ndarray, tpc_high: np.ndarray, usable: np.ndarray, n_jobs: int
) -> np.ndarray:
    """Rows that could be their job's best: usable, and the top of their interval (as
    throughput per cost) reaches the best point prediction among the job's usable rows.

    Why this rule: top-1 is where the model is weakest on types a job never ran on, and a
    scheduler that knows which candidates are indistinguishable from the first can choose
    among them by what it knows (free capacity, queue wait). Measured on the backtest
    (docs/decisions/0005), the set is small and holds
    the measured best far more often than the first place alone. The best row is in its set
    even without an interval (a lookup's prediction); any other row needs one, and a NaN
    keeps a row out.
    """
    job = np.asarray(job, np.int64)
    tpc = np.asarray(tpc, np.float64)
    usable = np.asarray(usable, bool) & ~np.isnan(tpc)
    best = np.full(n_jobs, -np.inf)
    np.maximum.at(best, job[usable], tpc[usable])
    return usable & ((np.asarray(tpc_high, np.float64) >= best[job]) | (tpc == best[job]))
