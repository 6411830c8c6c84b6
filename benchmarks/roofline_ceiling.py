"""How well the physics moves a job between types: the learned roofline against what the data
allows, on one backtest night. A diagnosis, not a metric of the service. Asserts nothing.

    .venv/bin/python benchmarks/roofline_ceiling.py --seed 11 --rate 3000

Runs the backtest's warm-up and one scored night, then, on that night's transfer rows (a job
with a prior on another type B, scored on a candidate it never ran on), puts the prior's
measured rate on B times a ratio against the measurement on the candidate and prints, same
vendor and across vendors, the share within ±10 % and the spread (sd, log) of the ratio's error
against the simulator's `known` ratio (physics × (model type × type) factor × drift: what a
fleet's data determines). Ratios:

* known ratio            the ceiling of any ratio (the informed oracle's, but for the prior)
* nightly model          the backtest's model: its transfer estimate
* fixed physics          `log_phys_rate`, the textbook efficiencies
* roofline (fleet)       `LearnedRoofline` fitted on the night's training rows
* + pair effects         and each (model type × type)'s shrunk mean residual, each lineage's
                         shrunk mean residual taken out first
* roofline (every cand.) fitted on the known rate of every candidate of the night: data no
                         fleet has; the model class's ceiling
* + true pair means      and each (model type × type)'s mean residual there
"""

from __future__ import annotations

import argparse
from typing import Any

import numpy as np
import pandas as pd

from leap_stream.core.roofline import LearnedRoofline
from leap_stream.tools.backtest import Night, run_backtest

LINEAGE_SHRINK, PAIR_SHRINK = 2.0, 3.0  # as the predictor's


def _by_key(frame: pd.DataFrame, values: np.ndarray, hw_col: str) -> np.ndarray:
    """Per row, `values` at the row's job on the type in `hw_col` (NaN where none)."""
    index = pd.MultiIndex.from_arrays([frame["job"].to_numpy(), frame["hardware_type"].astype(str)])
    table = pd.Series(values, index=index)
    table = table[~table.index.duplicated()]
    at = pd.MultiIndex.from_arrays([frame["job"].to_numpy(), frame[hw_col].astype(str)])
    return table.reindex(at).to_numpy()


def _pair_key(frame: pd.DataFrame, hw_col: str = "hardware_type") -> np.ndarray:
    return (frame["model_type"].astype(str) + "|" + frame[hw_col].astype(str)).to_numpy()


def _pair_effects(
    key: np.ndarray, resid: np.ndarray, shrink: float, lineage: np.ndarray | None = None
) -> pd.Series:
    if lineage is not None:
        by = pd.Series(resid).groupby(lineage)
        resid = resid - (by.transform("sum") / (by.transform("count") + LINEAGE_SHRINK)).to_numpy()
    g = pd.Series(resid).groupby(key).agg(["sum", "count"])
    return pd.Series(g["sum"] / (g["count"] + shrink))


def _report(name: str, err_meas: np.ndarray, err_known: np.ndarray, groups: dict[str, Any]) -> None:
    parts = [f"{name:26s}"]
    for label, sel in groups.items():
        within = np.mean(np.abs(np.expm1(err_meas[sel])) <= 0.10)
        parts.append(f"{label} {within:.3f} (sd {np.nanstd(err_known[sel]):.3f})")
    print("  ".join(parts))


def diagnose(night: Night) -> None:
    s = night.scored.reset_index(drop=True)
    nd = np.exp(s["log_devices"].to_numpy())
    known = np.log(night.truth.known / nd)
    measured = np.log(night.truth.meas / nd)
    known_b = _by_key(s, known, "o_hardware_type")
    prior = s["other_log_pd"].to_numpy()
    transfer = (
        ~np.isfinite(s["self_log_pd"].to_numpy())
        & np.isfinite(prior)
        & night.truth.in_truth
        & np.isfinite(known)
        & np.isfinite(known_b)
    )
    same = (s["vendor"].astype(str) == s["o_vendor"].astype(str)).to_numpy()
    groups = {"same vendor": transfer & same, "cross vendor": transfer & ~same}
    print(
        f"transfer rows: {int(groups['same vendor'].sum())} same vendor, "
        f"{int(groups['cross vendor'].sum())} across; within ±10 % of the measurement "
        "(sd of the ratio's error against the known ratio)"
    )
    true_ratio = known - known_b

    def report(name: str, ratio: np.ndarray) -> None:
        _report(name, prior + ratio - measured, ratio - true_ratio, groups)

    report("known ratio", true_ratio)
    report("nightly model", np.log(s["pred"].to_numpy() / nd) - prior)
    report("fixed physics", s["log_phys_rate"].to_numpy() - s["o_log_phys_rate"].to_numpy())

    train = night.train_frame
    y = np.log(np.asarray(night.train_samples_per_s, np.float64)) - train["log_devices"].to_numpy()
    fleet = LearnedRoofline.fit(train, y, night.seed)
    report("roofline (fleet)", fleet.predict(s) - fleet.predict(s, "o_"))
    eff = _pair_effects(
        _pair_key(train), y - fleet.predict(train), PAIR_SHRINK, np.asarray(night.train_lineages)
    )

    def with_pairs(model: LearnedRoofline, effects: pd.Series, prefix: str) -> np.ndarray:
        key = _pair_key(s, prefix + "hardware_type")
        return model.predict(s, prefix) + effects.reindex(key).fillna(0.0).to_numpy()

    report("+ pair effects", with_pairs(fleet, eff, "") - with_pairs(fleet, eff, "o_"))
    ok = np.isfinite(known)
    every = LearnedRoofline.fit(s.loc[ok], known[ok], night.seed)
    report("roofline (every cand.)", every.predict(s) - every.predict(s, "o_"))
    means = _pair_effects(_pair_key(s)[ok], (known - every.predict(s))[ok], 0.0)
    report("+ true pair means", with_pairs(every, means, "") - with_pairs(every, means, "o_"))


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seed", type=int, default=11)
    ap.add_argument("--rate", type=int, default=3000)
    ap.add_argument("--warmup-days", type=int, default=14)
    args = ap.parse_args()
    run_backtest(
        seed=args.seed,
        nights=1,
        warmup_days=args.warmup_days,
        rate=args.rate,
        progress=False,
        on_night=diagnose,
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
