"""The evaluation protocol (fixed; docs/evaluate.md), pure.

For every group, every workload w and every ordered pair of rows (A, B) of one job of w (same
group, workload and the configuration columns the table has) with different accelerator types,
predict B's per-device throughput from A's measurement. Every method is fitted on the pairs of
the table's *other* workloads only (leave one workload out, across groups). Per method: MAPE,
median APE, share within ±10 %, and order accuracy: given A, is each pair of other types
(B, C) of the job ordered as measured (a predicted tie counts as half right).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from leap_stream.catalog import HardwareCatalog
from leap_stream.tools.evaluate import methods as M
from leap_stream.tools.evaluate.metrics import OrderPairs, ape

FP32 = ("fp32",)


def spec_logs(catalog: HardwareCatalog, types: np.ndarray, precision: np.ndarray) -> np.ndarray:
    """(log peak FLOP/s at the row's precision, log memory bandwidth) per row: the fp32 peak
    for fp32 rows when the datasheet gives one, else the bf16/fp16 peak."""
    out = np.empty((len(types), 2))
    for i, (t, p) in enumerate(zip(types, precision, strict=True)):
        s = catalog[str(t)]
        peak = s.peak_fp32_tflops if (p in FP32 and s.peak_fp32_tflops) else s.peak_bf16_tflops
        out[i] = np.log(peak), np.log(s.memory_bandwidth_gbps)
    return out


def pairs(rows: pd.DataFrame, catalog: HardwareCatalog) -> pd.DataFrame:
    """Every ordered pair (A, B) of rows of one job with different types."""
    r = rows.reset_index(drop=True)
    logs = spec_logs(catalog, r["type_id"].to_numpy(object), r["precision"].to_numpy(object))
    idx = np.arange(len(r))
    by_job = pd.DataFrame({"i": idx, "job": r["job"].to_numpy()})
    m = by_job.merge(by_job, on="job", suffixes=("_a", "_b"))
    a, b = m["i_a"].to_numpy(), m["i_b"].to_numpy()
    ty = r["type_id"].to_numpy(object)
    keep = ty[a] != ty[b]
    a, b = a[keep], b[keep]
    out = pd.DataFrame(
        {
            "a": a,
            "b": b,
            "job": r["job"].to_numpy()[a],
            "workload": r["workload"].to_numpy(object)[a],
            "family": r["family"].to_numpy(object)[a],
            "a_type": ty[a],
            "b_type": ty[b],
            "a_vendor": r["vendor"].to_numpy(object)[a],
            "b_vendor": r["vendor"].to_numpy(object)[b],
            "d_log_flops": logs[b, 0] - logs[a, 0],
            "d_log_bw": logs[b, 1] - logs[a, 1],
            "log_ratio": r["log_pd"].to_numpy()[b] - r["log_pd"].to_numpy()[a],
            "log_count_ratio": np.log(r["count"].to_numpy(np.float64)[b])
            - np.log(r["count"].to_numpy(np.float64)[a]),
        }
    )
    for column, parts in M.KEYS.items():  # integer keys: the estimators group on them
        text = out[parts[0]].astype(str)
        for part in parts[1:]:
            text = text + "\x1f" + out[part].astype(str)
        out[column] = pd.factorize(text)[0]
    return out


def predict_held_out(
    all_pairs: pd.DataFrame, method: str, choices: dict[str, Any] | None = None
) -> np.ndarray:
    """Each workload's pairs predicted by `method` fitted on the other workloads' pairs; into
    `choices`, per workload, what the fit chose (methods that choose nothing add nothing)."""
    pred = np.full(len(all_pairs), np.nan)
    wl = all_pairs["workload"].to_numpy(object)
    for w in pd.unique(wl):
        test = wl == w
        fitted = M.fit(method, all_pairs[~test])
        pred[test] = fitted.predict(all_pairs[test])
        if choices is not None and (chosen := M.describe(fitted)) is not None:
            choices[str(w)] = chosen
    return pred


def order_accuracy(p: pd.DataFrame, pred: np.ndarray) -> float:
    """Share of (A; B, C) with B and C of different types ordered as measured."""
    return OrderPairs.of_frame(p).accuracy(pred)


def scores(p: pd.DataFrame, pred: np.ndarray) -> dict[str, float]:
    err = ape(pred, p["log_ratio"].to_numpy(np.float64))
    return {
        "mape": float(np.mean(err)),
        "median_ape": float(np.median(err)),
        "within_10": float(np.mean(err <= 0.10)),
        "order_accuracy": order_accuracy(p, pred),
    }


def evaluate(
    rows: pd.DataFrame, catalog: HardwareCatalog, methods: tuple[str, ...] = M.METHODS
) -> dict[str, Any]:
    """Figures of every method on one table's rows (see the module docstring)."""
    p = pairs(rows, catalog)
    out: dict[str, Any] = {"predictions": len(p), "workloads": int(p["workload"].nunique())}
    choices: dict[str, Any] = {}
    out["methods"] = {
        m: scores(p, predict_held_out(p, m, choices)) if len(p) else {} for m in methods
    }
    out["model_choices"] = choices
    return out
