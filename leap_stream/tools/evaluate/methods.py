"""Cross-hardware estimators of log(per-device throughput on B ÷ on A), each fitted on the
pairs of other workloads and applied to a held-out workload's pairs (pure: frames in, arrays
out).

Pair frames have `a_type`, `b_type`, `a_vendor`, `b_vendor`, `family`, `d_log_flops` (peak
FLOP/s ratio at the row's precision), `d_log_bw` (memory bandwidth ratio) and, for training,
`log_ratio` (measured).

* `flop_ratio`, `bandwidth_ratio`, `geomean_ratio`: the datasheets alone;
* `median_ratio_others`: the median measured B/A ratio of the other workloads (the lookup
  table's analog; 1 where no other workload ran on both types);
* `model`: leap-stream's transfer estimator for tables, physics as the prior that data
  corrects: a non-negative blend of the FLOP/s and bandwidth ratios fitted on the other
  workloads, plus their median residual shrunk down a hierarchy (vendor pair → type pair →
  family × type pair), so a pair measured often moves far from physics and a pair never
  measured stays on it. Which physics prior (the fitted blend, the bandwidth ratio or the
  geometric mean) and how hard to shrink are chosen by an inner leave-one-workload-out over the
  training workloads (never the held-out one): on a table of few workloads that vary a lot it
  ends near physics, on one of many similar workloads near the measured pairs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np
import pandas as pd

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
BLEND_SAMPLE = 4000  # pairs the blend is fitted on (a two-weight fit needs few)


class Fitted(Protocol):
    def predict(self, pairs: pd.DataFrame) -> np.ndarray: ...


@dataclass(frozen=True)
class _Specs:
    flops: float
    bandwidth: float

    def predict(self, pairs: pd.DataFrame) -> np.ndarray:
        return np.asarray(
            self.flops * pairs["d_log_flops"].to_numpy(np.float64)
            + self.bandwidth * pairs["d_log_bw"].to_numpy(np.float64)
        )


def _table(keys: np.ndarray, values: np.ndarray, shrink: float) -> dict[int, float]:
    """Per key, the median of `values` times n / (n + shrink)."""
    g = pd.Series(values).groupby(keys)
    eff = g.median() * g.size() / (g.size() + shrink)
    return {int(str(k)): float(v) for k, v in eff.items()}


def _look_up(keys: np.ndarray, table: dict[int, float]) -> np.ndarray:
    return np.asarray(pd.Series(keys).map(table).fillna(0.0).to_numpy(np.float64))


@dataclass(frozen=True)
class _MedianOthers:
    table: dict[int, float]

    @classmethod
    def fit(cls, train: pd.DataFrame) -> _MedianOthers:
        keys = train["k_type_pair"].to_numpy(np.int64)
        return cls(_table(keys, train["log_ratio"].to_numpy(np.float64), 0.0))

    def predict(self, pairs: pd.DataFrame) -> np.ndarray:
        return _look_up(pairs["k_type_pair"].to_numpy(np.int64), self.table)


# candidate multipliers of SHRINK for the inner selection (inf: physics only), and candidate
# physics priors besides the blend fitted on the training pairs
SHRINK_SCALES = (0.25, 1.0, 4.0, 16.0, float("inf"))
PRIORS = {"bandwidth": _Specs(0.0, 1.0), "geomean": _Specs(0.5, 0.5)}
INNER_MIN_WORKLOADS = 3


@dataclass(frozen=True)
class _Model:
    """Physics blend + shrunk median residuals (see the module docstring)."""

    physics: _Specs
    levels: tuple[tuple[str, dict[int, float]], ...]
    scale: float

    @classmethod
    def fit(cls, train: pd.DataFrame) -> _Model:
        prior, scale = _inner_choice(train)
        return cls._fit(train, scale, prior)

    @classmethod
    def _fit(cls, train: pd.DataFrame, scale: float, prior: str = "fitted") -> _Model:
        physics = _blend(train) if prior == "fitted" else PRIORS[prior]
        resid = train["log_ratio"].to_numpy(np.float64) - physics.predict(train)
        levels: list[tuple[str, dict[int, float]]] = []
        if not np.isfinite(scale):
            return cls(physics, (), scale)
        for column, k0 in SHRINK:
            keys = train[column].to_numpy(np.int64)
            table = _table(keys, resid, k0 * scale)
            resid = resid - _look_up(keys, table)
            levels.append((column, table))
        return cls(physics, tuple(levels), scale)

    def predict(self, pairs: pd.DataFrame) -> np.ndarray:
        out = self.physics.predict(pairs)
        for column, table in self.levels:
            out = out + _look_up(pairs[column].to_numpy(np.int64), table)
        return np.asarray(out)


def _inner_choice(train: pd.DataFrame) -> tuple[str, float]:
    """The physics prior ("fitted" blend or one of PRIORS) and SHRINK_SCALES entry with the
    least MAPE when each training workload is predicted from the others ("fitted", 1.0 when
    there are too few workloads)."""
    wl = train["workload"].to_numpy(object)
    names = pd.unique(wl)
    choices = [(p, s) for p in ("fitted", *PRIORS) for s in SHRINK_SCALES]
    if len(names) < INNER_MIN_WORKLOADS:
        return "fitted", 1.0
    y = train["log_ratio"].to_numpy(np.float64)
    err = dict.fromkeys(choices, 0.0)
    for w in names:
        test = wl == w
        inner, held = train[~test], train[test]
        for prior, scale in choices:
            pred = _Model._fit(inner, scale, prior).predict(held)
            err[(prior, scale)] += float(np.abs(np.expm1(pred - y[test])).sum())
    return min(choices, key=lambda c: err[c])


def _blend(train: pd.DataFrame) -> _Specs:
    """Weights in [0, 1] of the two spec ratios (no intercept: the same type has ratio 1) with
    the least MAPE on the training pairs; the bandwidth ratio alone without enough pairs."""
    X = train[["d_log_flops", "d_log_bw"]].to_numpy(np.float64)
    y = train["log_ratio"].to_numpy(np.float64)
    ok = np.flatnonzero(np.isfinite(X).all(axis=1) & np.isfinite(y))
    if len(ok) < 4:
        return _Specs(0.0, 1.0)
    if len(ok) > BLEND_SAMPLE:  # evenly spaced: deterministic, and spread over workloads
        ok = ok[np.linspace(0, len(ok) - 1, BLEND_SAMPLE).astype(np.int64)]
    # a two-weight grid is exact enough and cannot go negative or explode on collinear specs
    wf, wb = np.meshgrid(BLEND_GRID, BLEND_GRID, indexing="ij")
    w = np.stack([wf.ravel(), wb.ravel()])  # (2, grid)
    err = np.mean(np.abs(np.expm1(X[ok] @ w - y[ok, None])), axis=0)
    best = int(np.argmin(err))
    return _Specs(float(w[0, best]), float(w[1, best]))


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
