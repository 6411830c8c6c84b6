"""(model type × hardware) effects: the shrunk mean residual of each pair's training rows,
added to a prediction, and each pair's row count (the rare-pair interval factor); the model's
per-pair tables (`PairTables`), these and the levels of `pair_levels`."""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np
import pandas as pd

from leap_stream.core.columns import Frame, column_codes, f64
from leap_stream.core.predictor.pair_levels import blended_move

if TYPE_CHECKING:
    from leap_stream.core.predictor.fit import _Fitted

T = TypeVar("T")


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


PAIR_SAMPLE = 300_000
# A pair with fewer training rows than this (in the pair sample) gets the unseen-pair factor:
# on every candidate of a night, 80 % intervals held 0.75-0.77 on pairs of 0-9 training rows
# against 0.79-0.82 on commoner ones (benchmarks/interval_by_pair.py, seed 11)
RARE_PAIR_ROWS = 10
PAIR_SHRINK = 3.0  # pseudo-rows at zero effect: a pair seen once moves a third of the way


def without_types(table: Mapping[str, T], types: Collection[str]) -> dict[str, T]:
    """A per-pair table ("model type|type" keys) without the pairs of ``types`` (a refit that
    leaves them out knows none)."""
    return {k: v for k, v in table.items() if k.split("|", 1)[1] not in types}


def pair_keys(model_type: Any, hw: Any) -> pd.Index:
    """Per row, its pair's key: "model type|hardware type"."""
    return pd.Index(pd.Series(model_type).astype(str) + "|" + pd.Series(hw).astype(str))


def _pair_table(
    model_type: np.ndarray, hw: np.ndarray, resid: np.ndarray
) -> tuple[dict[str, float], dict[str, int]]:
    """Per pair, its shrunk mean residual and its number of rows."""
    keys = pair_keys(model_type, hw)
    g = pd.Series(resid).groupby(keys.to_numpy()).agg(["sum", "count"])
    eff = g["sum"] / (g["count"] + PAIR_SHRINK)
    effects = {str(k): round(float(v), 6) for k, v in eff.items()}
    return effects, {str(k): int(v) for k, v in g["count"].items()}


@dataclass(frozen=True)
class PairTables:
    """A model's per-pair tables, dense over one vocabulary of model types and of types (two
    integer look-ups a row; code -1, an unseen value, reads the zero last row or column):
    the effects, whether a pair is common (`RARE_PAIR_ROWS` rows or more), and the levels
    with their lineages (`pair_levels`)."""

    mt: dict[str, int]
    hw: dict[str, int]
    effect: np.ndarray
    common: np.ndarray
    level: np.ndarray
    lineages: np.ndarray

    @classmethod
    def of(
        cls,
        effects: Mapping[str, float],
        rows: Mapping[str, int],
        levels: Mapping[str, Sequence[float]],
    ) -> PairTables:
        """From the metadata's `pair_effects`, `pair_rows` and `pair_levels` (each may be
        empty: a model without rows counts every pair it has an effect for as common)."""
        split = [k.split("|", 1) for k in [*effects, *levels]]
        mt = {m: i for i, m in enumerate(sorted({m for m, _ in split}))}
        hw = {h: i for i, h in enumerate(sorted({h for _, h in split}))}
        shape = (len(mt) + 1, len(hw) + 1)
        effect, level, lineages = np.zeros(shape), np.zeros(shape), np.zeros(shape)
        common = np.zeros(shape, bool)
        if effects:
            at = _codes(effects, mt, hw)
            effect[at] = np.asarray(list(effects.values()), np.float64)
            common[at] = [rows.get(k, RARE_PAIR_ROWS) >= RARE_PAIR_ROWS for k in effects]
        if levels:
            at = _codes(levels, mt, hw)
            level[at] = [v[0] for v in levels.values()]
            lineages[at] = [v[1] for v in levels.values()]
        return cls(mt, hw, effect, common, level, lineages)

    def level_move(
        self, frame: Frame, rows: np.ndarray, move: np.ndarray, physics: np.ndarray
    ) -> np.ndarray:
        """``move`` (of transfer ``rows``) toward the pair levels' (`pair_levels`); ``physics``:
        the rows' physics ratio, which carries the effects."""
        mt = column_codes(frame, "model_type", self.mt)[rows]
        a = column_codes(frame, "hardware_type", self.hw)[rows]
        b = column_codes(frame, "o_hardware_type", self.hw)[rows]
        return blended_move(
            move,
            physics - self.effect[mt, a] + self.effect[mt, b],
            self.level[mt, a] - self.level[mt, b],
            np.minimum(self.lineages[mt, a], self.lineages[mt, b]),
            f64(frame, "other_log_dev_ratio")[rows] == 0,
        )


def _codes(
    table: Mapping[str, Any], mt: Mapping[str, int], hw: Mapping[str, int]
) -> tuple[list[int], list[int]]:
    split = [k.split("|", 1) for k in table]
    return [mt[m] for m, _ in split], [hw[h] for _, h in split]
