"""The evaluation protocol (fixed; docs/evaluate.md), pure.

For every group, every workload w and every ordered pair of rows (A, B) of one job of w (same
group, workload and the configuration columns the table has) with different accelerator types,
predict B's per-device throughput from A's measurement. Every method is fitted on the pairs of
the table's *other* workloads only: one workload held out at a time up to `FOLDS` workloads,
past that `FOLDS` folds of them (across groups). Per method: MAPE,
median APE, share within ±10 %, and order accuracy: given A, is each pair of other types
(B, C) of the job ordered as measured (a predicted tie counts as half right).

Leave one type out (`leave_out="type"`): every pair into accelerator type T is predicted by
the method fitted on the pairs that touch neither side of T (every workload), as a type on
its first day would be; the figures are reported per type as well.

`model` is the production model (`production.py`: the worker's feature builder and
`ThroughputModel`); the other methods are the baselines of `methods.py`.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from leap_stream.catalog import HardwareCatalog
from leap_stream.tools.evaluate import methods as M
from leap_stream.tools.evaluate import production
from leap_stream.tools.evaluate.metrics import OrderPairs, ape

FP32 = ("fp32",)
LEAVE_OUT = ("workload", "type")
FOLDS = 10  # folds of workloads held out in turn (one workload a fold up to this many)
MODEL = "model"
METHODS = (MODEL, *M.METHODS)


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


def workload_folds(all_pairs: pd.DataFrame) -> list[tuple[np.ndarray, np.ndarray]]:
    """(train, test) masks over the pairs: one workload a fold up to `FOLDS` workloads, past
    that `FOLDS` folds of them, round robin in order of appearance."""
    codes, _names = pd.factorize(all_pairs["workload"].to_numpy(object))
    fold = codes % FOLDS
    return [(fold != k, fold == k) for k in np.unique(fold) if (fold != k).any()]


def predict_held_out(
    all_pairs: pd.DataFrame, method: str, choices: dict[str, Any] | None = None
) -> np.ndarray:
    """Each fold of workloads' pairs predicted by `method` fitted on the other folds' pairs;
    into `choices`, per workload, what the fit that predicted it chose (methods that choose
    nothing add nothing)."""
    pred = np.full(len(all_pairs), np.nan)
    wl = all_pairs["workload"].to_numpy(object)
    for train, test in workload_folds(all_pairs):
        fitted = M.fit(method, all_pairs[train])
        pred[test] = fitted.predict(all_pairs[test])
        if choices is not None and (chosen := M.describe(fitted)) is not None:
            choices.update({str(w): chosen for w in pd.unique(wl[test])})
    return pred


def type_splits(all_pairs: pd.DataFrame) -> list[tuple[np.ndarray, np.ndarray]]:
    """Per type T: (the pairs with T on neither side, the pairs into T); none for a type
    with nothing to learn from."""
    a, b = all_pairs["a_type"].to_numpy(object), all_pairs["b_type"].to_numpy(object)
    splits = [((a != t) & (b != t), b == t) for t in pd.unique(b)]
    return [(train, test) for train, test in splits if train.any()]


def predict_left_out_types(all_pairs: pd.DataFrame, method: str) -> np.ndarray:
    """Each pair into type T predicted by `method` fitted on the pairs with T on neither side."""
    pred = np.full(len(all_pairs), np.nan)
    for train, test in type_splits(all_pairs):
        pred[test] = M.fit(method, all_pairs[train]).predict(all_pairs[test])
    return pred


def _predict(
    rows: pd.DataFrame,
    p: pd.DataFrame,
    catalog: HardwareCatalog,
    method: str,
    leave_out: str,
    choices: dict[str, Any],
) -> np.ndarray:
    """`method`'s held-out predictions of every pair (NaN: none)."""
    if method == MODEL:
        splits = type_splits(p) if leave_out == "type" else workload_folds(p)
        return production.predict(rows, p, catalog, splits)
    if leave_out == "type":
        return predict_left_out_types(p, method)
    return predict_held_out(p, method, choices)


def order_accuracy(p: pd.DataFrame, pred: np.ndarray) -> float:
    """Share of (A; B, C) with B and C of different types ordered as measured."""
    return OrderPairs.of_frame(p).accuracy(pred)


def scores(p: pd.DataFrame, pred: np.ndarray) -> dict[str, float]:
    """The figures of `pred` over the pairs it predicts (a type with no other type to learn
    from is left unpredicted); none when it predicts none."""
    done = np.isfinite(pred)
    if not done.any():
        return {}
    p, pred = p[done], pred[done]
    err = ape(pred, p["log_ratio"].to_numpy(np.float64))
    return {
        "mape": float(np.mean(err)),
        "median_ape": float(np.median(err)),
        "within_10": float(np.mean(err <= 0.10)),
        "order_accuracy": order_accuracy(p, pred),
    }


def _by_type(p: pd.DataFrame, preds: dict[str, np.ndarray]) -> dict[str, Any]:
    """Per accelerator type predicted: its pairs and every method's figures on them."""
    b = p["b_type"].to_numpy(object)
    out: dict[str, Any] = {}
    for t in sorted(pd.unique(b)):
        on = b == t
        if not np.isfinite(next(iter(preds.values()))[on]).any():
            continue
        out[str(t)] = {
            "predictions": int(on.sum()),
            "workloads": int(p.loc[on, "workload"].nunique()),
            "methods": {m: scores(p[on], v[on]) for m, v in preds.items()},
        }
    return out


def evaluate(
    rows: pd.DataFrame,
    catalog: HardwareCatalog,
    methods: tuple[str, ...] = METHODS,
    leave_out: str = "workload",
) -> dict[str, Any]:
    """Figures of every method on one table's rows (see the module docstring)."""
    if leave_out not in LEAVE_OUT:
        raise ValueError(f"leave_out must be one of {LEAVE_OUT}, not {leave_out!r}")
    p = pairs(rows, catalog)
    out: dict[str, Any] = {
        "leave_out": leave_out,
        "predictions": len(p),
        "workloads": int(p["workload"].nunique()),
    }
    choices: dict[str, Any] = {}
    preds = {m: _predict(rows, p, catalog, m, leave_out, choices) for m in methods}
    if leave_out == "type":
        out["by_type"] = _by_type(p, preds)
    out["methods"] = {m: scores(p, v) for m, v in preds.items()}
    out["table_estimator_choices"] = choices
    return out
