"""The main booster's input matrix and the physics rate it corrects (its offset)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd

from leap_stream.core import features as F
from leap_stream.core.columns import (
    Frame,
    category_codes,
    codes_of,
    f64,
)
from leap_stream.core.roofline import LearnedRoofline


def _input_dtype(frame: Frame) -> type[np.floating[Any]]:
    """float32 for a training frame, whose columns are float32 already (the same numbers at
    half the memory of a year's matrices), float64 otherwise (serving)."""
    if (
        isinstance(frame, pd.DataFrame)
        and frame.get("log_phys_rate", pd.Series()).dtype == np.float32
    ):
        return np.float32
    return np.float64


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
    where data is thin. Where the job's configuration is missing (a benchmark table without
    it), the datasheets' geometric mean of peak FLOP/s and bandwidth; 0 without specs."""
    n = len(frame) if rows is None else len(rows)
    if not _physics(groups):
        return np.zeros(n)
    if roofline is not None:
        r = roofline.predict(frame, prefix, rows)
    else:
        r = f64(frame, prefix + "log_phys_rate")
        r = r if rows is None else r[rows]
    known = np.isfinite(r)
    if known.all():  # a fleet's jobs carry their configuration: no fallback to compute
        return np.asarray(r)
    spec = 0.5 * (f64(frame, prefix + "log_peak_tflops") + f64(frame, prefix + "log_mem_bw"))
    spec = spec if rows is None else spec[rows]
    return np.asarray(np.where(known, r, np.where(np.isfinite(spec), spec, 0.0)))
