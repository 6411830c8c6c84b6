"""Cross-hardware estimators of log(per-device throughput on B ÷ on A), each fitted on the
pairs of other workloads and applied to a held-out workload's pairs (pure: frames in, arrays
out).

Pair frames have `workload`, `a`, `a_type`, `b_type`, `a_vendor`, `b_vendor`, `family`,
`d_log_flops` (peak FLOP/s ratio at the row's precision), `d_log_bw` (memory bandwidth ratio),
`log_count_ratio` (B's devices ÷ A's) and, for training, `log_ratio` (measured).

* `flop_ratio`, `bandwidth_ratio`, `geomean_ratio`: the datasheets alone;
* `median_ratio_others`: the median measured B/A ratio of the other workloads (the lookup
  table's analog; 1 where no other workload ran on both types);
* `table_estimator`: a transfer estimator for tables alone (the production model's target to
  beat on real tables; `model` is the production model, `production.py`), physics as the
  prior that data corrects: a non-negative blend of the FLOP/s and bandwidth ratios and a device-count
  exponent (per-device throughput falls as one job runs on more devices) fitted on the other
  workloads, plus their median residual shrunk down a hierarchy (vendor pair → type pair →
  family × type pair), so a pair measured often moves far from physics and a pair never
  measured stays on it. Which physics prior (the fitted blend, the bandwidth ratio or the
  geometric mean, each with or without the exponent) and how hard to shrink are chosen by an
  inner cross-validation over the training workloads (never the held-out one; one workload
  a fold up to INNER_FOLDS of them, then that many folds), on MAPE and order accuracy
  together: on a table of few workloads that vary a lot it ends near physics, on one of many
  similar workloads near the measured pairs. The same inner pass sets how far below the
  median the estimate sits (`SHIFTS`): the MAPE-optimal point.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import pandas as pd

from leap_stream.core.predictor.type_pairs import LEVELS, shrunk_medians
from leap_stream.tools.evaluate.metrics import OrderPairs, ape

METHODS = (
    "table_estimator",
    "flop_ratio",
    "bandwidth_ratio",
    "geomean_ratio",
    "median_ratio_others",
)
# pseudo-pairs at zero residual per level: the production model's type-pair levels
SHRINK: tuple[tuple[str, float], ...] = tuple((f"k_{name}", k) for name, k in LEVELS)
# the integer key columns of a pair frame and what they combine (protocol.pairs builds them)
KEYS: dict[str, tuple[str, ...]] = {
    "k_vendor_pair": ("a_vendor", "b_vendor"),
    "k_type_pair": ("a_type", "b_type"),
    "k_family_type_pair": ("family", "a_type", "b_type"),
}
BLEND_GRID = np.linspace(0.0, 1.0, 11)
# per-device throughput ∝ devices^e: a larger system of one job runs each device less busy
# (communication, a smaller batch per device); 0 first, so a table of one size stays at 0
SCALING_GRID = np.linspace(0.0, -1.0, 11)
SPEC_COLUMNS = ("d_log_flops", "d_log_bw", "log_count_ratio")
BLEND_SAMPLE = 4000  # pairs the blend is fitted on (a three-weight fit needs few)


class Fitted(Protocol):
    def predict(self, pairs: pd.DataFrame) -> np.ndarray: ...


# a pair frame, or its columns as arrays (the inner selection slices arrays, not frames)
Pairs = pd.DataFrame | Mapping[str, np.ndarray]
# the columns an estimator reads (protocol.pairs builds them)
USED_COLUMNS = ("workload", "a", "b_type", "log_ratio", *SPEC_COLUMNS, *KEYS)


def _col(pairs: Pairs, name: str, dtype: Any) -> np.ndarray:
    return np.asarray(pairs[name], dtype)


@dataclass(frozen=True)
class _Specs:
    flops: float
    bandwidth: float
    scaling: float = 0.0  # per-device throughput ∝ devices^scaling (≤ 0: scaling costs)

    def predict(self, pairs: Pairs) -> np.ndarray:
        return np.asarray(
            self.flops * _col(pairs, "d_log_flops", np.float64)
            + self.bandwidth * _col(pairs, "d_log_bw", np.float64)
            + self.scaling * _col(pairs, "log_count_ratio", np.float64)
        )


@dataclass(frozen=True)
class _Table:
    """Per integer key, an effect; keys never seen look up 0."""

    keys: np.ndarray  # sorted, unique
    effects: np.ndarray

    @classmethod
    def of(cls, keys: np.ndarray, values: np.ndarray, shrink: float) -> _Table:
        """Per key, the median of its finite `values` times n / (n + shrink)."""
        return cls(*shrunk_medians(keys, values, shrink))

    def look_up(self, keys: np.ndarray) -> np.ndarray:
        if not len(self.keys):
            return np.zeros(len(keys))
        i = np.minimum(np.searchsorted(self.keys, keys), len(self.keys) - 1)
        return np.where(self.keys[i] == keys, self.effects[i], 0.0)


@dataclass(frozen=True)
class _MedianOthers:
    table: _Table

    @classmethod
    def fit(cls, train: pd.DataFrame) -> _MedianOthers:
        keys = _col(train, "k_type_pair", np.int64)
        return cls(_Table.of(keys, _col(train, "log_ratio", np.float64), 0.0))

    def predict(self, pairs: pd.DataFrame) -> np.ndarray:
        return self.table.look_up(_col(pairs, "k_type_pair", np.int64))


# candidate multipliers of SHRINK for the inner selection (inf: physics only), and candidate
# physics priors besides the blend fitted on the training pairs
SHRINK_SCALES = (0.25, 1.0, 4.0, 16.0, float("inf"))
PRIORS = {"bandwidth": _Specs(0.0, 1.0), "geomean": _Specs(0.5, 0.5)}
INNER_MIN_WORKLOADS = 3
# the inner selection predicts at most this many folds of the training workloads (round robin
# in order of appearance); with fewer workloads each fold is one workload (leave one out).
# Bounded, so a table of W workloads costs W × INNER_FOLDS fits, not W².
INNER_FOLDS = 8
# log shifts of the point estimate: APE punishes an over-prediction without bound and an
# under-prediction at most 100 %, so the estimate with the least MAPE sits below the median
# ratio, the more the more uncertain; 0 first, so ties keep the median
SHIFTS = np.array([0.0, -0.05, -0.1, -0.15, -0.2, -0.3])
PRIOR_NAMES = ("fitted", *PRIORS, "fitted_unscaled", *(f"{p}_unscaled" for p in PRIORS))


@dataclass(frozen=True)
class _Model:
    """Physics prior + shrunk median residuals + the MAPE shift (see the module docstring)."""

    physics: _Specs
    levels: tuple[tuple[str, _Table], ...]
    shift: float = 0.0
    prior: str = "fitted"  # what the inner pass chose, for `describe`
    scale: float = 1.0

    @classmethod
    def fit(cls, train: pd.DataFrame) -> _Model:
        prior, scale, shift = _inner_choice(train)
        return cls.on(train, _physics(train, prior), scale, shift, prior)

    @classmethod
    def on(
        cls,
        train: Pairs,
        physics: _Specs,
        scale: float,
        shift: float = 0.0,
        prior: str = "fitted",
    ) -> _Model:
        """The residual levels of `train` around `physics`, shrunk by SHRINK × `scale`."""
        resid = _col(train, "log_ratio", np.float64) - physics.predict(train)
        levels: list[tuple[str, _Table]] = []
        if np.isfinite(scale):
            for column, k0 in SHRINK:
                keys = _col(train, column, np.int64)
                table = _Table.of(keys, resid, k0 * scale)
                resid = resid - table.look_up(keys)
                levels.append((column, table))
        return cls(physics, tuple(levels), shift, prior, scale)

    def describe(self) -> dict[str, Any]:
        """What the inner pass chose, as `evaluate --json` reports it (`shrinkage` None: the
        physics prior alone)."""
        return {
            "prior": self.prior,
            "flops_weight": round(self.physics.flops, 3),
            "bandwidth_weight": round(self.physics.bandwidth, 3),
            "device_exponent": round(self.physics.scaling, 3),
            "shrinkage": self.scale if np.isfinite(self.scale) else None,
            "shift": round(self.shift, 3),
        }

    def predict(self, pairs: Pairs) -> np.ndarray:
        out = self.physics.predict(pairs) + self.shift
        for column, table in self.levels:
            out = out + table.look_up(_col(pairs, column, np.int64))
        return np.asarray(out)


def _inner_choice(train: pd.DataFrame) -> tuple[str, float, float]:
    """(physics prior of PRIOR_NAMES, SHRINK_SCALES entry, SHIFTS entry), chosen by predicting
    each fold of the training workloads (INNER_FOLDS) from the others: the (prior, scale) best
    on MAPE and order accuracy together (least sum of its two ranks among the choices, MAPE
    breaking ties), then the shift with the least MAPE for it (order does not depend on a
    shift). ("fitted", 1.0, 0.0) when there are too few workloads."""
    codes, names = pd.factorize(_col(train, "workload", object))
    if len(names) < INNER_MIN_WORKLOADS:
        return "fitted", 1.0, 0.0
    folds = codes % INNER_FOLDS
    choices = [(p, s) for p in PRIOR_NAMES for s in SHRINK_SCALES]
    y = _col(train, "log_ratio", np.float64)
    err = {c: np.zeros(len(SHIFTS)) for c in choices}  # summed APE at each shift
    right = dict.fromkeys(choices, 0.0)  # (A; B, C) comparisons ordered right
    grids = {prior: _GridErrors.of(train, prior) for prior in PRIOR_NAMES}
    columns = {c: train[c].to_numpy() for c in USED_COLUMNS}
    for fold in range(min(len(names), INNER_FOLDS)):
        test = folds == fold
        inner = {c: v[~test] for c, v in columns.items()}
        held = {c: v[test] for c, v in columns.items()}
        comparisons = OrderPairs.of(held["a"], held["log_ratio"], held["b_type"])
        for prior in PRIOR_NAMES:
            physics = grids[prior].best(~test)
            for scale in SHRINK_SCALES:
                pred = _Model.on(inner, physics, scale).predict(held)
                err[(prior, scale)] += ape(pred[:, None] + SHIFTS, y[test][:, None]).sum(axis=0)
                right[(prior, scale)] += comparisons.right(pred)
    by_mape = sorted(choices, key=lambda c: err[c][0])
    by_order = sorted(choices, key=lambda c: -right[c])
    prior, scale = min(choices, key=lambda c: (by_mape.index(c) + by_order.index(c), err[c][0]))
    return prior, scale, float(SHIFTS[int(np.argmin(err[(prior, scale)]))])


@dataclass(frozen=True)
class _GridErrors:
    """The APE of every weight vector of a grid on an evenly spaced sample of pairs, so that
    the best weights on any subset of those pairs (an inner fold's training set) cost a sum,
    not a refit. `fallback`: the prior's weights without enough pairs."""

    rows: np.ndarray  # sampled pair indices
    weights: np.ndarray  # (3, grid)
    errors: np.ndarray  # (sample, grid)
    fallback: _Specs

    @classmethod
    def of(cls, train: pd.DataFrame, prior: str) -> _GridErrors:
        grids, fallback = _grids(prior)
        X = np.stack([_col(train, c, np.float64) for c in SPEC_COLUMNS], axis=1)
        y = _col(train, "log_ratio", np.float64)
        ok = np.flatnonzero(np.isfinite(X).all(axis=1) & np.isfinite(y))
        if len(ok) > BLEND_SAMPLE:  # evenly spaced: deterministic, and spread over workloads
            ok = ok[np.linspace(0, len(ok) - 1, BLEND_SAMPLE).astype(np.int64)]
        # a small grid is exact enough and cannot go negative or explode on collinear specs
        w = np.stack([g.ravel() for g in np.meshgrid(*grids, indexing="ij")])  # (3, grid)
        return cls(ok, w, ape(X[ok] @ w, y[ok, None]), fallback)

    def best(self, use: np.ndarray | None = None) -> _Specs:
        """The weights with the least MAPE on the sampled pairs where `use` (a mask over the
        training pairs) holds; the first of equally good ones wins (a grid lists 0 scaling
        first). The fallback with fewer than 4 pairs. No intercept: the same type at the
        same count has ratio 1."""
        pick = np.ones(len(self.rows), bool) if use is None else use[self.rows]
        if pick.sum() < 4:
            return self.fallback
        best = self.weights[:, int(np.argmin(pick.astype(np.float64) @ self.errors))]
        return _Specs(float(best[0]), float(best[1]), float(best[2]))


def _grids(prior: str) -> tuple[tuple[np.ndarray, ...], _Specs]:
    """The weight grids of the physics prior named in PRIOR_NAMES (FLOP/s, bandwidth, device
    count) and its weights without enough pairs: the fitted blend has weights in [0, 1] of the
    two spec ratios, a fixed prior only the device-count exponent (none when unscaled)."""
    scaling = np.zeros(1) if prior.endswith("_unscaled") else SCALING_GRID
    name = prior.removesuffix("_unscaled")
    if name == "fitted":
        return (BLEND_GRID, BLEND_GRID, scaling), _Specs(0.0, 1.0)
    fixed = PRIORS[name]
    return (np.array([fixed.flops]), np.array([fixed.bandwidth]), scaling), fixed


def _physics(train: pd.DataFrame, prior: str) -> _Specs:
    """The physics prior named in PRIOR_NAMES, its free weights fitted on `train`."""
    return _GridErrors.of(train, prior).best()


def describe(fitted: Fitted) -> dict[str, Any] | None:
    """The inner choices of a fitted `table_estimator` (None for the other methods: nothing chosen)."""
    return fitted.describe() if isinstance(fitted, _Model) else None


def fit(method: str, train: pd.DataFrame) -> Fitted:
    """The named method fitted on `train` pairs (the other workloads)."""
    if method == "table_estimator":
        return _Model.fit(train)
    if method == "median_ratio_others":
        return _MedianOthers.fit(train)
    if method == "flop_ratio":
        return _Specs(1.0, 0.0)
    if method == "bandwidth_ratio":
        return _Specs(0.0, 1.0)
    if method == "geomean_ratio":
        return _Specs(0.5, 0.5)
    raise ValueError(f"unknown method {method!r}; known: {', '.join(METHODS)}")
