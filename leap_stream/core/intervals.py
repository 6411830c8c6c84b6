"""Prediction intervals of the throughput model: split-conformal quantiles per anchor kind and
the factors that widen them (per hardware type, a prior's move, a vendor crossing, a rare
pair, a changed device count). Pure functions over held-out residuals; `ThroughputModel`
calibrates with them at fit and applies their figures (its metadata's `residual_quantiles` and
`interval_scale`) when it predicts.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NotRequired, TypedDict

import numpy as np
import pandas as pd

from leap_stream.core import features as F
from leap_stream.core.columns import Frame, f64, map_values

INTERVAL_LEVEL = 0.8
QLO, QHI = (1 - INTERVAL_LEVEL) / 2, 1 - (1 - INTERVAL_LEVEL) / 2
MIN_BUCKET_ROWS = 30
# Held-out rows a hardware type needs for an interval scale of its own; a type with fewer (a
# new one, a rare one) gets the widest scale of the types that have one, and its candidates
# say so (`few_measurements`).
MIN_TYPE_ROWS = 100


class IntervalScale(TypedDict):
    """Per hardware type, how much wider (>1) or narrower its held-out residuals are than the
    pooled quantiles of their anchor kinds; ``sparse`` for every type without enough rows;
    ``unseen_pair``: a further factor for a (model type × hardware) pair the training rows
    had fewer than ``rare_pair_rows`` of (no row at all for a model without that key)."""

    by_type: dict[str, float]
    sparse: float
    unseen_pair: NotRequired[float]
    rare_pair_rows: NotRequired[int]
    unseen_type: NotRequired[float]  # the least scale of a type with too few held-out rows
    unseen_type_from: NotRequired[list[str]]  # the types left out to measure it
    # a further factor on the lineage's own prior when the job's device count changed since
    # it was measured (the prior is per device; communication and batching move it)
    devices_changed: NotRequired[float]
    # a transfer interval is 1 + transfer_move × |the prior's predicted move (log)| times as
    # wide as for a prior moved by nothing (`move_width`)
    transfer_move: NotRequired[float]
    # a transfer interval whose prior is on another vendor's type is this many times as wide
    # as one within a vendor (`spread_ratio`): a lineage's efficiency on one software stack
    # says less about another's
    cross_vendor: NotRequired[float]


MOVE_BINS = 5


def move_factor(per_log: float, move: np.ndarray) -> np.ndarray:
    """1 + `per_log` × |move| (1 where there is no move): how many times wider a transfer
    interval is for a prior moved by `move` (log) than for one moved by nothing."""
    return np.asarray(np.where(np.isfinite(move), 1.0 + per_log * np.abs(move), 1.0))


def move_width(move: np.ndarray, resid: np.ndarray) -> float:
    """The `move_factor` slope from held-out transfer residuals: their spread ((q90 − q10)/2)
    in `MOVE_BINS` equal-count bins of |move|, a least-squares line through the bins, its
    slope over its intercept; 0 when flat or falling, or with too few residuals.

    Why: the error of a moved prior grows with how far it is moved (one pooled quantile left
    the smallest moves at 0.89 coverage and the largest at 0.73 over every candidate), and a
    ranking moves priors further than the moves lineages made, which the quantiles come from."""
    ok = np.isfinite(move) & np.isfinite(resid)
    if ok.sum() < MOVE_BINS * MIN_BUCKET_ROWS:
        return 0.0
    size, r = np.abs(move[ok]), resid[ok]
    order = np.argsort(size, kind="stable")
    bins = np.array_split(order, MOVE_BINS)
    centre = np.asarray([np.median(size[b]) for b in bins])
    widths = np.asarray([spread(r[b]) for b in bins])
    slope, intercept = np.polyfit(centre, widths, 1)
    if intercept <= 0 or slope <= 0:
        return 0.0
    return round(float(slope / intercept), 4)


def spread(resid: np.ndarray) -> float:
    """(q90 − q10) / 2 of the residuals: how wide an 80 % interval around them is each way."""
    return float(np.subtract(*np.quantile(resid, [QHI, QLO]))) / 2


def transfer_width(frame: Frame, moved: np.ndarray, per_log: float, cross: float) -> np.ndarray:
    """Per row, how many times wider its transfer interval is than a prior's moved by nothing
    within a vendor: the move's `move_factor`, times ``cross`` where the prior is on another
    vendor's type (`crosses_vendor`)."""
    far = move_factor(per_log, moved - f64(frame, "other_log_pd"))
    return np.asarray(far * np.where(crosses_vendor(frame), cross, 1.0))


def crosses_vendor(frame: Frame) -> np.ndarray:
    """Per row: the lineage's prior on another type is on another vendor's type."""
    other = np.asarray(frame["o_vendor"], object)
    return np.asarray(pd.notna(other) & (np.asarray(frame["vendor"], object) != other))


def spread_ratio(resid: np.ndarray, rows: np.ndarray) -> float:
    """The spread ((q90 − q10)/2) of the residuals of ``rows`` over that of the others; 1
    with fewer than `MIN_TYPE_ROWS` finite residuals on either side."""
    ok = np.isfinite(resid)
    a, b = resid[ok & rows], resid[ok & ~rows]
    if min(len(a), len(b)) < MIN_TYPE_ROWS:
        return 1.0
    below = spread(b)
    return round(float(spread(a) / below), 4) if below > 0 else 1.0


def normalised(resid: np.ndarray, lo: np.ndarray | float, hi: np.ndarray | float) -> np.ndarray:
    """A residual over its kind's quantile on its side (``lo`` < 0 < ``hi``): inside the
    interval exactly when ≤ 1; NaN where it cannot be formed."""
    lo_, hi_ = np.broadcast_to(lo, resid.shape), np.broadcast_to(hi, resid.shape)
    ok = np.isfinite(resid) & (lo_ < 0) & (hi_ > 0)
    z = np.where(
        resid >= 0, resid / np.where(hi_ > 0, hi_, 1.0), resid / np.where(lo_ < 0, lo_, -1.0)
    )
    return np.where(ok, z, np.nan)


def type_scales(hw: np.ndarray, resid: np.ndarray, lo: np.ndarray, hi: np.ndarray) -> IntervalScale:
    """Normalised conformal scales: per type with `MIN_TYPE_ROWS` rows, the conformal
    `INTERVAL_LEVEL` quantile of its rows' `normalised` residuals. A type with fewer rows
    borrows the widest (at least 1): knowing little about a type is no reason to claim more
    than the worst type shows."""
    z = normalised(resid, lo, hi)
    ok = np.isfinite(z)
    by_type: dict[str, float] = {}
    frame = pd.DataFrame({"hw": hw[ok], "z": z[ok]})
    for t, g in frame.groupby("hw", sort=True)["z"]:
        if len(g) >= MIN_TYPE_ROWS:
            by_type[str(t)] = round(conformal(g.to_numpy()), 4)
    return {"by_type": by_type, "sparse": max([1.0, *by_type.values()])}


def row_scales(scales: IntervalScale, hw: np.ndarray) -> np.ndarray:
    """Per row, its hardware type's scale (the sparse one for a type without)."""
    return map_values(hw, scales["by_type"], scales["sparse"])


def unseen_pair_scale(
    type_scale: np.ndarray,
    unseen: np.ndarray,
    kinds: Sequence[tuple[np.ndarray, float, float]],
) -> float | None:
    """The factor (at least 1) on the type scale for a (model type × hardware) pair no training
    row had: over the held-out rows on such pairs, their residuals as a candidate there would
    be anchored — moved from another type, or blind (``kinds``: residual, lo, hi of each) —
    normalised and divided by their type's scale (``type_scale``, per row), the conformal
    quantile. None with fewer than `MIN_TYPE_ROWS` such residuals. A held-out row's own prior
    does not count: a ranking meets an unseen pair on the candidates a lineage never ran on."""
    z = np.concatenate([normalised(r, lo, hi)[unseen] for r, lo, hi in kinds])
    return further_factor(z, np.tile(type_scale[unseen], len(kinds)))


def further_factor(z: np.ndarray, row_scale: np.ndarray) -> float | None:
    """A further factor (at least 1) on some rows' scales: the conformal `INTERVAL_LEVEL`
    quantile of their normalised residuals ``z`` over the scale each row has already; None
    with fewer than `MIN_TYPE_ROWS` of them."""
    z = z / row_scale
    z = z[np.isfinite(z)]
    if len(z) < MIN_TYPE_ROWS:
        return None
    return round(max(1.0, conformal(z)), 4)


def devices_changed(frame: Frame) -> np.ndarray:
    """Per row: the lineage's own prior there was measured on another device count."""
    return np.asarray(np.abs(f64(frame, "self_log_dev_ratio")) > F.DEVICES_CHANGED)


def conformal(z: np.ndarray) -> float:
    """The finite-sample conformal `INTERVAL_LEVEL` quantile of ``z``."""
    n = len(z)
    return float(np.quantile(z, min(1.0, np.ceil((n + 1) * INTERVAL_LEVEL) / n)))


def kind_quantiles(resid: dict[str, np.ndarray]) -> dict[str, list[float]]:
    """Per-kind (q10, q90) of the log residual y − ŷ, with the finite-sample conformal
    correction; a kind with too few rows borrows the widest of the others."""
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
