"""Cross-hardware estimators of log(per-device throughput on B ÷ on A), each fitted on the
pairs of other workloads and applied to a held-out workload's pairs (pure: frames in, arrays
out).

Pair frames have `workload`, `a`, `a_type`, `b_type`, `a_vendor`, `b_vendor`, `family`,
`d_log_flops` (peak FLOP/s ratio at the row's precision), `d_log_bw` (memory bandwidth ratio),
`log_count_ratio` (B's devices ÷ A's) and, for training, `log_ratio` (measured).

* `flop_ratio`, `bandwidth_ratio`, `geomean_ratio`: the datasheets alone;
* `median_ratio_others`: the median measured B/A ratio of the other workloads (the lookup
  table's analog; 1 where no other workload ran on both types);
* `model`: leap-stream's transfer estimator for tables, physics as the prior that data
  corrects: a non-negative blend of the FLOP/s and bandwidth ratios and a device-count
  exponent (per-device throughput falls as one job runs on more devices) fitted on the other
  workloads, plus their median residual shrunk down a hierarchy (vendor pair → type pair →
  family × type pair), so a pair measured often moves far from physics and a pair never
  measured stays on it. Which physics prior (the fitted blend, the bandwidth ratio or the
  geometric mean, each with or without the exponent) and how hard to shrink are chosen by an
  inner leave-one-workload-out over the training workloads (never the held-out one), on MAPE
  and order accuracy together: on a table of few workloads that vary a lot it ends near
  physics, on one of many similar workloads near the measured pairs. The same inner pass sets
  how far below the median the estimate sits (`SHIFTS`): the MAPE-optimal point.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import pandas as pd

from leap_stream.tools.evaluate.metrics import OrderPairs, ape

METHODS = ("model", "flop_ratio", "bandwidth_ratio", "geomean_ratio", "median_ratio_others")
# pseudo-pairs at zero residual per level: a level seen k times moves half-way to its median
SHRINK: tuple[tuple[str, float], ...] = (
    ("k_vendor_pair", 4.0),
    ("k_type_pair", 2.0),
    ("k_family_type_pair", 2.0),
)
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


@dataclass(frozen=True)
class _Specs:
    flops: float
    bandwidth: float
    scaling: float = 0.0  # per-device throughput ∝ devices^scaling (≤ 0: scaling costs)

    def predict(self, pairs: pd.DataFrame) -> np.ndarray:
        return np.asarray(
            self.flops * pairs["d_log_flops"].to_numpy(np.float64)
            + self.bandwidth * pairs["d_log_bw"].to_numpy(np.float64)
            + self.scaling * pairs["log_count_ratio"].to_numpy(np.float64)
        )


@dataclass(frozen=True)
class _Table:
    """Per integer key, an effect; keys never seen look up 0."""

    keys: np.ndarray  # sorted, unique
    effects: np.ndarray

    @classmethod
    def of(cls, keys: np.ndarray, values: np.ndarray, shrink: float) -> _Table:
        """Per key, the median of its finite `values` times n / (n + shrink)."""
        ok = np.isfinite(values)
        k, v = keys[ok], values[ok]
        order = np.lexsort((v, k))
        k, v = k[order], v[order]
        uniq, start, n = np.unique(k, return_index=True, return_counts=True)
        median = 0.5 * (v[start + (n - 1) // 2] + v[start + n // 2])
        return cls(uniq, median * n / (n + shrink))

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
        keys = train["k_type_pair"].to_numpy(np.int64)
        return cls(_Table.of(keys, train["log_ratio"].to_numpy(np.float64), 0.0))

    def predict(self, pairs: pd.DataFrame) -> np.ndarray:
        return self.table.look_up(pairs["k_type_pair"].to_numpy(np.int64))


# candidate multipliers of SHRINK for the inner selection (inf: physics only), and candidate
# physics priors besides the blend fitted on the training pairs
SHRINK_SCALES = (0.25, 1.0, 4.0, 16.0, float("inf"))
PRIORS = {"bandwidth": _Specs(0.0, 1.0), "geomean": _Specs(0.5, 0.5)}
INNER_MIN_WORKLOADS = 3
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
        train: pd.DataFrame,
        physics: _Specs,
        scale: float,
        shift: float = 0.0,
        prior: str = "fitted",
    ) -> _Model:
        """The residual levels of `train` around `physics`, shrunk by SHRINK × `scale`."""
        resid = train["log_ratio"].to_numpy(np.float64) - physics.predict(train)
        levels: list[tuple[str, _Table]] = []
        if np.isfinite(scale):
            for column, k0 in SHRINK:
                keys = train[column].to_numpy(np.int64)
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

    def predict(self, pairs: pd.DataFrame) -> np.ndarray:
        out = self.physics.predict(pairs) + self.shift
        for column, table in self.levels:
            out = out + table.look_up(pairs[column].to_numpy(np.int64))
        return np.asarray(out)


def _inner_choice(train: pd.DataFrame) -> tuple[str, float, float]:
    """(physics prior of PRIOR_NAMES, SHRINK_SCALES entry, SHIFTS entry), chosen by predicting
    each training workload from the others: the (prior, scale) best on MAPE and order accuracy
    together (least sum of its two ranks among the choices, MAPE breaking ties), then the
    shift with the least MAPE for it (order does not depend on a shift). ("fitted", 1.0, 0.0)
    when there are too few workloads."""
    wl = train["workload"].to_numpy(object)
    names = pd.unique(wl)
    if len(names) < INNER_MIN_WORKLOADS:
        return "fitted", 1.0, 0.0
    choices = [(p, s) for p in PRIOR_NAMES for s in SHRINK_SCALES]
    y = train["log_ratio"].to_numpy(np.float64)
    err = {c: np.zeros(len(SHIFTS)) for c in choices}  # summed APE at each shift
    right = dict.fromkeys(choices, 0.0)  # (A; B, C) comparisons ordered right
    for w in names:
        test = wl == w
        inner, held = train[~test], train[test]
        comparisons = OrderPairs.of_frame(held)
        for prior in PRIOR_NAMES:
            physics = _physics(inner, prior)
            for scale in SHRINK_SCALES:
                pred = _Model.on(inner, physics, scale).predict(held)
                err[(prior, scale)] += ape(pred[:, None] + SHIFTS, y[test][:, None]).sum(axis=0)
                right[(prior, scale)] += comparisons.right(pred)
    by_mape = sorted(choices, key=lambda c: err[c][0])
    by_order = sorted(choices, key=lambda c: -right[c])
    prior, scale = min(choices, key=lambda c: (by_mape.index(c) + by_order.index(c), err[c][0]))
    return prior, scale, float(SHIFTS[int(np.argmin(err[(prior, scale)]))])


def _fit_weights(train: pd.DataFrame, grids: tuple[np.ndarray, ...]) -> _Specs | None:
    """The (FLOP/s, bandwidth, device count) weights from `grids` (one grid per column) with
    the least MAPE on the training pairs; None without enough pairs. No intercept: the same
    type at the same count has ratio 1."""
    X = train[list(SPEC_COLUMNS)].to_numpy(np.float64)
    y = train["log_ratio"].to_numpy(np.float64)
    ok = np.flatnonzero(np.isfinite(X).all(axis=1) & np.isfinite(y))
    if len(ok) < 4:
        return None
    if len(ok) > BLEND_SAMPLE:  # evenly spaced: deterministic, and spread over workloads
        ok = ok[np.linspace(0, len(ok) - 1, BLEND_SAMPLE).astype(np.int64)]
    # a small grid is exact enough and cannot go negative or explode on collinear specs;
    # the first of equally good weights wins (a grid lists 0 scaling first)
    w = np.stack([g.ravel() for g in np.meshgrid(*grids, indexing="ij")])  # (3, grid)
    err = ape(X[ok] @ w, y[ok, None]).mean(axis=0)
    best = w[:, int(np.argmin(err))]
    return _Specs(float(best[0]), float(best[1]), float(best[2]))


def _blend(train: pd.DataFrame, scaling: np.ndarray = SCALING_GRID) -> _Specs:
    """Weights in [0, 1] of the two spec ratios and the device-count exponent from `scaling`
    fitted on the training pairs; the bandwidth ratio alone without enough pairs."""
    return _fit_weights(train, (BLEND_GRID, BLEND_GRID, scaling)) or _Specs(0.0, 1.0)


def _physics(train: pd.DataFrame, prior: str) -> _Specs:
    """The physics prior named in PRIOR_NAMES, its free weights fitted on `train`."""
    if prior == "fitted":
        return _blend(train)
    if prior == "fitted_unscaled":
        return _blend(train, np.zeros(1))
    if prior.endswith("_unscaled"):
        return PRIORS[prior.removesuffix("_unscaled")]
    return _scaled(train, PRIORS[prior])


def _scaled(train: pd.DataFrame, prior: _Specs) -> _Specs:
    """A fixed spec prior with the device-count exponent fitted on the training pairs."""
    grids = (np.array([prior.flops]), np.array([prior.bandwidth]), SCALING_GRID)
    return _fit_weights(train, grids) or prior


def describe(fitted: Fitted) -> dict[str, Any] | None:
    """The inner choices of a fitted `model` (None for the other methods: nothing chosen)."""
    return fitted.describe() if isinstance(fitted, _Model) else None


def fit(method: str, train: pd.DataFrame) -> Fitted:
    """The named method fitted on `train` pairs (the other workloads)."""
    if method == "model":
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
