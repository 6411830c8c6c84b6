"""What a model says about itself (metadata.json), and the check of a booster's text before
LightGBM parses it."""

from __future__ import annotations

import hashlib
import re
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, NotRequired, TypedDict

import numpy as np
import pandas as pd

from leap_stream.core.columns import (
    f64,
)
from leap_stream.core.intervals import INTERVAL_LEVEL, Calibration
from leap_stream.core.predictor.params import KINDS, SUPPORT_COLUMNS, SUPPORT_QUANTILES

if TYPE_CHECKING:
    from leap_stream.core.predictor.fit import _Fitted


class ModelMetadata(TypedDict):
    """What a model says about itself (metadata.json): how to build its features, its
    intervals, its calibration figures and, once the trainer gated it, the gate's verdict."""

    version: str
    trained_at: str
    data_window: list[str] | None
    rows: int
    features: list[str]
    groups: list[str]
    categories: dict[str, list[str]]
    target: str
    anchors: list[str]
    interval_level: float
    residual_quantiles: dict[str, list[float]]
    best_iteration: int
    params: dict[str, Any]
    pair_effects: NotRequired[dict[str, float]]
    pair_rows: NotRequired[dict[str, int]]  # training rows per pair (of the pair sample)
    pair_levels: NotRequired[dict[str, list[float]]]  # `pair_levels`: [level, lineages]
    support: NotRequired[dict[str, list[float]]]
    calibration: NotRequired[Calibration]  # the one interval calibration (core/intervals.py)
    ratio_features: NotRequired[list[str]]
    ratio_best_iteration: NotRequired[int]
    ratio_base: NotRequired[str]  # `PHYSICS_RATIO`, or absent: the ratio model's whole ratio
    type_pair_effects: NotRequired[dict[str, Any]]  # `TypePairEffects.to_json`
    roofline: NotRequired[dict[str, Any]]  # `LearnedRoofline.to_json`: the booster's offset
    metrics: NotRequired[dict[str, Any]]
    gate: NotRequired[dict[str, Any]]


def _metadata(
    fitted: _Fitted,
    frame: pd.DataFrame,
    groups: list[str],
    levels: dict[str, list[str]],
    data_window: tuple[str, str] | None,
    p: dict[str, Any],
) -> ModelMetadata:
    trained_at = datetime.now(UTC)
    digest = hashlib.sha256(fitted.booster.model_to_string().encode()).hexdigest()[:8]
    return {
        "version": trained_at.strftime("%Y%m%dT%H%M%S%fZ") + "-" + digest,
        "trained_at": trained_at.isoformat().replace("+00:00", "Z"),
        "data_window": list(data_window) if data_window else None,
        "rows": len(frame),
        "features": fitted.names,
        "groups": groups,
        "categories": levels,
        "target": "log(samples_per_s / num_devices) - log_phys_rate",
        "anchors": list(KINDS),
        "interval_level": INTERVAL_LEVEL,
        "residual_quantiles": {k: [-0.2, 0.2] for k in KINDS},
        "support": _support(frame),
        "best_iteration": fitted.best_iteration,
        "params": {k: v for k, v in p.items() if k != "num_threads"},
    }


def _support(frame: pd.DataFrame) -> dict[str, list[float]]:
    """The training rows' range of each `SUPPORT_COLUMNS` column (its 0.5-99.5 % quantiles)."""
    out: dict[str, list[float]] = {}
    for col in SUPPORT_COLUMNS:
        if col not in frame:
            continue
        x = f64(frame, col)
        x = x[np.isfinite(x)]
        if len(x):
            lo, hi = np.quantile(x, SUPPORT_QUANTILES)
            out[col] = [float(lo), float(hi)]
    return out


_TREE_SIZES = re.compile(rb"\ntree_sizes=([0-9 ]+)\n")


def check_model_text(text: bytes) -> None:
    """Refuse a LightGBM text model that is not whole: LightGBM 4 segfaults on a file cut
    mid-tree and loops forever on some garbage (tests/faults/test_faults_model.py), so a bad
    file would take the worker down instead of being counted as a failed load.

    Checks the header, that every tree block sits where ``tree_sizes`` says, and the end marker.
    """
    if not text.startswith(b"tree\nversion="):
        raise ValueError("not a LightGBM text model (no 'tree/version=' header)")
    m = _TREE_SIZES.search(text)
    if m is None:
        raise ValueError("LightGBM model without tree_sizes")
    try:
        sizes = [int(x) for x in m.group(1).split()]
    except ValueError as exc:
        raise ValueError(f"LightGBM model with bad tree_sizes: {exc}") from None
    pos = text.find(b"\nTree=0\n", m.end() - 1) + 1
    if pos == 0:
        raise ValueError("LightGBM model without trees")
    for i, size in enumerate(sizes):
        if not text.startswith(b"Tree=%d\n" % i, pos) or size <= 0:
            raise ValueError(f"LightGBM model truncated or corrupt at tree {i}")
        pos += size
    if not text.startswith(b"end of trees", pos):
        raise ValueError("LightGBM model truncated (no 'end of trees' after the last tree)")
