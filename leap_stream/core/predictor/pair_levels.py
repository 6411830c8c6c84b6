"""(model type × hardware) levels over the learned roofline with each lineage's own level
apart, and the move across hardware they give a prior.

A training row's residual over the roofline is r = a(model type, type) + u(lineage) +
v(lineage, vendor) + noise. The levels a are fitted by backfitting shrunk means (each term in
turn the mean of what the other two leave, with `LEVEL_SHRINK` pseudo-rows at zero), so a
pair's level is not the level of the few lineages that happened to run on it. A lineage's
prior on type B moves to the candidate A by the roofline's ratio plus a(A) − a(B): its own u
cancels, and v does within a vendor.

That move is as good as the lineages behind the two levels: its error shrinks about as
1/√k with k, the fewer distinct lineages of the two pairs. So a transfer estimate moves from
the model's own move toward it by w = k / (k + `BLEND_LINEAGES`); where either pair has no
training row, or the prior was measured on another device count (the levels know nothing of
it), w = 0 (decision 0018).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

LEVEL_SHRINK = 3.0  # pseudo-rows at 0 for a pair's, a lineage's and a lineage-vendor's level
ITERATIONS = 8  # backfitting passes: the levels move by < 0.001 log after ~5 on a fleet
BLEND_LINEAGES = 3.0  # the lineages at which the levels' move gets half the weight


def fit_pair_levels(
    frame: pd.DataFrame, lineage_ids: Any, residual: np.ndarray, rows: np.ndarray
) -> dict[str, list[float]]:
    """Per "model type|hardware type" of the training ``rows`` (a mask of ``frame``'s): [its
    level, its distinct lineages]. ``residual``: log per-device samples/s less the roofline's."""
    mt, mts = _factorize(frame["model_type"].to_numpy(object)[rows])
    hw, hws = _factorize(frame["hardware_type"].to_numpy(object)[rows])
    lineage, n_lineages = _factorize(np.asarray(lineage_ids, object)[rows])
    ven, vens = _factorize(frame["vendor"].to_numpy(object)[rows])
    pair, pairs = pd.factorize(mt * len(hws) + hw)
    lv, lvs = pd.factorize(lineage * len(vens) + ven)
    r = np.asarray(residual, np.float64)[rows]
    a, u, v = np.zeros(len(pairs)), np.zeros(len(n_lineages)), np.zeros(len(lvs))
    for _ in range(ITERATIONS):
        a = _shrunk_mean(pair, r - u[lineage] - v[lv], len(pairs))
        u = _shrunk_mean(lineage, r - a[pair] - v[lv], len(n_lineages))
        v = _shrunk_mean(lv, r - a[pair] - u[lineage], len(lvs))
    seen = pd.unique(pair * len(n_lineages) + lineage)  # each (pair, lineage) once
    k = np.bincount(seen // len(n_lineages), minlength=len(pairs))
    names = [f"{mts[p // len(hws)]}|{hws[p % len(hws)]}" for p in pairs.tolist()]
    return {
        name: [round(float(level), 6), int(n)] for name, level, n in zip(names, a, k, strict=True)
    }


def _factorize(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(codes, the distinct values as str): hashed, not sorted (a year's ids sort in seconds)."""
    codes, uniques = pd.factorize(np.asarray(values, dtype=object), use_na_sentinel=False)
    return codes.astype(np.int64), np.asarray([str(u) for u in uniques], object)


def _shrunk_mean(code: np.ndarray, x: np.ndarray, n: int) -> np.ndarray:
    return np.bincount(code, x, n) / (np.bincount(code, minlength=n) + LEVEL_SHRINK)


def blended_move(
    model_move: np.ndarray,
    roofline_move: np.ndarray,
    level: np.ndarray,
    lineages: np.ndarray,
    same_devices: np.ndarray,
) -> np.ndarray:
    """Per transfer row, its move: the model's, moved toward the roofline's plus the levels'
    difference (``level``: a(A) − a(B)) by the weight of ``lineages`` (the fewer of the two
    pairs'; 0 for an unseen pair) where the prior had the job's device count."""
    w = np.where(same_devices, lineages / (lineages + BLEND_LINEAGES), 0.0)
    return np.asarray(model_move + w * (roofline_move + level - model_move))
