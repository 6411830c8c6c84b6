"""Fitting the boosters: the held-out split's bookkeeping, the unseen-type refit, a booster's
training, the fit sample and the lineage effects taken out before the second fit."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import lightgbm as lgb
import numpy as np
import pandas as pd

from leap_stream.core import features as F
from leap_stream.core.columns import (
    f64,
)
from leap_stream.core.intervals import (
    MIN_TYPE_ROWS,
)
from leap_stream.core.predictor.metadata import ModelMetadata
from leap_stream.core.predictor.pairs import without_types
from leap_stream.core.predictor.params import (
    BAG_ROWS,
    EARLY_STOP,
    FIT_ROWS,
    LINEAGE_SHRINK,
    NUM_ROUNDS,
    UNSEEN_TYPE_ROWS,
    UNSEEN_TYPES,
    BoosterCompiler,
    Scorer,
    lightgbm_predict,
)
from leap_stream.core.predictor.ratio import _at_most
from leap_stream.core.roofline import LearnedRoofline


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
        return lightgbm_predict(self.booster, X, num_threads)


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
        meta: ModelMetadata = {  # no pair or roofline effects of a type no training row had
            **metadata,
            "pair_effects": without_types(metadata.get("pair_effects") or {}, types),
            "pair_levels": without_types(metadata.get("pair_levels") or {}, types),
        }
        if "roofline" in metadata:
            roofline = LearnedRoofline.from_json(metadata["roofline"]).without_types(types)
            meta["roofline"] = roofline.to_json()
        scored = np.flatnonzero(calib & left)
        blind = np.full(len(frame), np.nan)
        moved = np.full(len(frame), np.nan)
        from leap_stream.core.predictor.model import ThroughputModel  # fits with this module

        blind[scored], moved[scored] = ThroughputModel(booster, meta)._log_pd_parts(
            frame.iloc[scored]
        )
        return cls(types, blind, moved)


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
