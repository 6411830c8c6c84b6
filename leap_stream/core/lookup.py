"""`LookupTable`: median measured throughput by (model type, hardware, device-count bucket).

The baseline the published LEAP system replaced, and our fallback when the model is missing or
fails. Medians are stored per device so a table level can serve any device count; coarser levels
answer when a finer one has no data: (model_type, hw, bucket) → (model_type, hw) → (family, hw).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from leap_stream.core.history import MEASURED_STATUSES

LEVELS = ("model_hw_bucket", "model_hw", "family_hw")
SEP = "\x1f"


def device_bucket(num_devices: np.ndarray) -> np.ndarray:
    """Powers of two: 1, 2, 4, 8, ... (scaling efficiency changes by orders of magnitude)."""
    nd = np.maximum(np.asarray(num_devices, np.float64), 1.0)
    return np.asarray(2 ** np.floor(np.log2(nd)), np.int64)


def _keys(level: str, model_type: Any, family: Any, hw: Any, bucket: np.ndarray) -> pd.Index:
    mt = pd.Series(np.asarray(model_type, dtype=object)).astype(str)
    hws = pd.Series(np.asarray(hw, dtype=object)).astype(str)
    if level == "model_hw_bucket":
        return pd.Index(mt + SEP + hws + SEP + pd.Series(bucket).astype(str))
    if level == "model_hw":
        return pd.Index(mt + SEP + hws)
    fam = pd.Series(np.asarray(family, dtype=object)).astype(str)
    return pd.Index(fam + SEP + hws)


_BY = {
    "model_hw_bucket": ["model_type", "hw", "bucket"],
    "model_hw": ["model_type", "hw"],
    "family_hw": ["family", "hw"],
}


def _labels(values: pd.Series) -> pd.Categorical:
    """A column as a categorical of its labels as `_keys` spells them (``str``; a missing
    value is "nan")."""
    cat = pd.Categorical(values)
    cat = cat.rename_categories(str)
    if cat.isna().any():
        cat = cat.add_categories(["nan"]) if "nan" not in cat.categories else cat
        cat = cat.fillna("nan")
    return cat


class LookupTable:
    def __init__(self, tables: dict[str, dict[str, float]], min_count: int = 1) -> None:
        self.tables = tables
        self.min_count = min_count
        self._index = {
            lv: (pd.Index(list(t.keys())), np.asarray(list(t.values()), np.float64))
            for lv, t in tables.items()
        }

    @classmethod
    def fit(cls, dataset: pd.DataFrame, min_count: int = 1) -> LookupTable:
        """From dataset rows (completions); only measured ones count."""
        sps = dataset["samples_per_s"].to_numpy(np.float64)
        ok = (
            dataset["status"].isin(list(MEASURED_STATUSES)).to_numpy()
            & np.isfinite(sps)
            & (sps > 0)
        )
        d = dataset.loc[ok]
        per_dev = d["samples_per_s"].to_numpy(np.float64) / d["num_devices"].to_numpy(np.float64)
        parts = pd.DataFrame(
            {
                "model_type": _labels(d["model_type"]),
                "family": _labels(d["family"]),
                "hw": _labels(d["hardware_type"]),
                "bucket": device_bucket(d["num_devices"].to_numpy()),
                "per_dev": per_dev,
            }
        )
        tables: dict[str, dict[str, float]] = {}
        for lv in LEVELS:
            # grouped by the columns and keyed per group: a year of rows, a few thousand keys
            s = parts.groupby(_BY[lv], observed=True, sort=False)["per_dev"].agg(
                ["median", "count"]
            )
            s = s[s["count"] >= min_count]
            keys = [SEP.join(str(v) for v in k) for k in s.index]
            tables[lv] = dict(zip(keys, s["median"].astype(float).tolist(), strict=True))
        return cls(tables, min_count)

    def predict(
        self, model_type: Any, family: Any, hardware_type: Any, num_devices: Any
    ) -> tuple[np.ndarray, np.ndarray]:
        """(whole-job samples/s, level index 0..2) per row; NaN and -1 on a miss."""
        nd = np.asarray(num_devices, np.float64)
        n = len(nd)
        bucket = device_bucket(nd)
        out = np.full(n, np.nan)
        level = np.full(n, -1, np.int64)
        for i, lv in enumerate(LEVELS):
            todo = np.isnan(out)
            if not todo.any():
                break
            idx, vals = self._index[lv]
            if len(idx) == 0:
                continue
            keys = _keys(
                lv,
                np.asarray(model_type, dtype=object)[todo],
                np.asarray(family, dtype=object)[todo],
                np.asarray(hardware_type, dtype=object)[todo],
                bucket[todo],
            )
            pos = idx.get_indexer(keys)
            hit = pos >= 0
            rows = np.flatnonzero(todo)[hit]
            out[rows] = vals[pos[hit]] * nd[rows]
            level[rows] = i
        return out, level

    def to_dict(self) -> dict[str, Any]:
        return {"format": "leap-lookup/1", "min_count": self.min_count, "tables": self.tables}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> LookupTable:
        return cls({lv: d["tables"].get(lv, {}) for lv in LEVELS}, int(d.get("min_count", 1)))
