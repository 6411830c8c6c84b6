"""Prediction intervals of the throughput model: one normalised, Mondrian split-conformal
calibration (docs/decisions/0011). A scale σ(x) is fitted to the held-out residuals' size from
what makes a residual larger (the anchor kind, how far a transfer moves its prior, a vendor
crossing, a rare (model type × type) pair, an own prior from another device count, a type with
few rows, each type's and each family's offset, each family's shift of the move terms:
docs/decisions/0019); the interval is the prediction plus σ(x) times the conformal quantiles of
residual/σ in the row's bin (anchor kind × whether the type had held-out rows of its own). Pure functions over held-out residuals;
`ThroughputModel` calibrates with them at fit (its metadata's `calibration`) and applies them
when it predicts. The widening of a job outside the training support is a rule of its own
(`ThroughputModel.support_excess`), outside the calibration.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypedDict

import numpy as np
import pandas as pd

from leap_stream.core import features as F
from leap_stream.core.columns import Frame, codes_of, f64

INTERVAL_LEVEL = 0.8
QLO, QHI = (1 - INTERVAL_LEVEL) / 2, 1 - (1 - INTERVAL_LEVEL) / 2
MIN_BUCKET_ROWS = 30
# Held-out rows a hardware type needs for an offset of its own; a type with fewer (a new one, a
# rare one) is calibrated in the "few" bins, on the rows of the types a refit left out, and
# its candidates say so (`few_measurements`).
MIN_TYPE_ROWS = 100


def crosses_vendor(frame: Frame) -> np.ndarray:
    """Per row: the lineage's prior on another type is on another vendor's type."""
    other = np.asarray(frame["o_vendor"], object)
    return np.asarray(pd.notna(other) & (np.asarray(frame["vendor"], object) != other))


def devices_changed(frame: Frame) -> np.ndarray:
    """Per row: the lineage's own prior there was measured on another device count."""
    return np.asarray(np.abs(f64(frame, "self_log_dev_ratio")) > F.DEVICES_CHANGED)


def conformal(z: np.ndarray) -> float:
    """The finite-sample conformal `INTERVAL_LEVEL` quantile of ``z``."""
    n = len(z)
    return float(np.quantile(z, min(1.0, np.ceil((n + 1) * INTERVAL_LEVEL) / n)))


def kind_quantiles(resid: dict[str, np.ndarray]) -> dict[str, list[float]]:
    """Per key (an anchor kind, a bin), the (q10, q90) of its residuals with the finite-sample
    conformal correction; a key with too few rows borrows the widest of the others."""
    out: dict[str, list[float]] = {}
    for k, r in resid.items():
        r = r[np.isfinite(r)]
        n = len(r)
        if n >= MIN_BUCKET_ROWS:
            lo = float(np.quantile(r, max(0.0, np.floor((n + 1) * QLO) / n)))
            hi = float(np.quantile(r, min(1.0, np.ceil((n + 1) * QHI) / n)))
            out[k] = [lo, hi]
    widest = (
        [min(v[0] for v in out.values()), max(v[1] for v in out.values())] if out else [-0.5, 0.5]
    )
    for k in resid:
        out.setdefault(k, widest)
    return out


# --- one normalised calibration (Mondrian split-conformal over a fitted scale)

# What makes a residual larger, as the scale model sees it (one column each, 0 where it does
# not apply): the anchor kind, how far a transfer moves its prior (log(1 + |log move|)), a prior on another
# vendor's type, a (model type × type) pair with fewer than the rare-pair rows in training, an
# own prior measured on another device count, a type with too few held-out rows of its own.
SCALE_TERMS = (
    "transfer",
    "model",
    "move",
    "cross_vendor",
    "rare_pair",
    "devices_changed",
    "few_type",
)
# The terms whose coefficient a model family shifts by its own amount (shrunk like the offsets):
# how much wider a family's residuals are off its own prior, per unit of move, across vendors.
# One coefficient for every family left recommenders' moves under-covered (docs/decisions/0019).
FAMILY_TERMS = ("transfer", "model", "move", "cross_vendor")
FAMILY_TERM_COLUMNS = [SCALE_TERMS.index(t) for t in FAMILY_TERMS]
# Pseudo-rows at no effect that shrink a type's or a family's own offset of the scale (ridge).
TYPE_SHRINK = 50.0
# Added to |residual| before its log: a residual of a few tenths of a per cent carries no scale.
SCALE_FLOOR = 0.005


class Calibration(TypedDict):
    """The model's one interval calibration: the scale σ(x) = exp(coef · terms + the offsets of
    the row's type and model family) and, per bin (anchor kind × known / few-rows type), the
    conformal `INTERVAL_LEVEL` quantiles of the residual over σ: the interval is the prediction
    plus σ times them (log units)."""

    coef: dict[str, float]  # "const" and each of `SCALE_TERMS`
    by_type: dict[str, float]  # log-σ offset of a type with `MIN_TYPE_ROWS` held-out rows
    by_family: dict[str, float]  # log-σ offset of a model family
    by_family_term: dict[str, dict[str, float]]  # family → its shift of `FAMILY_TERMS`' coefs
    quantiles: dict[str, list[float]]  # "kind|known" / "kind|few" → [lo, hi] of residual/σ


def scale_terms(
    kind: np.ndarray,
    move: np.ndarray,
    cross: np.ndarray,
    rare_pair: np.ndarray,
    changed: np.ndarray,
    few_type: np.ndarray,
) -> np.ndarray:
    """The scale model's inputs (rows × `SCALE_TERMS`) from per-row facts; ``kind`` the anchor
    kind's index in ("self", "transfer", "model")."""
    self_, transfer, model = kind == 0, kind == 1, kind == 2
    # log(1 + |move|): σ grows as a power of the move, never exponentially past the data
    size = np.where(transfer & np.isfinite(move), np.log1p(np.abs(move)), 0.0)
    cols = (
        transfer,
        model,
        size,
        transfer & cross,
        ~self_ & rare_pair,
        self_ & changed,
        ~self_ & few_type,
    )
    return np.column_stack([np.asarray(c, np.float64) for c in cols])


# The Mondrian bins, by code: anchor kind × (a type with its own held-out rows, or "few": one
# without); "self|few" is never used (an own prior on a rare type is still the lineage's own
# measurement). Families are an offset of σ, not bins: per-family bins left a family the
# held-out rows see little of (speech) under-covered over every candidate (docs/decisions/0011).
BINS = ("self|known", "self|few", "transfer|known", "transfer|few", "model|known", "model|few")


def calibration_bin(kind: np.ndarray, few_type: np.ndarray) -> np.ndarray:
    """Per row, its Mondrian bin's index in `BINS`."""
    return np.asarray(2 * kind + (few_type & (kind != 0)), np.int64)


def fit_calibration(
    resid: np.ndarray,
    terms: np.ndarray,
    hw: np.ndarray,
    family: np.ndarray,
    bins: np.ndarray,
    known: set[str],
) -> Calibration:
    """Fit σ(x): a ridge regression of log(|residual| + `SCALE_FLOOR`) on the terms and one
    offset per known type and per family (each shrunk by `TYPE_SHRINK` pseudo-rows); then each
    bin's conformal quantiles of residual/σ (a bin with fewer than `MIN_BUCKET_ROWS` takes the
    widest of the others)."""
    ok = np.isfinite(resid)
    r, X, t, f, b = resid[ok], terms[ok], hw[ok].astype(str), family[ok].astype(str), bins[ok]
    types = sorted({str(x) for x in np.unique(t) if x in known})
    families = sorted(str(x) for x in np.unique(f))
    onehot = [t == x for x in types] + [f == x for x in families]
    onehot += [(f == x) * X[:, j] for x in families for j in FAMILY_TERM_COLUMNS]
    A = np.column_stack([np.ones(len(r)), X, *onehot]) if len(r) else np.zeros((0, 1))
    y = np.log(np.abs(r) + SCALE_FLOOR)
    penalty = np.r_[np.zeros(1 + X.shape[1]), np.full(len(onehot), TYPE_SHRINK)]
    beta = np.linalg.solve(A.T @ A + np.diag(penalty) + 1e-9 * np.eye(A.shape[1]), A.T @ y)
    n_terms = 1 + X.shape[1]
    coef = {"const": round(float(beta[0]), 4)}
    coef.update({n: round(float(w), 4) for n, w in zip(SCALE_TERMS, beta[1:n_terms], strict=True)})
    shifts = beta[n_terms:]
    by_family = shifts[len(types) : len(types) + len(families)]
    by_term = shifts[len(types) + len(families) :].reshape(len(families), len(FAMILY_TERMS))
    cal: Calibration = {
        "coef": coef,
        "by_type": {x: round(float(w), 4) for x, w in zip(types, shifts, strict=False)},
        "by_family": {x: round(float(w), 4) for x, w in zip(families, by_family, strict=True)},
        "by_family_term": {
            x: {n: round(float(w), 4) for n, w in zip(FAMILY_TERMS, ws, strict=True)}
            for x, ws in zip(families, by_term, strict=True)
        },
        "quantiles": {},
    }
    z = r / sigma(cal, X, offsets(cal, t, f, X))
    cal["quantiles"] = kind_quantiles({BINS[k]: z[b == k] for k in np.unique(b)})
    return cal


@dataclass(frozen=True)
class ScaleOffsets:
    """A calibration's log-σ offsets as arrays by code: each type's, each family's and each
    family's shifts of the `FAMILY_TERMS` coefficients; the last entry of each (code -1) is
    for a type or family without its own (0; no shifts in a calibration fitted before them)."""

    type_code: dict[str, int]
    family_code: dict[str, int]
    by_type: np.ndarray
    by_family: np.ndarray
    by_family_term: np.ndarray  # (families + 1) × `FAMILY_TERMS`

    @classmethod
    def of(cls, cal: Calibration) -> ScaleOffsets:
        by_term = cal.get("by_family_term") or {}
        shifts = [[by_term.get(x, {}).get(n, 0.0) for n in FAMILY_TERMS] for x in cal["by_family"]]
        return cls(
            type_code={t: i for i, t in enumerate(cal["by_type"])},
            family_code={f: i for i, f in enumerate(cal["by_family"])},
            by_type=np.asarray([*cal["by_type"].values(), 0.0]),
            by_family=np.asarray([*cal["by_family"].values(), 0.0]),
            by_family_term=np.asarray([*shifts, [0.0] * len(FAMILY_TERMS)], np.float64),
        )

    def at(self, type_code: np.ndarray, family_code: np.ndarray, terms: np.ndarray) -> np.ndarray:
        """Per row (its type's and family's codes, its scale ``terms``), its log-σ offset."""
        shifts = np.sum(terms[:, FAMILY_TERM_COLUMNS] * self.by_family_term[family_code], axis=1)
        return self.by_type[type_code] + self.by_family[family_code] + shifts


def offsets(cal: Calibration, hw: np.ndarray, family: np.ndarray, terms: np.ndarray) -> np.ndarray:
    """`ScaleOffsets.at` of rows given by their type and family names."""
    o = ScaleOffsets.of(cal)
    type_code = codes_of(np.asarray(hw, object), o.type_code)
    return o.at(type_code, codes_of(np.asarray(family, object), o.family_code), terms)


def sigma(cal: Calibration, terms: np.ndarray, offset: np.ndarray) -> np.ndarray:
    """σ(x) per row from its terms and its `offsets`."""
    coef = cal["coef"]
    w = np.asarray([coef[name] for name in SCALE_TERMS], np.float64)
    return np.asarray(np.exp(coef["const"] + terms @ w + offset))


def bin_quantiles(cal: Calibration) -> tuple[np.ndarray, np.ndarray]:
    """(lo, hi) per bin code; a bin without quantiles takes the widest the calibration has."""
    q = cal["quantiles"]
    widest = [min(v[0] for v in q.values()), max(v[1] for v in q.values())]
    lo = np.asarray([q.get(name, widest)[0] for name in BINS], np.float64)
    hi = np.asarray([q.get(name, widest)[1] for name in BINS], np.float64)
    return lo, hi
