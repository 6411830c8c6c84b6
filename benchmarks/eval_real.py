"""Cross-hardware prediction on real measurements (Gavel, OSDI 2020), split by model or config.

For each held-out model, every configuration (lineage) measured on a source GPU B is predicted
on each other GPU C, from its measurement on B only:

* model       ThroughputModel trained on the other models (all GPUs), history = {B: measured}
* lookup      LookupTable trained on the other models (family × GPU median; ignores the prior)
* spec-ratio  measured on B × peak-FLOP/s ratio C/B (and the bandwidth ratio, separately)
* ratio_table measured on B × the median C/B ratio of the other models' configurations

Prints one line per method and one JSON line. Usage: .venv/bin/python benchmarks/eval_real.py
"""

from __future__ import annotations

import sys

import numpy as np
import orjson
import pandas as pd

from leap_stream.core import features as F
from leap_stream.core.history import Measurement
from leap_stream.core.lookup import LookupTable
from leap_stream.core.predictor import ThroughputModel
from leap_stream.tools.sim.real import gavel_catalog, load_gavel
from leap_stream.train.trainer import metrics

METHODS = ("model", "lookup", "flops_ratio", "bw_ratio", "ratio_table")
SMALL_DATA = {"min_data_in_leaf": 5, "num_leaves": 15, "learning_rate": 0.05}


def evaluate(table: str = "simulation", split: str = "model") -> dict[str, object]:
    """split "model": leave one model out; "config": 10 folds of configurations (lineages),
    so other batch sizes / placements of the same model are in training."""
    data = load_gavel(table)  # type: ignore[arg-type]
    specs = gavel_catalog().spec_matrix()
    results: dict[str, list[np.ndarray]] = {k: [] for k in METHODS}
    ys: list[np.ndarray] = []
    now = np.zeros(len(data))
    if split == "model":
        group = data["model_type"].to_numpy(object)
    else:
        lin = data["lineage_id"].to_numpy(object)
        codes = pd.factorize(lin)[0]
        perm = np.random.default_rng(0).permutation(codes.max() + 1)
        group = (perm[codes] % 10).astype(object)
    for held in sorted(set(group)):
        train = data[group != held].reset_index(drop=True)
        test = data[group == held].reset_index(drop=True)
        tr_frame = F.build(
            train,
            [[h] for h in train["hardware_type"]],
            [None] * len(train),  # no history: the booster learns f(config, GPU)
            [None] * len(train),
            specs,
            now[: len(train)],
        )
        model = ThroughputModel.fit(
            tr_frame,
            train["samples_per_s"].to_numpy(),
            train["lineage_id"].to_numpy(object),
            params=SMALL_DATA,
            num_rounds=300,
            calib_fraction=0.2,
        )
        lookup = LookupTable.fit(train)
        # pairs (source B, target C) within each held-out lineage
        pairs = test.merge(test, on="lineage_id", suffixes=("_b", "_c"))
        pairs = pairs[pairs["hardware_type_b"] != pairs["hardware_type_c"]].reset_index(drop=True)
        jobs = test.drop_duplicates("lineage_id").set_index("lineage_id").loc[pairs["lineage_id"]]
        jobs = jobs.reset_index()
        hist = [
            {b: Measurement(float(s), int(n), 0.0, 1)}
            for b, s, n in zip(
                pairs["hardware_type_b"],
                pairs["samples_per_s_b"],
                pairs["num_devices_b"],
                strict=True,
            )
        ]
        fr = F.build(
            jobs,
            [[c] for c in pairs["hardware_type_c"]],
            hist,
            [None] * len(jobs),
            specs,
            np.zeros(len(jobs)),
        )
        p50, _lo, _hi = model.predict(fr)
        lk, _lv = lookup.predict(
            jobs["model_type"], jobs["family"], pairs["hardware_type_c"], jobs["num_devices"]
        )
        sb = pairs["samples_per_s_b"].to_numpy()
        hb, hc = pairs["hardware_type_b"], pairs["hardware_type_c"]
        flops = specs["peak_bf16_tflops"]
        bw = specs["memory_bandwidth_gbps"]
        results["model"].append(p50)
        results["lookup"].append(lk)
        results["flops_ratio"].append(sb * flops.loc[hc].to_numpy() / flops.loc[hb].to_numpy())
        results["bw_ratio"].append(sb * bw.loc[hc].to_numpy() / bw.loc[hb].to_numpy())
        # median per-device log ratio C/B over the training models' lineages
        tp = train.merge(train, on="lineage_id", suffixes=("_b", "_c"))
        tp["r"] = np.log(tp["samples_per_s_c"] / tp["samples_per_s_b"])
        ratios = tp.groupby(["hardware_type_b", "hardware_type_c"])["r"].median()
        r = ratios.reindex(pd.MultiIndex.from_arrays([hb, hc])).to_numpy()
        results["ratio_table"].append(sb * np.exp(r))
        ys.append(pairs["samples_per_s_c"].to_numpy())
    y = np.concatenate(ys)
    out: dict[str, object] = {"table": table, "pairs": len(y), "split": split}
    for k, v in results.items():
        m = metrics(np.concatenate(v), y)
        out[k] = {kk: round(vv, 4) for kk, vv in m.items() if kk != "rows"}
    return out


def main() -> int:
    for table, split in (
        ("simulation", "model"),
        ("physical", "model"),
        ("simulation", "config"),
        ("physical", "config"),
    ):
        res = evaluate(table, split)
        for k in METHODS:
            m = res[k]
            assert isinstance(m, dict)
            print(
                f"{table:10s} split={split:6s} {k:12s} MAPE {m['mape']:.3f}  median APE {m['median_ape']:.3f}  "
                f"within ±10 % {m['accuracy']:.3f}  (pairs {res['pairs']})",
                file=sys.stderr,
            )
        print(orjson.dumps(res).decode())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
