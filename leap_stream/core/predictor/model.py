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
  pipeline, code quality) cancels in a ratio, which a model of absolute throughput cannot see.
  Where the pairs hold fewer than `RATIO_MIN_MODEL_TYPES` model types, or too few of them
  carry the job's work per sample (`RATIO_MIN_CONFIGURED`), g is the type-pair effects
  instead (`type_pairs`: shrunk medians over the physics ratio, decision 0012);
* no history: f(job, candidate) (`model`).

The main booster is fitted twice: the second time on targets with each lineage's own shrunk
mean residual taken out, so the trees spend themselves on hardware and configuration instead
of on the hidden per-lineage factor (σ ≈ 0.25 in log), which is noise for every ratio.

f(job, B) and f(job, candidate) come from ONE main-booster call on the stacked rows; the ratio
model scores the transfer rows in one call of its own.

Intervals: the one calibration of core/intervals.py, on lineages held out of the booster fit,
each held-out row under the anchor kind it had (docs/decisions/0017).

On disk (store/artefact.py) the model is LightGBM's text format (`model_text`, never pickle)
and its metadata (version, trained_at, data window, features, categories, intervals, metrics);
this module does no file I/O.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import lightgbm as lgb
import numpy as np
import pandas as pd

from leap_stream.contracts.vocab import FAMILIES, VENDORS
from leap_stream.core import features as F
from leap_stream.core.columns import (
    Frame,
    column_codes,
    f64,
    value_ids,
)
from leap_stream.core.intervals import (
    MIN_BUCKET_ROWS,
    MIN_TYPE_ROWS,
    Calibration,
    ScaleOffsets,
    bin_quantiles,
    calibration_bin,
    crosses_vendor,
    devices_changed,
    fit_calibration,
    kind_quantiles,
    scale_terms,
    sigma,
)
from leap_stream.core.predictor.fit import (
    _bagging_fraction,
    _fit_sample,
    _LeftOut,
    _levels,
    _lineage_effects,
    _train,
    _train_booster,
    _TrainData,
)
from leap_stream.core.predictor.matrix import _input_dtype, _matrix, _offset, _physics
from leap_stream.core.predictor.metadata import ModelMetadata, _metadata, check_model_text
from leap_stream.core.predictor.pair_levels import fit_pair_levels
from leap_stream.core.predictor.pairs import PairTables, _pair_effects
from leap_stream.core.predictor.params import (
    COMPILED_KIND,
    DEFAULT_PARAMS,
    KINDS,
    LIGHTGBM_KIND,
    LOG_FLOAT_MAX,
    NUM_ROUNDS,
    PHYSICS_RATIO,
    RATIO_EARLY_STOP,
    RATIO_PAIRS,
    RATIO_PARAMS,
    RATIO_ROUNDS,
    BoosterCompiler,
    Scorer,
    _threads,
    anchor_kind,
    holdout_mask,
    lightgbm_predict,
    predict_threads,
)
from leap_stream.core.predictor.ratio import (
    _at_most,
    _derived,
    _level_name,
    _ratio_matrix,
    _reversed_pairs,
    _trees_can_learn,
    ratio_features,
)
from leap_stream.core.predictor.type_pairs import TypePairEffects
from leap_stream.core.roofline import LearnedRoofline


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
        # (model type × hardware) tables: two integer look-ups per row
        self._pairs = PairTables.of(
            metadata.get("pair_effects") or {},
            metadata.get("pair_rows") or {},
            metadata.get("pair_levels") or {},
        )
        self._luts = {c: {v: i for i, v in enumerate(lv)} for c, lv in self._levels.items()}
        tp = metadata.get("type_pair_effects")
        self._type_pairs = TypePairEffects.from_json(tp) if tp else None
        q = metadata["residual_quantiles"]
        self._qlo = np.asarray([q[k][0] for k in KINDS], np.float64)
        self._qhi = np.asarray([q[k][1] for k in KINDS], np.float64)
        # the interval calibration; a model without one (trained before it) gives each anchor
        # kind's residual quantiles, the same for every row
        cal = metadata.get("calibration")
        self._calibration: Calibration | None = cal
        self._type_code: dict[str, int] = {}
        if cal is not None:
            self._offsets = ScaleOffsets.of(cal)
            self._type_code = self._offsets.type_code
            self._bin_lo, self._bin_hi = bin_quantiles(cal)

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
        return lightgbm_predict(self.ratio, X, predict_threads(len(X)))

    def score_lightgbm(self, X: np.ndarray) -> np.ndarray:
        """LightGBM's own predict, whatever `score` is (the reference a scorer is checked on)."""
        return lightgbm_predict(self.booster, X, predict_threads(len(X)))

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
        pair_levels = None
        if roofline is not None and "prior" in groups:  # the moves of transfer rows
            pair_levels = fit_pair_levels(frame, lineage_ids, y - offset, train_idx)
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
        if pair_levels:
            metadata["pair_levels"] = pair_levels
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
            model = model._with_ratio_model(frame, y, train_idx, calib, seed, lineage_ids)
        model._calibrate(frame, y, calib if calib is not None else train_idx, left_out)
        return cls(booster, model.metadata, ratio=model.ratio)

    def _with_ratio_model(
        self,
        frame: pd.DataFrame,
        y: np.ndarray,
        train_idx: np.ndarray,
        calib: np.ndarray | None,
        seed: int,
        lineage_ids: np.ndarray | pd.Series,
    ) -> ThroughputModel:
        """This model with a ratio model fitted on the pairs in `frame` (rows whose lineage
        had run on another type before), one of two (docs/decisions/0012): trees over the
        physics ratio, where the pairs can teach them (`_trees_can_learn`); else the
        type-pair effects. Itself without a pair."""
        pair = np.isfinite(frame["other_log_pd"].to_numpy(np.float64))
        if not (pair & train_idx).any():
            return self
        rows = _at_most(np.flatnonzero(pair), RATIO_PAIRS, seed)
        pf = frame.iloc[rows].reset_index(drop=True)
        blind, _rows, prior_f, physics = self._booster_parts(pf)
        other = pf["other_log_pd"].to_numpy(np.float64)
        # what the physics ratio misses; every pair also seen from its other side, below it:
        # the ratio B/A is the inverse of A/B, and a lineage mostly moved one way (decision 0001)
        target = np.concatenate([y[rows] - other - physics, other - y[rows] + physics])
        tr = np.tile(train_idx[rows], 2)
        meta: ModelMetadata = {**self.metadata, "ratio_base": PHYSICS_RATIO}
        compiled = self.score if self.scorer_kind != LIGHTGBM_KIND else None
        if not _trees_can_learn(pf, train_idx[rows], int((pair & train_idx).sum())):
            levels = self._type_pair_levels()
            codes = levels.codes(pf)
            codes = codes.stacked(codes.reversed())
            groups = np.tile(np.asarray(lineage_ids, object)[rows], 2)
            kinds = np.tile(pf["model_type"].to_numpy(object), 2)
            effects = levels.fit(np.where(tr, target, np.nan), codes, groups, kinds)
            meta["type_pair_effects"] = effects.to_json()
            return type(self)(self.booster, meta, compiled, self.scorer_kind)
        names = ratio_features(self.feature_names)
        X = np.empty((2 * len(rows), len(names)), np.float32)
        derived = _derived(blind, prior_f, other)
        X[: len(rows)] = _ratio_matrix(
            pf, names, derived, self._levels, self._luts, dtype=np.float32
        )
        own_residual = y[rows] - blind  # the lineage on the candidate, against f(job, candidate)
        _reversed_pairs(X[: len(rows)], names, own_residual, out=X[len(rows) :])
        cats = [i for i, c in enumerate(names) if _level_name(c) in self._levels]
        rp = {**RATIO_PARAMS, "num_threads": _threads(len(rows)), "seed": seed}
        va = np.tile(calib[rows], 2) if calib is not None else np.zeros(2 * len(rows), bool)
        valid = (X[va], target[va]) if va.sum() >= MIN_BUCKET_ROWS else None
        data = _TrainData.of((X[tr], target[tr]), valid, names, cats)
        ratio, best = _train(rp, data, RATIO_ROUNDS, RATIO_EARLY_STOP)
        meta = {**meta, "ratio_features": names, "ratio_best_iteration": best}
        return type(self)(self.booster, meta, compiled, self.scorer_kind, ratio)

    def _type_pair_levels(self) -> TypePairEffects:
        """Zero type-pair effects over the types, vendors and families this model knows."""
        return TypePairEffects.levels_of(
            self._levels.get("hardware_type", []),
            list(VENDORS),
            list(FAMILIES),
        )

    def _calibrate(
        self,
        frame: pd.DataFrame,
        y: np.ndarray,
        cal: np.ndarray,
        left_out: _LeftOut | None = None,
    ) -> None:
        """The interval calibration and calibration figures on held-out lineages, each row
        under the anchor kind its ranking used (into the metadata); `left_out`'s rows calibrate
        a type with too few held-out rows of its own."""
        cf = frame.loc[cal]
        yc = y[cal]
        blind, moved = self._log_pd_parts(cf)
        kind = anchor_kind(cf, self.groups)
        pred = np.choose(kind, [cf["self_log_pd"].to_numpy(np.float64), moved, blind])
        # a row calibrates the anchor kind it had, no other: its type was chosen on what
        # another anchor did not know (an own prior, as a transfer: docs/decisions/0017)
        resid = {k: np.where(kind == i, yc - pred, np.nan) for i, k in enumerate(KINDS)}
        ape = np.abs(np.expm1(pred - yc))
        self.metadata["residual_quantiles"] = kind_quantiles(resid)
        self.metadata["calibration"] = self._one_calibration(
            cf, yc - pred, kind, moved, left_out, frame, y
        )
        self.metadata["metrics"] = {
            "calib_rows": int(cal.sum()),
            "calib_accuracy_10pct": float(np.mean(ape <= 0.10)),
            "calib_mape": float(np.mean(ape)),
            "calib_rows_by_kind": {k: int(np.isfinite(v).sum()) for k, v in resid.items()},
        }

    def _one_calibration(
        self,
        cf: pd.DataFrame,
        resid: np.ndarray,
        kind: np.ndarray,
        moved: np.ndarray,
        left_out: _LeftOut | None,
        frame: pd.DataFrame,
        y: np.ndarray,
    ) -> Calibration:
        """The one calibration (core/intervals.py): the held-out rows (`resid` under their
        anchor `kind`), and as a few-rows type the rows of the types left out of a refit, each
        under the anchor kind it had."""
        hw = cf["hardware_type"].to_numpy(object).astype(str)
        counts = pd.Series(hw).value_counts()
        known = {str(t) for t, n in counts.items() if n >= MIN_TYPE_ROWS}
        few = ~np.isin(hw, list(known))
        fam = cf["family"].to_numpy(object).astype(str)
        parts = [(resid, self._terms(cf, kind, moved, few), hw, fam, kind, few)]
        if left_out is not None:
            # a type left out of the refit: every pair of it was rare there, and it had few rows
            rows = np.isfinite(left_out.blind)
            lf = frame.loc[rows]
            lhw = lf["hardware_type"].to_numpy(object).astype(str)
            lfam = lf["family"].to_numpy(object).astype(str)
            ones = np.ones(int(rows.sum()), bool)
            lkind = anchor_kind(lf, self.groups)
            lmoved = left_out.moved[rows]
            # a row with its own prior on the left-out type calibrates nothing here (NaN)
            r = y[rows] - np.choose(lkind, [np.full(len(lf), np.nan), lmoved, left_out.blind[rows]])
            t = self._terms(lf, lkind, lmoved, ones, rare=ones)
            parts.append((r, t, lhw, lfam, lkind, ones))
        r = np.concatenate([p[0] for p in parts])
        terms = np.concatenate([p[1] for p in parts])
        types = np.concatenate([p[2] for p in parts])
        families = np.concatenate([p[3] for p in parts])
        bins = np.concatenate([calibration_bin(p[4], p[5]) for p in parts])
        return fit_calibration(r, terms, types, families, bins, known)

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
            if self._type_pairs is not None:  # the ratio model's effects form
                codes = self._type_pairs.codes(frame, rows)
                new = self._type_pairs.new_model_types(frame, rows)
                moved[rows] = other_lpd + physics + self._type_pairs.predict(codes, new)
            elif self.ratio is not None:  # its trees form
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
            if self._pairs.lineages.any():
                moved[rows] = other_lpd + self._pairs.level_move(
                    frame, rows, moved[rows] - other_lpd, physics
                )
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
        mt_code = column_codes(frame, "model_type", self._pairs.mt) if self._pairs.mt else None
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
        hc = column_codes(frame, hw_col, self._pairs.hw)
        return np.asarray(self._pairs.effect[mt_code, hc])  # -1 → the zero padding row / column

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
        if self._calibration is not None:
            lo, hi = self._calibrated(frame, kind, moved)
        else:
            lo, hi = self._qlo[kind], self._qhi[kind]
        low = np.exp(log_total + lo - widen)
        # a job far outside the support (widen ~ 700 log units) must still get a number
        high = np.exp(np.fmin(log_total + hi + widen, LOG_FLOAT_MAX))
        return p50, low, high

    def _calibrated(
        self, frame: Frame, kind: np.ndarray, moved: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        """(low, high) log offsets of each row's interval from the model's one calibration."""
        assert self._calibration is not None
        type_code = column_codes(frame, "hardware_type", self._type_code)
        few = type_code < 0
        family_code = column_codes(frame, "family", self._offsets.family_code)
        terms = self._terms(frame, kind, moved, few)
        s = sigma(self._calibration, terms, self._offsets.at(type_code, family_code, terms))
        b = calibration_bin(kind, few)
        return self._bin_lo[b] * s, self._bin_hi[b] * s

    def _terms(
        self,
        frame: Frame,
        kind: np.ndarray,
        moved: np.ndarray,
        few: np.ndarray,
        rare: np.ndarray | None = None,
    ) -> np.ndarray:
        """The scale model's inputs (`intervals.scale_terms`) of ``frame``'s rows, ``moved``
        their priors moved to the candidate; ``rare``: whether their pair counts as rare (the
        model's pair row counts when None)."""
        return scale_terms(
            kind,
            moved - f64(frame, "other_log_pd"),
            crosses_vendor(frame),
            self.rare_pairs(frame) if rare is None else rare,
            devices_changed(frame),
            few,
        )

    def rare_pairs(self, frame: Frame) -> np.ndarray:
        """Per row: its (model type × hardware) pair had fewer than `RARE_PAIR_ROWS` training
        rows."""
        mt = column_codes(frame, "model_type", self._pairs.mt)
        hc = column_codes(frame, "hardware_type", self._pairs.hw)
        return np.asarray(~self._pairs.common[mt, hc])

    def few_measurements(self, frame: Frame) -> np.ndarray:
        """Per row: its hardware type had too few held-out measurements for an offset of its
        own (its interval is calibrated on the types left out of a refit); False for a model
        without a calibration."""
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
