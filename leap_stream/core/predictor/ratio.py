"""The ratio model's inputs: its feature list, the pairs it fits (each also reversed) and its
input matrix."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd

from leap_stream.core import features as F
from leap_stream.core.columns import (
    Frame,
    category_codes,
    codes_of,
    f64,
)
from leap_stream.core.predictor.params import (
    BOOSTER_RATIO,
    PRIOR_RESIDUAL,
    RATIO_DIFFS,
    RATIO_MIN_CONFIGURED,
    RATIO_MIN_MODEL_TYPES,
    RATIO_MIN_ROWS,
)


def ratio_features(booster_features: Sequence[str]) -> list[str]:
    """The ratio model's inputs: the job's configuration, both types' hardware inputs, their
    differences, the prior's count and age, how far the prior is from the main booster's
    f(job, B), and the main booster's own ratio."""
    job = [c for c in booster_features if c not in F.HW_COLUMNS]
    hw = [c for c in booster_features if c in F.HW_COLUMNS]
    diffs = [c for c in RATIO_DIFFS if c in hw]
    return [
        *job,
        *hw,
        *("o_" + c for c in hw),
        *("d_" + c for c in diffs),
        "other_count",
        "other_age_days",
        "other_log_dev_ratio",
        PRIOR_RESIDUAL,
        BOOSTER_RATIO,
    ]


def _at_most(rows: np.ndarray, cap: int, seed: int) -> np.ndarray:
    """`rows` (indices), or a seeded uniform sample of `cap` of them, in order, when more."""
    if len(rows) <= cap:
        return rows
    rng = np.random.default_rng(seed)
    return np.sort(rng.choice(rows, cap, replace=False))


def _reversed_pairs(
    X: np.ndarray, names: Sequence[str], own_residual: np.ndarray, out: np.ndarray | None = None
) -> np.ndarray:
    """Ratio-model rows seen from the other side: the candidate's and the prior's hardware
    inputs swapped, their differences and the main booster's ratio negated, and the prior's
    residual replaced by the candidate's (`own_residual`: the measured rate there less
    f(job, candidate)). The job's inputs and the prior's count and age stay (the same two
    measurements). Into `out` when given (no copy of `X` besides)."""
    col = {c: i for i, c in enumerate(names)}
    perm = np.arange(len(names))
    sign = np.ones(len(names), X.dtype)
    for c, i in col.items():
        if c.startswith("o_"):
            perm[i], perm[col[c[2:]]] = col[c[2:]], i
        elif c.startswith("d_") or c == BOOSTER_RATIO:
            sign[i] = -1
    out = np.take(X, perm, axis=1, out=out)
    out *= sign
    if PRIOR_RESIDUAL in col:
        out[:, col[PRIOR_RESIDUAL]] = own_residual
    return out


def _level_name(feature: str) -> str:
    """The category levels a ratio-model input takes (its prior-hardware twin shares them)."""
    return feature[2:] if feature.startswith("o_") else feature


def _derived(
    blind: np.ndarray, prior_f: np.ndarray, other_lpd: np.ndarray
) -> dict[str, np.ndarray]:
    """The ratio model's inputs computed from the main booster, per row with a prior on B:
    f(job, candidate) − f(job, B) and prior_B − f(job, B)."""
    return {BOOSTER_RATIO: blind - prior_f, PRIOR_RESIDUAL: other_lpd - prior_f}


def _ratio_matrix(
    frame: Frame,
    names: Sequence[str],
    derived: Mapping[str, np.ndarray],
    levels: dict[str, list[str]],
    luts: dict[str, dict[str, int]],
    rows: np.ndarray | None = None,
    dtype: type[np.floating[Any]] = np.float64,
) -> np.ndarray:
    """The ratio model's input for `rows` of `frame` (all when None) as one float matrix;
    `derived` holds the inputs computed from the main booster (`_derived`), one per row."""
    idx = np.arange(len(frame)) if rows is None else rows
    X = np.empty((len(idx), len(names)), dtype)
    col = {c: i for i, c in enumerate(names)}
    for i, c in enumerate(names):
        if c in derived:
            X[:, i] = derived[c]
        elif c.startswith("d_"):  # both sides are earlier columns (`ratio_features` order)
            X[:, i] = X[:, col[c[2:]]] - X[:, col["o_" + c[2:]]]
        elif _level_name(c) in levels:
            lut = luts[_level_name(c)]
            whole = category_codes(frame, c, lut)
            codes = (
                whole[idx]
                if whole is not None
                else codes_of(np.asarray(frame[c], object)[idx], lut)
            )
            X[:, i] = np.where(codes >= 0, codes, np.nan)
        else:
            X[:, i] = f64(frame, c)[idx]
    return X


def _trees_can_learn(pairs: pd.DataFrame, train: np.ndarray, n_train: int) -> bool:
    """Whether the ratio model's trees can learn how a move depends on the job, for a model
    type they never saw: `RATIO_MIN_ROWS` training pairs or more, of `RATIO_MIN_MODEL_TYPES`
    model types or more, at least `RATIO_MIN_CONFIGURED` of them with the job's work per
    sample known (without it a new model type's inputs are its hardware alone, which the
    type-pair effects learn better; decision 0012)."""
    model_types = len(pd.unique(pairs["model_type"].to_numpy(object)[train]))
    work = np.isfinite(pairs["log_flops_per_sample"].to_numpy(np.float64)[train])
    return (
        n_train >= RATIO_MIN_ROWS
        and model_types >= RATIO_MIN_MODEL_TYPES
        and bool(work.mean() >= RATIO_MIN_CONFIGURED)
    )
