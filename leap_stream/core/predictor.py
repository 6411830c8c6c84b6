"""`ThroughputModel`: the lineage's own prior, moved across hardware by a LightGBM model.

The booster learns log per-device throughput, log(samples_per_s / num_devices), from the job's
configuration, the hardware's specs and the model type's aggregates (`BOOSTER_GROUPS`) over
every measured run. A prediction then anchors on the lineage's history, the published lesson:

* the lineage ran on the candidate before: its last per-device rate there (`self`);
* it ran elsewhere: its rate on the most similar type B times a learned ratio (`transfer`):
  prior_B + g(job, candidate, B), where the *ratio model* g is a second, small booster trained
  on lineages measured on both types (each pair also reversed: a lineage mostly moved one way,
  and B/A is the inverse of A/B) and fed the main booster's own difference
  f(job, candidate) − f(job, B) next to the two types' specs; the per-lineage factor (input
  pipeline, code quality) cancels in a ratio, which a model of absolute throughput cannot see;
* no history: f(job, candidate) (`model`).

The main booster is fitted twice: the second time on targets with each lineage's own shrunk
mean residual taken out, so the trees spend themselves on hardware and configuration instead
of on the hidden per-lineage factor (σ ≈ 0.25 in log), which is noise for every ratio.

f(job, B) and f(job, candidate) come from ONE main-booster call on the stacked rows; the ratio
model scores the transfer rows in one call of its own.

Intervals: split-conformal quantiles of the log residual per kind, on lineages held out of the
booster fit; every held-out row also contributes a transfer residual when it has a prior on
another type (the case the ranker meets most: candidates the lineage never ran on).

On disk (store/artefact.py) the model is LightGBM's text format (`model_text`, never pickle)
and its metadata (version, trained_at, data window, features, categories, intervals, metrics);
this module does no file I/O.
"""

from __future__ import annotations

import hashlib
import os
import re
import zlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any, NotRequired, TypedDict

import lightgbm as lgb
import numpy as np
import pandas as pd

from leap_stream.core import features as F
from leap_stream.core.columns import (
    Frame,
    category_codes,
    codes_of,
    column_codes,
    f64,
    value_ids,
)
from leap_stream.core.intervals import (
    INTERVAL_LEVEL,
    MIN_BUCKET_ROWS,
    MIN_TYPE_ROWS,
    IntervalScale,
    conformal,
    crosses_vendor,
    devices_changed,
    further_factor,
    kind_quantiles,
    move_factor,
    move_width,
    normalised,
    row_scales,
    spread_ratio,
    transfer_width,
    type_scales,
    unseen_pair_scale,
)
from leap_stream.core.roofline import LearnedRoofline

Scorer = Callable[[np.ndarray], np.ndarray]
# `ThroughputModel.scorer_kind`: LightGBM's own predict, or the same trees compiled
LIGHTGBM_KIND = "lightgbm"
COMPILED_KIND = "compiled"
# Compiles a booster's trees for `ThroughputModel.fit` to score its own training rows with
# (stream/compiled.py's `fit_scorer`; categories: the levels of its categorical features);
# None when it cannot. Core never imports the compiler: the trainer hands it in.
BoosterCompiler = Callable[[lgb.Booster, Mapping[str, Sequence[str]]], Scorer | None]

# the largest log a bound may take: exp of it is finite (a ranking's numbers must be JSON numbers)
LOG_FLOAT_MAX = float(np.log(np.finfo(np.float64).max)) - 1.0
# A type the trees never saw (a new part) is predicted from its specs alone. How far off that
# is, measured at fit: the booster refitted without the fastest `UNSEEN_TYPES` types with
# `MIN_TYPE_ROWS` held-out rows (a part a fleet adds is most often faster than what it has),
# on at most `UNSEEN_TYPE_ROWS` rows, scoring those types' held-out rows. One fit for all of
# them: one per type cost 70 % more training time for the same coverage (docs/model.md).
UNSEEN_TYPES = 3
UNSEEN_TYPE_ROWS = 200_000

DEFAULT_PARAMS: dict[str, Any] = {
    "objective": "huber",
    "alpha": 0.3,  # huber delta in log units: robust to the odd straggler measurement
    "learning_rate": 0.2,
    "num_leaves": 63,
    "min_data_in_leaf": 50,
    "feature_fraction": 0.9,
    "bagging_fraction": 0.8,
    "bagging_freq": 1,
    "lambda_l2": 5.0,
    "max_bin": 127,
    "cat_smooth": 10.0,
    "max_cat_to_onehot": 8,
    "verbose": -1,
}
NUM_ROUNDS = 150
EARLY_STOP = 40
BAG_ROWS = 2_000_000  # rows a tree sees at most (`_bagging_fraction`)
FIT_ROWS = 4_000_000  # training rows the boosters fit at most (`_fit_sample`)
# Lineage effects taken out before the second fit: a lineage's mean residual shrunk by this
# many pseudo-rows at zero (a lineage seen once moves a third of the way).
LINEAGE_SHRINK = 2.0
# The ratio model, fitted on the pairs a fleet has (lineages measured on two types); below
# RATIO_MIN_ROWS pairs the booster difference stays. Deep trees, few of them: 60 trees of 127
# leaves cost what 100 of 31 did to score (traversal grows with depth) and put more transfer
# rows within ±10 % (docs/decisions/0004)
RATIO_PARAMS: dict[str, Any] = {
    **DEFAULT_PARAMS,
    "num_leaves": 127,
    "min_data_in_leaf": 30,
    "feature_fraction": 0.8,
}
RATIO_ROUNDS = 60
RATIO_EARLY_STOP = 20
RATIO_MIN_ROWS = 500
# Pairs the ratio model fits at most, each in both directions (`_at_most`): every pair of a
# backtest's night (tens of thousands), a sample of a year's ~3M, whose matrix was the peak
# of a year's training (docs/benchmarks.md)
RATIO_PAIRS = 1_000_000
# Hardware inputs whose candidate − prior difference the ratio model also sees directly.
RATIO_DIFFS = (
    "log_phys_rate",
    "log_t_compute",
    "log_t_memory",
    "log_t_comm",
    "log_peak_tflops",
    "log_mem_bw",
    "log_interconnect",
    "log_device_mem",
    "log_ideal_micro_s",
    "log_roofline",
    "log_domains",
    "log_network",
)
BOOSTER_RATIO = "booster_ratio"  # f(job, candidate) − f(job, B): the main booster's own ratio
# `ModelMetadata.ratio_base`: the ratio model learns the measured ratio less the physics ratio
# (learned roofline and pair effects, candidate less prior type); a model without it learned the
# whole ratio
PHYSICS_RATIO = "physics"
# prior_B − f(job, B): how far the lineage runs from what its configuration predicts on B. A job
# slow for its configuration (an input pipeline, a host bottleneck) gains less on a faster type,
# which no hardware input says (docs/decisions/0001)
PRIOR_RESIDUAL = "prior_residual"


def _threads(rows: int, predict: bool = False) -> int:
    """OpenMP threads: one for small work (spinning threads cost more than they save on a
    shared 2-core box), two for big training sets and serving batches."""
    big = rows >= (2_000 if predict else 200_000)
    return max(1, min(2, os.cpu_count() or 1)) if big else 1


def predict_threads(rows: int) -> int:
    """Threads for scoring `rows` rows (LightGBM's predict, the compiled trees alike)."""
    return _threads(rows, predict=True)


def holdout_mask(lineage_ids: np.ndarray | pd.Series, fraction: float, seed: int = 0) -> np.ndarray:
    """Deterministic split by lineage (rows of one lineage share history; keep them together)."""
    salt = str(seed).encode()
    h = np.fromiter(
        (zlib.crc32(salt + str(x).encode()) for x in np.asarray(lineage_ids, dtype=object)),
        np.uint64,
        count=len(lineage_ids),
    )
    return np.asarray((h % 10_000) < int(fraction * 10_000))


KINDS = ("self", "transfer", "model")

# Out of distribution: a job whose configuration lies outside what the model was trained on.
# The support is the 0.5-99.5 % range of each of these columns over the training rows (log
# units); a job further than OOD_MARGIN (×2) outside any of them is flagged, and every interval
# of it widens by how far outside it is: extrapolating ×e^d past the data adds d of log
# uncertainty on each side (docs/model.md).
SUPPORT_COLUMNS = (
    "log_params",
    "log_seq",
    "log_global_batch",
    "log_devices",
    "log_flops_per_sample",
    "log_mem_per_device_gib",
)
SUPPORT_QUANTILES = (0.005, 0.995)
OOD_MARGIN = float(np.log(2.0))
KIND_SELF, KIND_TRANSFER, KIND_MODEL = 0, 1, 2


def anchor_kind(frame: Frame, groups: Sequence[str]) -> np.ndarray:
    """Which estimate a row gets (see the module docstring); `prior` ablated → always model."""
    kind = np.full(len(frame), KIND_MODEL, np.int64)
    if "prior" not in groups:
        return kind
    kind[np.isfinite(f64(frame, "other_log_pd"))] = KIND_TRANSFER
    kind[np.isfinite(f64(frame, "self_log_pd"))] = KIND_SELF
    return kind


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
    support: NotRequired[dict[str, list[float]]]
    interval_scale: NotRequired[IntervalScale]
    ratio_features: NotRequired[list[str]]
    ratio_best_iteration: NotRequired[int]
    ratio_base: NotRequired[str]  # `PHYSICS_RATIO`, or absent: the ratio model's whole ratio
    roofline: NotRequired[dict[str, Any]]  # `LearnedRoofline.to_json`: the booster's offset
    metrics: NotRequired[dict[str, Any]]
    gate: NotRequired[dict[str, Any]]


class ThroughputModel:
    def __init__(
        self,
        booster: lgb.Booster,
        metadata: ModelMetadata,
        scorer: Scorer | None = None,
        scorer_kind: str = LIGHTGBM_KIND,
        ratio: lgb.Booster | None = None,
        ratio_scorer: Scorer | None = None,
    ) -> None:
        self.booster = booster
        self.metadata = metadata
        self.ratio = ratio  # the transfer rows' ratio model (None: the booster difference)
        self.ratio_features: list[str] = list(metadata.get("ratio_features") or [])
        roof = metadata.get("roofline")
        self.roofline = LearnedRoofline.from_json(roof) if roof else None
        # the ratio model's raw output: LightGBM's predict, or the same trees compiled
        self.ratio_score: Scorer = ratio_scorer or self.ratio_lightgbm
        # the trees' raw output for a float matrix: LightGBM's predict, or the same trees
        # compiled (stream/compiled.py, checked equal to LightGBM's before it serves)
        self.score: Scorer = scorer or self.score_lightgbm
        self.scorer_kind = scorer_kind
        self.feature_names: list[str] = list(metadata["features"])
        self.groups: list[str] = list(metadata["groups"])
        self._levels: dict[str, list[str]] = {k: list(v) for k, v in metadata["categories"].items()}
        pairs = metadata.get("pair_effects") or {}
        # (model type × hardware) effects as a dense table: two integer look-ups per row
        split = [k.split("|", 1) for k in pairs]
        self._pair_mt = {m: i for i, m in enumerate(sorted({m for m, _ in split}))}
        self._pair_hw = {h: i for i, h in enumerate(sorted({h for _, h in split}))}
        self._pair_table = np.zeros((len(self._pair_mt) + 1, len(self._pair_hw) + 1))
        if split:
            mi = [self._pair_mt[m] for m, _ in split]
            hi = [self._pair_hw[h] for _, h in split]
            self._pair_table[mi, hi] = np.asarray(list(pairs.values()), np.float64)
        self._luts = {c: {v: i for i, v in enumerate(lv)} for c, lv in self._levels.items()}
        q = metadata["residual_quantiles"]
        self._qlo = np.asarray([q[k][0] for k in KINDS], np.float64)
        self._qhi = np.asarray([q[k][1] for k in KINDS], np.float64)
        scale = metadata.get("interval_scale")
        by_type: dict[str, float] = dict(scale["by_type"]) if scale else {}
        # type -> position in `_scales`, whose last entry (code -1) is the sparse scale
        self._type_code = {t: i for i, t in enumerate(by_type)}
        self._sparse_scale = float(scale["sparse"]) if scale else 1.0
        self._scales = np.asarray([*by_type.values(), self._sparse_scale], np.float64)
        self._unseen_pair_scale = float(scale.get("unseen_pair", 1.0)) if scale else 1.0
        self._unseen_type_scale = float(scale.get("unseen_type", 0.0)) if scale else 0.0
        self._devices_changed = float(scale.get("devices_changed", 1.0)) if scale else 1.0
        self._transfer_move = float(scale.get("transfer_move", 0.0)) if scale else 0.0
        self._cross_vendor = float(scale.get("cross_vendor", 1.0)) if scale else 1.0
        # which (model type × hardware) pairs the training rows had enough of for the type's
        # own interval: at least `rare_pair_rows` (1, their effects' keys, for older models)
        self._pair_common = np.zeros(self._pair_table.shape, bool)
        if split:
            rows = metadata.get("pair_rows") or {}
            least = int(scale.get("rare_pair_rows", 1)) if scale else 1
            common = [rows.get(k, least) >= least for k in pairs]
            self._pair_common[mi, hi] = np.asarray(common, bool)

    @property
    def version(self) -> str:
        return str(self.metadata["version"])

    def with_scorer(
        self, scorer: Scorer, kind: str, ratio_scorer: Scorer | None = None
    ) -> ThroughputModel:
        """The same model (boosters, metadata, intervals) scoring its trees with `scorer` (and
        the ratio model's with `ratio_scorer`, LightGBM's own when None)."""
        return type(self)(self.booster, self.metadata, scorer, kind, self.ratio, ratio_scorer)

    def ratio_lightgbm(self, X: np.ndarray) -> np.ndarray:
        """LightGBM's own predict of the ratio model (the reference a scorer is checked on)."""
        if self.ratio is None:
            raise ValueError("this model has no ratio model")
        return np.asarray(self.ratio.predict(X, num_threads=predict_threads(len(X))))

    def score_lightgbm(self, X: np.ndarray) -> np.ndarray:
        """LightGBM's own predict, whatever `score` is (the reference a scorer is checked on)."""
        return np.asarray(self.booster.predict(X, num_threads=predict_threads(len(X))))

    # --- training
    @classmethod
    def fit(
        cls,
        frame: pd.DataFrame,
        samples_per_s: np.ndarray,
        lineage_ids: np.ndarray | pd.Series,
        *,
        groups: Sequence[str] = tuple(F.GROUPS),
        params: dict[str, Any] | None = None,
        num_rounds: int = NUM_ROUNDS,
        calib_fraction: float = 0.15,
        seed: int = 0,
        data_window: tuple[str, str] | None = None,
        progress: Callable[[int, int], None] | None = None,
        compile_trees: BoosterCompiler | None = None,
    ) -> ThroughputModel:
        """Fit on (job × hardware it ran on) rows; `samples_per_s` is the measured whole-job rate.

        Three steps: the booster on the residual of the physics offset (lineages held out for
        calibration), the (model type × hardware) effects it cannot reach, then split-conformal
        interval quantiles on the held-out lineages. With `compile_trees`, the fit scores its
        main boosters on its own rows with their compiled trees (identical output, faster on
        millions of rows; the model is the same either way)."""
        groups = [g for g in F.GROUPS if g in groups]
        names = F.booster_features(groups)
        levels = _levels(frame, names)
        y = np.log(np.asarray(samples_per_s, np.float64)) - frame["log_devices"].to_numpy()
        calib = holdout_mask(lineage_ids, calib_fraction, seed) if len(frame) >= 400 else None
        if calib is not None and (calib.all() or not calib.any()):
            calib = None
        train_idx = ~calib if calib is not None else np.ones(len(frame), bool)
        roofline = (
            LearnedRoofline.fit(frame.loc[train_idx], y[train_idx], seed)
            if _physics(groups)
            else None
        )
        offset = _offset(frame, groups, roofline)
        p = {**DEFAULT_PARAMS, **(params or {}), "num_threads": _threads(len(frame)), "seed": seed}
        fit_idx = _fit_sample(train_idx, seed)  # the boosters' rows (all but for a year)
        p["bagging_fraction"] = _bagging_fraction(p["bagging_fraction"], int(fit_idx.sum()))
        # float32: what LightGBM bins from anyway, at half the memory of a year's matrix; the
        # fitted rows first, so that they and the calibration rows are views, not copies
        held_out = np.flatnonzero(calib) if calib is not None else np.zeros(0, np.int64)
        order = np.concatenate([np.flatnonzero(fit_idx), held_out])
        X = _matrix(frame, names, levels, base=order, dtype=np.float32) if names else None
        fitted = _train_booster(
            X, y - offset, names, fit_idx, calib, p, num_rounds, progress, order=order
        ).compiled(compile_trees, levels)
        target = y - offset  # less each lineage's own shrunk mean residual, below
        if names and len(frame) >= 400:
            # the second fit, on targets without each lineage's own shrunk mean residual
            target = target - _lineage_effects(
                lineage_ids, target - fitted.predict(p["num_threads"])
            )
            fitted = _train_booster(
                X,
                target,
                names,
                fit_idx,
                calib,
                p,
                num_rounds,
                progress,
                order=order,
                data=fitted.data,
            ).compiled(compile_trees, levels)
        metadata = _metadata(fitted, frame, groups, levels, data_window, p)
        if roofline is not None:
            metadata["roofline"] = roofline.to_json()
            metadata["target"] = "log(samples_per_s / num_devices) - roofline"
        if "config" in groups and "specs" in groups:
            metadata["pair_effects"], metadata["pair_rows"] = _pair_effects(
                fitted, frame, target, fit_idx, p["num_threads"], seed
            )
        booster = fitted.booster
        left_out: _LeftOut | None = None
        if X is not None and calib is not None and {"config", "specs"} <= set(groups):
            left_out = _LeftOut.fit(frame, X, target, order, fit_idx, calib, metadata, p, seed)
        scorer = fitted.scorer
        del fitted, X  # the matrix and its binned datasets: the ratio model needs the memory
        # scoring for the ratio model's inputs and the calibration; the model returned scores
        # with LightGBM (a worker compiles what it loads: stream/models.py)
        kind = COMPILED_KIND if scorer is not None else LIGHTGBM_KIND
        model = cls(booster, metadata, scorer, kind)
        if {"prior", "config", "specs"} <= set(groups):
            model = model._with_ratio_model(frame, y, train_idx, calib, seed)
        model._calibrate(frame, y, calib if calib is not None else train_idx, left_out)
        return cls(booster, model.metadata, ratio=model.ratio)

    def _with_ratio_model(
        self,
        frame: pd.DataFrame,
        y: np.ndarray,
        train_idx: np.ndarray,
        calib: np.ndarray | None,
        seed: int,
    ) -> ThroughputModel:
        """This model with a ratio model fitted on the pairs in `frame` (rows whose lineage
        had run on another type before), or itself when there are too few pairs."""
        pair = np.isfinite(frame["other_log_pd"].to_numpy(np.float64))
        if (pair & train_idx).sum() < RATIO_MIN_ROWS:
            return self
        rows = _at_most(np.flatnonzero(pair), RATIO_PAIRS, seed)
        pf = frame.iloc[rows].reset_index(drop=True)
        blind, _rows, prior_f, physics = self._booster_parts(pf)
        other = pf["other_log_pd"].to_numpy(np.float64)
        names = ratio_features(self.feature_names)
        derived = _derived(blind, prior_f, other)
        n = len(rows)
        # every pair also seen from its other side, below it: the ratio B/A is the inverse of
        # A/B, and a lineage mostly moved one way (docs/decisions/0001)
        X = np.empty((2 * n, len(names)), np.float32)
        X[:n] = _ratio_matrix(pf, names, derived, self._levels, self._luts, dtype=np.float32)
        own_residual = y[rows] - blind  # the lineage on the candidate, against f(job, candidate)
        _reversed_pairs(X[:n], names, own_residual, out=X[n:])
        # the trees learn what the physics ratio misses (`ratio_base`)
        target = np.concatenate([y[rows] - other - physics, other - y[rows] + physics])
        tr = np.tile(train_idx[rows], 2)
        va = np.tile(calib[rows], 2) if calib is not None else np.zeros(2 * n, bool)
        cats = [i for i, c in enumerate(names) if _level_name(c) in self._levels]
        rp = {**RATIO_PARAMS, "num_threads": _threads(len(rows)), "seed": seed}
        valid = (X[va], target[va]) if va.sum() >= MIN_BUCKET_ROWS else None
        data = _TrainData.of((X[tr], target[tr]), valid, names, cats)
        ratio, best = _train(rp, data, RATIO_ROUNDS, RATIO_EARLY_STOP)
        meta: ModelMetadata = {
            **self.metadata,
            "ratio_features": names,
            "ratio_best_iteration": best,
            "ratio_base": PHYSICS_RATIO,
        }
        compiled = self.score if self.scorer_kind != LIGHTGBM_KIND else None
        return type(self)(self.booster, meta, compiled, self.scorer_kind, ratio)

    def _calibrate(
        self,
        frame: pd.DataFrame,
        y: np.ndarray,
        cal: np.ndarray,
        left_out: _LeftOut | None = None,
    ) -> None:
        """Conformal quantiles and calibration figures on held-out lineages, every applicable
        anchor per row (into the metadata); with `left_out`, the unseen-type scale."""
        cf = frame.loc[cal]
        yc = y[cal]
        blind, moved = self._log_pd_parts(cf)
        resid = {
            "self": yc - cf["self_log_pd"].to_numpy(np.float64),
            "transfer": yc - moved,
            "model": yc - blind,
        }
        if "prior" not in self.groups:
            resid["self"] = resid["transfer"] = resid["model"]
        kind = anchor_kind(cf, self.groups)
        pred = np.choose(kind, [cf["self_log_pd"].to_numpy(np.float64), moved, blind])
        ape = np.abs(np.expm1(pred - yc))
        # transfer residuals in units of their move's width: a prior moved far errs more, and a
        # ranking moves priors further than lineages did (docs/decisions/0002)
        move = moved - f64(cf, "other_log_pd")
        transfer_move = move_width(move, resid["transfer"])
        resid["transfer"] = resid["transfer"] / move_factor(transfer_move, move)
        # and in units of the vendor crossing's width (docs/decisions/0003)
        cross = crosses_vendor(cf)
        cross_vendor = spread_ratio(resid["transfer"], cross)
        resid["transfer"] = resid["transfer"] / np.where(cross, cross_vendor, 1.0)
        quantiles = kind_quantiles(resid)
        self.metadata["residual_quantiles"] = quantiles
        own = np.choose(kind, [resid["self"], resid["transfer"], resid["model"]])
        lo = np.asarray([quantiles[k][0] for k in KINDS])[kind]
        hi = np.asarray([quantiles[k][1] for k in KINDS])[kind]
        hw = cf["hardware_type"].to_numpy(object)
        self.metadata["interval_scale"] = type_scales(hw, own, lo, hi)
        if transfer_move > 0.0:
            self.metadata["interval_scale"]["transfer_move"] = transfer_move
        if cross_vendor != 1.0:
            self.metadata["interval_scale"]["cross_vendor"] = cross_vendor
        type_scale = row_scales(self.metadata["interval_scale"], hw)
        pair_rows = self.metadata.get("pair_rows") or {}
        mt_hw = _pair_keys(cf["model_type"].to_numpy(object), hw)
        rows_of_pair = pd.Series(pair_rows, dtype=np.float64).reindex(mt_hw).fillna(0.0)
        unseen = unseen_pair_scale(
            type_scale,
            rows_of_pair.to_numpy() < RARE_PAIR_ROWS,
            [(resid[k], *quantiles[k]) for k in ("transfer", "model")],
        )
        if unseen is not None:
            self.metadata["interval_scale"]["unseen_pair"] = unseen
            self.metadata["interval_scale"]["rare_pair_rows"] = RARE_PAIR_ROWS
        changed = devices_changed(cf)
        z_changed = normalised(resid["self"], *quantiles["self"])[changed]
        factor = further_factor(z_changed, type_scale[changed])
        if factor is not None:
            self.metadata["interval_scale"]["devices_changed"] = factor
        if left_out is not None:
            far = transfer_width(frame, left_out.moved, transfer_move, cross_vendor)
            unseen_type = left_out.scale(y, quantiles, far)
            if unseen_type is not None:
                self.metadata["interval_scale"]["unseen_type"] = unseen_type
                self.metadata["interval_scale"]["unseen_type_from"] = left_out.types
        self.metadata["metrics"] = {
            "calib_rows": int(cal.sum()),
            "calib_accuracy_10pct": float(np.mean(ape <= 0.10)),
            "calib_mape": float(np.mean(ape)),
            "calib_rows_by_kind": {k: int(np.isfinite(v).sum()) for k, v in resid.items()},
        }

    # --- serving
    def _log_pd_parts(self, frame: Frame, skip_self: bool = False) -> tuple[np.ndarray, np.ndarray]:
        """(f(job, candidate), prior moved to the candidate) in log per-device samples/s.

        `skip_self`: rows anchored on the lineage's own prior need neither (NaN there), so
        the booster does not score them (serving; calibration wants every estimate)."""
        blind, rows, prior_f, physics = self._booster_parts(frame, skip_self)
        moved = np.full(len(frame), np.nan)
        if len(rows):
            other_lpd = f64(frame, "other_log_pd")[rows]
            moved[rows] = other_lpd + blind[rows] - prior_f
            if self.ratio is not None:
                derived = _derived(blind[rows], prior_f, other_lpd)
                Xr = _ratio_matrix(
                    frame,
                    self.ratio_features,
                    derived,
                    self._levels,
                    self._luts,
                    rows,
                    dtype=_input_dtype(frame),
                )
                base = physics if self.metadata.get("ratio_base") == PHYSICS_RATIO else 0.0
                moved[rows] = other_lpd + base + self.ratio_score(Xr)
        return blind, moved

    def _booster_parts(
        self, frame: Frame, skip_self: bool = False
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(f(job, candidate) per row, the rows with a prior on another type B, f(job, B) of
        each of them, the physics ratio of each of them: the physics offset and the pair effect
        on the candidate less on B), f with the physics offset and the pair effect, from one
        booster call."""
        n = len(frame)
        other = np.isfinite(f64(frame, "other_log_pd"))
        base: np.ndarray | None = None
        if "prior" not in self.groups:
            other[:] = False
        elif skip_self:
            self_rows = np.isfinite(f64(frame, "self_log_pd"))
            if self_rows.any():
                other &= ~self_rows
                base = np.flatnonzero(~self_rows)
        # one prior-hardware row per (job, prior type), shared by the job's candidates
        rows = np.flatnonzero(other)
        inverse = np.zeros(0, np.int64)
        pick = rows
        if len(rows):
            hw_code = value_ids(frame, "o_hardware_type", rows)
            key = np.asarray(frame["job"], np.int64)[rows] * (int(hw_code.max()) + 2) + hw_code
            _u, first, inverse = np.unique(key, return_index=True, return_inverse=True)
            pick = rows[first]
        # candidate rows, then the prior-hardware rows stacked under them (job columns copied,
        # hardware columns from their "o_" twins): one matrix, one booster call
        dtype = _input_dtype(frame)
        X = _matrix(frame, self.feature_names, self._levels, pick, base, self._luts, dtype=dtype)
        # the one call (none when every row is anchored on its own prior)
        out = self.score(X) if len(X) else np.empty(0)
        nb = n if base is None else len(base)
        mt_code = column_codes(frame, "model_type", self._pair_mt) if self._pair_mt else None
        blind_all = out[:nb] if base is None else np.full(n, np.nan)
        if base is not None:
            blind_all[base] = out[:nb]
        physics = _offset(frame, self.groups, self.roofline) + self._pair(mt_code, frame)
        blind = blind_all + physics
        prior_f = physics_ratio = np.zeros(0)
        if len(rows):
            prior_physics = (
                _offset(frame, self.groups, self.roofline, prefix="o_", rows=pick)
                + self._pair(mt_code, frame, "o_hardware_type")[pick]
            )[inverse]
            prior_f = out[nb:][inverse] + prior_physics
            physics_ratio = physics[rows] - prior_physics
        return blind, rows, prior_f, physics_ratio

    def _pair(
        self, mt_code: np.ndarray | None, frame: Frame, hw_col: str = "hardware_type"
    ) -> np.ndarray:
        """Per row, the (model type × hardware type) effect; 0 for an unseen pair."""
        if mt_code is None:
            return np.zeros(len(frame))
        hc = column_codes(frame, hw_col, self._pair_hw)
        return np.asarray(self._pair_table[mt_code, hc])  # -1 → the zero padding row / column

    def support_excess(self, frame: Frame) -> np.ndarray:
        """Per row, how far (log units) its job lies outside the training support; 0 inside,
        and 0 for a model trained before the support was recorded."""
        out = np.zeros(len(frame))
        for col, (lo, hi) in (self.metadata.get("support") or {}).items():
            x = f64(frame, col)
            out = np.fmax(out, np.fmax(lo - x, x - hi))  # NaN (a missing column value) ignored
        return out

    def predict(
        self, frame: Frame, excess: np.ndarray | None = None
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(p50, p10, p90) whole-job samples/s, one booster call for the whole frame. The
        interval widens by the job's distance outside the training support (``excess``: the
        caller's `support_excess(frame)`, when it has it already)."""
        if len(frame) == 0:
            e = np.empty(0)
            return e, e, e
        blind, moved = self._log_pd_parts(frame, skip_self=True)
        kind = anchor_kind(frame, self.groups)
        log_pd = np.choose(kind, [f64(frame, "self_log_pd"), moved, blind])
        log_total = log_pd + f64(frame, "log_devices")
        p50 = np.exp(log_total)
        widen = self.support_excess(frame) if excess is None else excess
        scale = self.interval_scale(frame, kind)
        if self._transfer_move or self._cross_vendor != 1.0:
            far = transfer_width(frame, moved, self._transfer_move, self._cross_vendor)
            scale = np.where(kind == KIND_TRANSFER, scale * far, scale)
        low = np.exp(log_total + self._qlo[kind] * scale - widen)
        # a job far outside the support (widen ~ 700 log units) must still get a number
        high = np.exp(np.fmin(log_total + self._qhi[kind] * scale + widen, LOG_FLOAT_MAX))
        return p50, low, high

    def interval_scale(self, frame: Frame, kind: np.ndarray | None = None) -> np.ndarray:
        """Per row, its hardware type's interval scale (`IntervalScale`), times the unseen-pair
        factor where the training rows had its (model type × hardware) fewer than
        ``rare_pair_rows`` times (never, for an older model) and the row is not anchored on its
        own prior there (``kind``; every row when not given); 1 for a model calibrated before
        types had scales. A type with too few held-out rows for a scale of its own gets at
        least the unseen-type scale (a model fitted with one), except where anchored on its
        own prior. A row anchored on the lineage's own prior measured on another device count
        gets the devices-changed factor (a model fitted with one)."""
        few: np.ndarray | None = None
        if not self._type_code:
            out = np.full(len(frame), self._sparse_scale)
        else:
            code = column_codes(frame, "hardware_type", self._type_code)
            out = np.asarray(self._scales[code])
            few = code < 0
        not_self = np.ones(len(frame), bool) if kind is None else kind != KIND_SELF
        if self._unseen_pair_scale != 1.0:
            mt = column_codes(frame, "model_type", self._pair_mt)
            hc = column_codes(frame, "hardware_type", self._pair_hw)
            common = self._pair_common[mt, hc]  # -1: the padding, unseen
            out = np.where(common | ~not_self, out, out * self._unseen_pair_scale)
        if few is not None and self._unseen_type_scale > 0.0:
            widen = few & not_self
            out = np.where(widen, np.fmax(out, self._unseen_type_scale), out)
        if self._devices_changed != 1.0:
            moved = ~not_self & devices_changed(frame)
            out = np.where(moved, out * self._devices_changed, out)
        return out

    def few_measurements(self, frame: Frame) -> np.ndarray:
        """Per row: its hardware type had too few held-out measurements for a scale of its own
        (its interval is the widest known type's); False for a model without type scales."""
        if not self._type_code:
            return np.zeros(len(frame), bool)
        return np.asarray(column_codes(frame, "hardware_type", self._type_code) < 0)

    # --- artefact (files: store/artefact.py)
    def model_text(self) -> str:
        """The booster in LightGBM's text format."""
        return str(self.booster.model_to_string())

    def ratio_text(self) -> str | None:
        """The ratio model in LightGBM's text format (None: the model has none)."""
        return None if self.ratio is None else str(self.ratio.model_to_string())

    @classmethod
    def from_text(
        cls, text: bytes, metadata: ModelMetadata, ratio_text: bytes | None = None
    ) -> ThroughputModel:
        check_model_text(text)  # before LightGBM sees it: its parser can crash or hang
        ratio = None
        if metadata.get("ratio_features"):
            if ratio_text is None:
                raise ValueError("the metadata names a ratio model but its text is missing")
            check_model_text(ratio_text)
            ratio = lgb.Booster(model_str=ratio_text.decode("utf-8"))
        return cls(lgb.Booster(model_str=text.decode("utf-8")), metadata, ratio=ratio)


@dataclass(frozen=True)
class _Fitted:
    booster: lgb.Booster
    names: list[str]  # the booster's features ("const" when every group is ablated)
    best_iteration: int
    X: np.ndarray  # row i: row order[i] of the frame (the fitted and the held-out rows)
    order: np.ndarray
    frame_rows: int
    data: _TrainData | None = None  # its binned datasets (None for the constant model)
    scorer: Scorer | None = None  # its trees compiled (`compiled`); None: LightGBM's predict

    def compiled(
        self, compile_trees: BoosterCompiler | None, levels: Mapping[str, Sequence[str]]
    ) -> _Fitted:
        """This fit scoring with its trees compiled by `compile_trees` (itself without one,
        for the constant model, or when they cannot be compiled)."""
        if compile_trees is None or self.names == ["const"]:
            return self
        scorer = compile_trees(self.booster, levels)
        return self if scorer is None else replace(self, scorer=scorer)

    def predict(self, num_threads: int, rows: np.ndarray | None = None) -> np.ndarray:
        """The booster's output on these rows of the frame (NaN on rows not in `X` when
        None); ``rows`` must be rows of `X`."""
        if rows is None:
            out = np.full(self.frame_rows, np.nan)
            out[self.order] = self._score(self.X, num_threads)
            return out
        at = np.full(self.frame_rows, -1, np.int64)
        at[self.order] = np.arange(len(self.order))
        return self._score(self.X[at[rows]], num_threads)

    def _score(self, X: np.ndarray, num_threads: int) -> np.ndarray:
        if self.scorer is not None:
            return self.scorer(X)
        return np.asarray(self.booster.predict(X, num_threads=num_threads))


def _levels(frame: pd.DataFrame, names: Sequence[str]) -> dict[str, list[str]]:
    """Category levels of the booster's categorical features: the closed vocabularies, and the
    open ones (model type, hardware type) as seen in training."""
    levels = {c: list(v) for c, v in F.CATEGORIES.items() if c in names}
    levels.update(
        {
            c: sorted({str(v) for v in frame[c].dropna().unique()})
            for c in F.OPEN_CATEGORIES
            if c in names
        }
    )
    return levels


@dataclass
class _LeftOut:
    """Held-out rows on types a booster was refitted without (`UNSEEN_TYPES`): their
    log per-device estimates as a ranking makes them for a type no training row had — blind,
    and moved from the lineage's prior on another type by the booster difference (NaN
    elsewhere)."""

    types: list[str]
    blind: np.ndarray
    moved: np.ndarray

    @classmethod
    def fit(
        cls,
        frame: pd.DataFrame,
        X: np.ndarray,
        target: np.ndarray,
        order: np.ndarray,
        fit_idx: np.ndarray,
        calib: np.ndarray,
        metadata: ModelMetadata,
        p: dict[str, Any],
        seed: int,
    ) -> _LeftOut | None:
        """None when no type has enough held-out rows."""
        hw = frame["hardware_type"].to_numpy(object).astype(str)
        types = _types_to_leave_out(frame, hw, calib)
        if not types:
            return None
        at = np.empty(len(frame), np.int64)  # frame row → its row of X
        at[order] = np.arange(len(order))
        names = list(metadata["features"])
        cats = _categorical_positions(names)
        left = np.isin(hw, types)
        rows = _at_most(np.flatnonzero(fit_idx & ~left), UNSEEN_TYPE_ROWS, seed)
        stop = np.flatnonzero(calib & ~left)
        data = _TrainData.of((X[at[rows]], target[rows]), (X[at[stop]], target[stop]), names, cats)
        booster, _best = _train(p, data, NUM_ROUNDS, EARLY_STOP)
        del data
        pairs = metadata.get("pair_effects") or {}
        meta: ModelMetadata = {  # no pair or roofline effects of a type no training row had
            **metadata,
            "pair_effects": {k: v for k, v in pairs.items() if k.split("|", 1)[1] not in types},
        }
        if "roofline" in metadata:
            roofline = LearnedRoofline.from_json(metadata["roofline"]).without_types(types)
            meta["roofline"] = roofline.to_json()
        scored = np.flatnonzero(calib & left)
        blind = np.full(len(frame), np.nan)
        moved = np.full(len(frame), np.nan)
        blind[scored], moved[scored] = ThroughputModel(booster, meta)._log_pd_parts(
            frame.iloc[scored]
        )
        return cls(types, blind, moved)

    def scale(
        self, y: np.ndarray, quantiles: dict[str, list[float]], far: np.ndarray
    ) -> float | None:
        """The conformal `INTERVAL_LEVEL` quantile (at least 1) of these estimates' residuals,
        each over its kind's quantile on its side (a moved one also over its move's width
        `far`); None with fewer than `MIN_TYPE_ROWS`."""
        z = np.concatenate(
            [
                normalised(y - self.blind, *quantiles["model"]),
                normalised((y - self.moved) / far, *quantiles["transfer"]),
            ]
        )
        z = z[np.isfinite(z)]
        if len(z) < MIN_TYPE_ROWS:
            return None
        return round(max(1.0, conformal(z)), 4)


def _types_to_leave_out(frame: pd.DataFrame, hw: np.ndarray, calib: np.ndarray) -> list[str]:
    """The `UNSEEN_TYPES` types of highest peak FLOP/s among those with `MIN_TYPE_ROWS`
    held-out rows."""
    held = pd.Series(hw[calib]).value_counts()
    enough = set(held.index[held >= MIN_TYPE_ROWS])
    peak = pd.Series(f64(frame, "log_peak_tflops"), index=hw).groupby(level=0).max()
    peak = peak[[t in enough for t in peak.index]].sort_values(ascending=False, kind="stable")
    return [str(t) for t in peak.index[:UNSEEN_TYPES]]


def _categorical_positions(names: Sequence[str]) -> list[int]:
    """The positions of the booster's categorical features among ``names``."""
    return [i for i, c in enumerate(names) if c in F.CATEGORIES or c in F.OPEN_CATEGORIES]


def _train_booster(
    X: np.ndarray | None,
    target: np.ndarray,
    names: list[str],
    train_idx: np.ndarray,
    calib: np.ndarray | None,
    p: dict[str, Any],
    num_rounds: int,
    progress: Callable[[int, int], None] | None,
    order: np.ndarray,
    data: _TrainData | None = None,
) -> _Fitted:
    """LightGBM on `target` (log per-device rate minus the physics offset) of the training
    rows (early stopping on the calibration rows when there are). Row i of `X` is row
    ``order[i]`` of the frame: the training rows, then the calibration rows. ``data``: the
    binned datasets of an earlier fit on the same `X`, given the new target (binning a
    year's matrix once is enough)."""
    if X is None:  # every booster group ablated: a constant (the mean), still a valid text model
        X = np.zeros((len(target), 1))
        booster = lgb.train({**p, "min_data_in_leaf": 1}, lgb.Dataset(X, target), num_boost_round=1)
        return _Fitted(booster, ["const"], 1, X, np.arange(len(target)), len(target))
    callbacks: list[Callable[..., None]] = []
    if progress is not None:

        def _cb(env: lgb.callback.CallbackEnv) -> None:
            progress(env.iteration + 1, env.end_iteration)

        callbacks.append(_cb)
    n_train = int(train_idx.sum())
    ordered = target[order]
    if data is None:
        cats = _categorical_positions(names)
        valid = None if calib is None else (X[n_train:], ordered[n_train:])
        data = _TrainData.of((X[:n_train], ordered[:n_train]), valid, names, cats)
    else:
        data.relabel(ordered[:n_train], ordered[n_train:])
    booster, best = _train(p, data, num_rounds, EARLY_STOP, callbacks)
    return _Fitted(booster, names, best, X, order, len(target), data)


@dataclass
class _TrainData:
    """LightGBM datasets of the training and the early-stopping rows of one matrix, binned
    once; `relabel` sets another target on the same rows."""

    train: lgb.Dataset
    valid: lgb.Dataset | None

    @classmethod
    def of(
        cls,
        train: tuple[np.ndarray, np.ndarray],
        valid: tuple[np.ndarray, np.ndarray] | None,
        names: list[str],
        cats: list[int],
    ) -> _TrainData:
        """From (matrix, target) of the training and the validation rows."""
        dtrain = lgb.Dataset(
            *train, feature_name=names, categorical_feature=cats, free_raw_data=True
        )
        dvalid = None if valid is None else lgb.Dataset(*valid, reference=dtrain)
        return cls(dtrain, dvalid)

    def relabel(self, train: np.ndarray, valid: np.ndarray) -> None:
        self.train.set_label(train)
        if self.valid is not None:
            self.valid.set_label(valid)


def _train(
    p: dict[str, Any],
    data: _TrainData,
    rounds: int,
    early_stop: int,
    callbacks: list[Callable[..., None]] | None = None,
) -> tuple[lgb.Booster, int]:
    """LightGBM on the training rows, early stopping on the valid rows when there are; the
    booster cut at its best iteration (what serving and the text artefact keep)."""
    cbs = list(callbacks or [])
    valid_sets = []
    if data.valid is not None:
        valid_sets = [data.valid]
        cbs.append(lgb.early_stopping(early_stop, verbose=False))
    booster = lgb.train(p, data.train, num_boost_round=rounds, valid_sets=valid_sets, callbacks=cbs)
    best = int(booster.best_iteration or booster.current_iteration())
    return lgb.Booster(model_str=booster.model_to_string(num_iteration=best)), best


def _input_dtype(frame: Frame) -> type[np.floating[Any]]:
    """float32 for a training frame, whose columns are float32 already (the same numbers at
    half the memory of a year's matrices), float64 otherwise (serving)."""
    if (
        isinstance(frame, pd.DataFrame)
        and frame.get("log_phys_rate", pd.Series()).dtype == np.float32
    ):
        return np.float32
    return np.float64


def _fit_sample(train: np.ndarray, seed: int) -> np.ndarray:
    """The training rows the boosters fit: all of them, or a seeded uniform `FIT_ROWS` of a
    larger set. On a year of history the trees learn the same splits from a third of it at a
    third of the cost (docs/benchmarks.md); lineage effects, pair effects and the ratio model's
    pairs come from the same rows, calibration from every held-out lineage."""
    rows = np.flatnonzero(train)
    if len(rows) <= FIT_ROWS:
        return train
    keep = np.zeros(len(train), bool)
    keep[np.random.default_rng(seed).choice(rows, FIT_ROWS, replace=False)] = True
    return keep


def _bagging_fraction(fraction: float, rows: int) -> float:
    """The share of rows each tree sees: ``fraction``, but no more than `BAG_ROWS` rows. A tree's
    cost grows with its rows and its split estimates stop improving long before a year of
    history; over the rounds every row still takes part."""
    return min(float(fraction), BAG_ROWS / rows) if rows > 0 else float(fraction)


def _lineage_effects(lineage_ids: np.ndarray | pd.Series, resid: np.ndarray) -> np.ndarray:
    """Per row, its lineage's mean residual shrunk toward zero (`LINEAGE_SHRINK` pseudo-rows):
    the hidden per-lineage factor, which the second fit should not spend trees on."""
    # hashed, not sorted: a year's 10M ids sort in ~13 s, and as fixed-width strings take
    # hundreds of MB beside the objects
    inv, _u = pd.factorize(np.asarray(lineage_ids, dtype=object), use_na_sentinel=False)
    known = np.isfinite(resid)  # rows the booster did not score (a year's sample) count not
    total = np.bincount(inv, np.where(known, resid, 0.0))
    count = np.bincount(inv, known.astype(np.float64))
    return np.asarray((total / (count + LINEAGE_SHRINK))[inv])


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


def _pair_effects(
    fitted: _Fitted,
    frame: pd.DataFrame,
    target: np.ndarray,
    train_idx: np.ndarray,
    num_threads: int,
    seed: int,
) -> tuple[dict[str, float], dict[str, int]]:
    """(model type × hardware) idiosyncrasy the trees cannot reach: the shrunk mean residual of
    the training rows, a table in the metadata added to f at prediction time; and how many
    rows each pair had (of the sample, above `PAIR_SAMPLE` training rows)."""
    tr_rows = np.flatnonzero(train_idx)
    if len(tr_rows) > PAIR_SAMPLE:  # in-sample residuals: a sample is plenty
        tr_rows = np.random.default_rng(seed).choice(tr_rows, PAIR_SAMPLE, replace=False)
    pred_tr = fitted.predict(num_threads, tr_rows)
    return _pair_table(
        frame["model_type"].to_numpy(object)[tr_rows],
        frame["hardware_type"].to_numpy(object)[tr_rows],
        target[tr_rows] - pred_tr,
    )


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


def _matrix(
    frame: Frame,
    names: list[str],
    levels: dict[str, list[str]],
    extra: np.ndarray | None = None,
    base: np.ndarray | None = None,
    luts: dict[str, dict[str, int]] | None = None,
    dtype: type[np.floating[Any]] = np.float64,
) -> np.ndarray:
    """Booster input as one float matrix (categoricals as level codes, unseen → NaN). With
    `extra` (row positions), those rows again below, on their prior hardware ("o_" columns).
    Job-level categoricals are encoded once per job, not per candidate row. No pandas on the
    way into LightGBM. `base`: only these rows of the frame on top (all when None). `luts`:
    level → code dicts of `levels` (the model keeps them; built here when not given)."""
    n = len(frame) if base is None else len(base)
    ne = 0 if extra is None else len(extra)
    X = np.empty((n + ne, len(names)), dtype)
    if names == ["const"]:
        X[:] = 0.0
        return X
    job_first: np.ndarray | None = None
    job_inv: np.ndarray | None = None
    for i, c in enumerate(names):
        hw_col = c in F.HW_COLUMNS
        if c in levels:
            lut = luts[c] if luts is not None else {v: j for j, v in enumerate(levels[c])}
            codes = category_codes(frame, c, lut)  # a training frame: one look-up per category
            if codes is None and hw_col:
                codes = codes_of(np.asarray(frame[c], object), lut)
            elif codes is None:  # job-level: one look-up per job
                vals = np.asarray(frame[c], object)
                if job_first is None:
                    job = np.asarray(frame["job"], np.int64)
                    _u, job_first, job_inv = np.unique(job, return_index=True, return_inverse=True)
                assert job_inv is not None
                per_job = vals[job_first][job_inv]
                # "job" numbers one build; a frame concatenated from several builds repeats
                # them, so the shortcut holds only when every row agrees with its job's value
                if np.array_equal(per_job, vals):
                    codes = codes_of(vals[job_first], lut)[job_inv]
                else:
                    codes = codes_of(vals, lut)
            col = np.where(codes >= 0, codes, np.nan)
            X[:n, i] = col if base is None else col[base]
            if ne:
                assert extra is not None
                if hw_col:
                    prior = category_codes(frame, "o_" + c, lut)
                    if prior is None:
                        prior = codes_of(np.asarray(frame["o_" + c], object), lut)
                    oc = prior[extra]
                    X[n:, i] = np.where(oc >= 0, oc, np.nan)
                else:
                    X[n:, i] = col[extra]
        else:
            v = f64(frame, c)
            X[:n, i] = v if base is None else v[base]
            if ne:
                assert extra is not None
                X[n:, i] = f64(frame, "o_" + c)[extra] if hw_col else v[extra]
    return X


def _physics(groups: Sequence[str]) -> bool:
    return "specs" in groups and "config" in groups


def _offset(
    frame: Frame,
    groups: Sequence[str],
    roofline: LearnedRoofline | None,
    prefix: str = "",
    rows: np.ndarray | None = None,
) -> np.ndarray:
    """The physics rate the booster corrects, for `rows` of `frame` (all when None): the
    learned roofline's (core/roofline.py), or for a model without one the fixed-efficiency
    `log_phys_rate` of `features.hw_columns`. Trees then learn an efficiency in a narrow range,
    not a rate spanning ten orders of magnitude, and the hardware ratio starts from physics
    where data is thin. 0 where the physics inputs are missing."""
    n = len(frame) if rows is None else len(rows)
    if not _physics(groups):
        return np.zeros(n)
    if roofline is not None:
        r = roofline.predict(frame, prefix, rows)
    else:
        r = f64(frame, prefix + "log_phys_rate")
        r = r if rows is None else r[rows]
    return np.asarray(np.where(np.isfinite(r), r, 0.0))


PAIR_SAMPLE = 300_000
# A pair with fewer training rows than this (in the pair sample) gets the unseen-pair factor:
# on every candidate of a night, 80 % intervals held 0.75-0.77 on pairs of 0-9 training rows
# against 0.79-0.82 on commoner ones (benchmarks/interval_by_pair.py, seed 11)
RARE_PAIR_ROWS = 10
PAIR_SHRINK = 3.0  # pseudo-rows at zero effect: a pair seen once moves a third of the way


def _pair_keys(model_type: np.ndarray, hw: np.ndarray) -> pd.Index:
    return pd.Index(pd.Series(model_type).astype(str) + "|" + pd.Series(hw).astype(str))


def _pair_table(
    model_type: np.ndarray, hw: np.ndarray, resid: np.ndarray
) -> tuple[dict[str, float], dict[str, int]]:
    """Per pair, its shrunk mean residual and its number of rows."""
    keys = _pair_keys(model_type, hw)
    g = pd.Series(resid).groupby(keys.to_numpy()).agg(["sum", "count"])
    eff = g["sum"] / (g["count"] + PAIR_SHRINK)
    effects = {str(k): round(float(v), 6) for k, v in eff.items()}
    return effects, {str(k): int(v) for k, v in g["count"].items()}
