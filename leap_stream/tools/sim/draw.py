"""Small sampling and bookkeeping helpers of the fleet simulator."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
import pandas as pd
import pyarrow as pa

F64 = npt.NDArray[np.float64]
I64 = npt.NDArray[np.int64]


def _multi_hw(dataset: pd.DataFrame) -> int:
    if dataset.empty:
        return 0
    measured = dataset[dataset["samples_per_s"].notna()]
    return int((measured.groupby("lineage_id")["hardware_type"].nunique() > 1).sum())


_DEFAULT_STR = pd.Series(["x"]).dtype  # pandas 3: arrow-backed "str"; pandas 2: object


def _strings(values: list[str] | pa.Array) -> Any:
    """A string column in pandas' default string dtype, built through Arrow (no per-item boxing)."""
    arr = values if isinstance(values, pa.Array) else pa.array(values, pa.string())
    if isinstance(_DEFAULT_STR, np.dtype):
        return arr.to_numpy(zero_copy_only=False)
    return pd.array(arr, dtype=_DEFAULT_STR)


def _take(categories: list[str] | tuple[str, ...], codes: np.ndarray[Any, Any]) -> Any:
    return _strings(pa.array(list(categories), pa.string()).take(pa.array(codes)))


def _pow2_floor(x: F64) -> F64:
    return np.asarray(2.0 ** np.floor(np.log2(np.maximum(x, 1.0))), dtype=np.float64)


def _pow2_ceil(x: F64) -> F64:
    return np.asarray(2.0 ** np.ceil(np.log2(np.maximum(x, 1.0))), dtype=np.float64)


def _choice_rows(rng: np.random.Generator, probs: F64) -> I64:
    """One categorical draw per row of ``probs`` (rows need not be normalised)."""
    return _choice_rows_u(probs, rng.random(len(probs)))


def _choice_rows_u(probs: F64, u: F64) -> I64:
    cum = np.cumsum(probs, axis=1)
    x = u[:, None] * cum[:, -1:]
    return np.asarray((x > cum).sum(axis=1), dtype=np.int64)


class _Lineages:
    """Struct of arrays: static lineage attributes and their scheduling state."""

    def __init__(self, n_types: int) -> None:
        self.n = 0
        self.n_types = n_types
        self.cols: dict[str, np.ndarray[Any, Any]] = {}

    def append(self, new: dict[str, np.ndarray[Any, Any]]) -> None:
        if not self.cols:
            self.cols = {k: v.copy() for k, v in new.items()}
        else:
            for k, v in new.items():
                self.cols[k] = np.concatenate([self.cols[k], v])
        self.n = len(self.cols["model_idx"])

    def __getitem__(self, k: str) -> np.ndarray[Any, Any]:
        return self.cols[k]

    def __setitem__(self, k: str, v: np.ndarray[Any, Any]) -> None:
        self.cols[k] = v


@dataclass(frozen=True)
class _DayIds:
    """The identifiers of one day's attempts, in the day's time order."""

    job_arr: pa.Array
    lin_id: Any
    attempt: np.ndarray[Any, Any]
    eid_list: list[str]


def _has_prior(
    lin: I64,
    submitted: F64,
    has_thr: npt.NDArray[np.bool_],
    ended: F64,
    min_meas_end: F64,
) -> npt.NDArray[np.bool_]:
    """Whether a measured completion of the lineage ended before each submission.

    Earliest measured end so far (`min_meas_end` per lineage, from earlier days, then an
    exclusive running min inside each lineage's time-ordered submissions of today); updates
    `min_meas_end` in place with today's measured ends."""
    n = len(lin)
    meas_end = np.where(has_thr, ended, np.inf)
    by_lin = np.lexsort((np.arange(n), lin))
    lin_sorted = lin[by_lin]
    first = np.r_[True, lin_sorted[1:] != lin_sorted[:-1]] if n else np.zeros(0, bool)
    shifted = np.r_[np.inf, meas_end[by_lin][:-1]] if n else np.zeros(0)
    shifted[first] = min_meas_end[lin_sorted[first]]
    grp = np.cumsum(first) - 1
    run = pd.Series(shifted).groupby(grp).cummin().to_numpy()
    has_prior = np.zeros(n, dtype=bool)
    has_prior[by_lin] = run < submitted[by_lin]
    np.minimum.at(min_meas_end, lin, meas_end)
    return has_prior


def _dataset_rows(subs: pd.DataFrame, comp: pd.DataFrame) -> pd.DataFrame:
    """The day's dataset rows: each submission's columns beside its completion's, honest
    telemetry (no quarantine) and no probes."""
    from leap_stream.store.offline import DATASET_COLUMNS

    sub_cols = [c for c in subs.columns if c not in ("submission_event_id", "has_prior")]
    merged = pd.concat(
        [
            subs[sub_cols].drop(columns=["num_devices"]),
            comp.drop(columns=["job_id", "attempt", "lineage_id", "model_type"]),
        ],
        axis=1,
    )
    merged["quarantine"] = None  # the simulator's telemetry is honest
    merged["probe"] = None  # every row is an attempt's own run
    return merged[list(DATASET_COLUMNS)]
