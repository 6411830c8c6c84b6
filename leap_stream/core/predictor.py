"""`ThroughputModel`: LightGBM on log per-device throughput, corrected from the best prior.

Target: log(samples_per_s / num_devices) − `features.base_log` (the lineage's own prior on the
candidate, else its prior elsewhere moved by the model type's aggregate ratio, else the
aggregate, else a roofline). Boosting a residual from a strong offset keeps predictions smooth
where the history is good, instead of piecewise-constant in a 10⁶-wide throughput range.

Intervals: split-conformal quantiles of the log residual per kind of offset (`BASE_KINDS`:
self / other type / aggregate / roofline / none), computed on lineages held out of the booster fit, so the nominal 80 % is
calibrated by construction (the backtest reports the realised coverage).

Artefact: a directory with `model.txt` (LightGBM text format, never pickle) and
`metadata.json` (version, trained_at, data window, features, categories, intervals, metrics).
"""

from __future__ import annotations

import hashlib
import os
import zlib
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import lightgbm as lgb
import numpy as np
import orjson
import pandas as pd

from leap_stream.core import features as F

INTERVAL_LEVEL = 0.8
_QLO, _QHI = (1 - INTERVAL_LEVEL) / 2, 1 - (1 - INTERVAL_LEVEL) / 2
N_BUCKETS = len(F.BASE_KINDS)
MIN_BUCKET_ROWS = 30

DEFAULT_PARAMS: dict[str, Any] = {
    "objective": "huber",
    "alpha": 0.3,  # huber delta in log units: robust to the odd straggler measurement
    "learning_rate": 0.1,
    "num_leaves": 31,
    "min_data_in_leaf": 100,
    "feature_fraction": 0.9,
    "bagging_fraction": 0.8,
    "bagging_freq": 1,
    "lambda_l2": 5.0,
    "max_bin": 255,
    "cat_smooth": 10.0,
    "max_cat_to_onehot": 8,
    "verbose": -1,
}
NUM_ROUNDS = 400
EARLY_STOP = 40


def _threads(rows: int) -> int:
    """OpenMP threads: one for small work (spinning threads cost more than they save on a
    shared 2-core box), up to two for big training sets."""
    return 1 if rows < 200_000 else max(1, min(2, os.cpu_count() or 1))


def holdout_mask(lineage_ids: np.ndarray | pd.Series, fraction: float, seed: int = 0) -> np.ndarray:
    """Deterministic split by lineage (rows of one lineage share history; keep them together)."""
    salt = str(seed).encode()
    h = np.fromiter(
        (zlib.crc32(salt + str(x).encode()) for x in np.asarray(lineage_ids, dtype=object)),
        np.uint64,
        count=len(lineage_ids),
    )
    return np.asarray((h % 10_000) < int(fraction * 10_000))


class ThroughputModel:
    def __init__(self, booster: lgb.Booster, metadata: dict[str, Any]) -> None:
        self.booster = booster
        self.metadata = metadata
        self.feature_names: list[str] = list(metadata["features"])
        self.groups: list[str] = list(metadata["groups"])
        self._levels: dict[str, list[str]] = {k: list(v) for k, v in metadata["categories"].items()}
        q = metadata["residual_quantiles"]
        self._qlo = np.asarray([q[str(b)][0] for b in range(N_BUCKETS)], np.float64)
        self._qhi = np.asarray([q[str(b)][1] for b in range(N_BUCKETS)], np.float64)

    @property
    def version(self) -> str:
        return str(self.metadata["version"])

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
    ) -> ThroughputModel:
        """Fit on (job × hardware it ran on) rows; `samples_per_s` is the measured whole-job rate."""
        groups = [g for g in F.GROUPS if g in groups]
        names = F.feature_names(groups)  # + base_kind, added by _matrix
        levels = {
            c: sorted({str(v) for v in frame[c].dropna().unique()})
            for c in F.OPEN_CATEGORIES
            if c in names
        }
        base, kind = F.base_log(frame, groups)
        X = _matrix(frame, names, levels, kind)
        y = np.log(np.asarray(samples_per_s, np.float64)) - frame["log_devices"].to_numpy()
        target = y - base
        calib = holdout_mask(lineage_ids, calib_fraction, seed) if len(frame) >= 400 else None
        if calib is not None and (calib.all() or not calib.any()):
            calib = None
        p = {**DEFAULT_PARAMS, **(params or {}), "num_threads": _threads(len(frame)), "seed": seed}
        callbacks: list[Callable[..., None]] = []
        if progress is not None:

            def _cb(env: lgb.callback.CallbackEnv) -> None:
                progress(env.iteration + 1, env.end_iteration)

            callbacks.append(_cb)
        train_idx = ~calib if calib is not None else np.ones(len(frame), bool)
        dtrain = lgb.Dataset(X[train_idx], target[train_idx], free_raw_data=True)
        valid_sets = []
        if calib is not None:
            dvalid = lgb.Dataset(X[calib], target[calib], reference=dtrain)
            valid_sets = [dvalid]
            callbacks.append(lgb.early_stopping(EARLY_STOP, verbose=False))
        booster = lgb.train(
            p, dtrain, num_boost_round=num_rounds, valid_sets=valid_sets, callbacks=callbacks
        )
        cal = calib if calib is not None else train_idx
        pred = booster.predict(X[cal], num_iteration=booster.best_iteration or None)
        resid = target[cal] - pred
        bucket = kind[cal]
        quantiles = _bucket_quantiles(resid, bucket)
        cal_ape = np.abs(np.expm1(-resid))  # |pred - y| / y in linear space
        trained_at = datetime.now(UTC)
        digest = hashlib.sha256(booster.model_to_string().encode()).hexdigest()[:8]
        metadata: dict[str, Any] = {
            "version": trained_at.strftime("%Y%m%dT%H%M%SZ") + "-" + digest,
            "trained_at": trained_at.isoformat().replace("+00:00", "Z"),
            "data_window": list(data_window) if data_window else None,
            "rows": len(frame),
            "features": names,
            "groups": groups,
            "categories": levels,
            "target": "log(samples_per_s / num_devices) - base_log",
            "interval_level": INTERVAL_LEVEL,
            "residual_quantiles": quantiles,
            "best_iteration": int(booster.best_iteration or booster.current_iteration()),
            "params": {k: v for k, v in p.items() if k != "num_threads"},
            "metrics": {
                "calib_rows": int(cal.sum()),
                "calib_accuracy_10pct": float(np.mean(cal_ape <= 0.10)),
                "calib_mape": float(np.mean(cal_ape)),
            },
        }
        if booster.best_iteration:
            booster = lgb.Booster(
                model_str=booster.model_to_string(num_iteration=booster.best_iteration)
            )
        return cls(booster, metadata)

    # --- serving
    def predict(self, frame: pd.DataFrame) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(p50, p10, p90) whole-job samples/s, one booster call for the whole frame."""
        if len(frame) == 0:
            e = np.empty(0)
            return e, e, e
        base, kind = F.base_log(frame, self.groups)
        X = _matrix(frame, self.feature_names, self._levels, kind)
        resid = self.booster.predict(X, num_threads=_threads(len(frame)))
        log_total = base + resid + frame["log_devices"].to_numpy(np.float64)
        b = np.clip(kind, 0, N_BUCKETS - 1)
        p50 = np.exp(log_total)
        return p50, np.exp(log_total + self._qlo[b]), np.exp(log_total + self._qhi[b])

    # --- artefact
    def save(self, directory: str | os.PathLike[str]) -> Path:
        d = Path(directory)
        d.mkdir(parents=True, exist_ok=True)
        self.booster.save_model(str(d / "model.txt"))
        (d / "metadata.json").write_bytes(
            orjson.dumps(self.metadata, option=orjson.OPT_INDENT_2 | orjson.OPT_SERIALIZE_NUMPY)
        )
        return d

    @classmethod
    def load(cls, directory: str | os.PathLike[str]) -> ThroughputModel:
        d = Path(directory)
        metadata = orjson.loads((d / "metadata.json").read_bytes())
        booster = lgb.Booster(model_file=str(d / "model.txt"))
        return cls(booster, metadata)


def _matrix(
    frame: pd.DataFrame, names: list[str], levels: dict[str, list[str]], kind: np.ndarray
) -> pd.DataFrame:
    X = frame[names].copy()
    X["base_kind"] = kind
    for c, lv in levels.items():
        if c in X:
            v = X[c].astype(object)
            X[c] = pd.Categorical(v.where(v.isin(lv)), categories=lv)  # unseen level → NaN
    return X


def _bucket_quantiles(resid: np.ndarray, bucket: np.ndarray) -> dict[str, list[float]]:
    """Per-bucket (q10, q90) of the log residual y − ŷ; sparse buckets use the pooled value."""
    finite = np.isfinite(resid)
    pooled = (
        [float(np.quantile(resid[finite], _QLO)), float(np.quantile(resid[finite], _QHI))]
        if finite.any()
        else [-0.5, 0.5]
    )
    out: dict[str, list[float]] = {}
    for b in range(N_BUCKETS):
        r = resid[finite & (bucket == b)]
        if len(r) >= MIN_BUCKET_ROWS:
            # finite-sample conformal correction: the ceil((n+1)q)/n empirical quantile
            n = len(r)
            lo = float(np.quantile(r, max(0.0, np.floor((n + 1) * _QLO) / n)))
            hi = float(np.quantile(r, min(1.0, np.ceil((n + 1) * _QHI) / n)))
            out[str(b)] = [lo, hi]
        else:
            out[str(b)] = [min(pooled[0], -0.05), max(pooled[1], 0.05)]
    return out
