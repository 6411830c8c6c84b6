"""(model type × hardware) effects: the shrunk mean residual of each pair's training rows,
added to a prediction, and each pair's row count (the rare-pair interval factor)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import pandas as pd

if TYPE_CHECKING:
    from leap_stream.core.predictor.fit import _Fitted


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
