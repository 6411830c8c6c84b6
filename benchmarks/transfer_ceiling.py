"""How much of the cross-hardware gap is data, how much the model: one fortnight, two fits.

    .venv/bin/python benchmarks/transfer_ceiling.py --seed 0 --rate 10000

Simulates --warmup days, then --nights more, and scores the last night's submissions on every
candidate against the simulator's measured throughput (as the backtest does) with

* fleet:  `ThroughputModel.fit` on what a fleet has: the rows of the hardware each job ran on,
          with their point-in-time history (the backtest's nightly model);
* oracle-data: the same class and features fitted on the measured throughput of *every*
          candidate of the nights before the last (data no fleet has: every job on every type),
          as a ceiling for what more data alone could do for this model class.

Prints accuracy within ±10 % per anchor kind and top-1 (best throughput per cost) for both, and
one JSON line. Asserts nothing.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import orjson
import pandas as pd

from leap_stream.catalog import load_catalog
from leap_stream.contracts.timestamps import epoch_seconds
from leap_stream.core import features as F
from leap_stream.core.predictor import KINDS, ThroughputModel, anchor_kind
from leap_stream.tools.backtest.truth import _candidates
from leap_stream.tools.sim.config import SimConfig
from leap_stream.tools.sim.fleet import FleetSimulator
from leap_stream.train import pit


def _measured_on_every_candidate(day: object, frame: pd.DataFrame) -> np.ndarray:
    subs, truth = day.submissions, day.truth  # type: ignore[attr-defined]
    job = frame["job"].to_numpy()
    key = pd.DataFrame(
        {
            "job_id": subs["job_id"].to_numpy(object)[job],
            "attempt": subs["attempt"].to_numpy()[job],
            "hardware_type": frame["hardware_type"].to_numpy(object),
        }
    )
    t = key.merge(truth, on=["job_id", "attempt", "hardware_type"], how="left")
    return t["measured_samples_per_s"].to_numpy(np.float64)


def _scores(model: ThroughputModel, frame: pd.DataFrame, meas: np.ndarray) -> dict[str, float]:
    pred, _lo, _hi = model.predict(frame)
    ok = np.isfinite(meas)
    hit = np.abs(pred / meas - 1.0) <= 0.10
    kind = anchor_kind(frame, model.groups)
    out = {"accuracy": float(hit[ok].mean())}
    for k, name in enumerate(KINDS):
        sel = ok & (kind == k)
        out[f"accuracy_{name}"] = float(hit[sel].mean()) if sel.any() else float("nan")
    cost = np.exp(frame["log_cost"].to_numpy(np.float64))
    use = ok & frame["fits"].to_numpy(bool)
    d = pd.DataFrame(
        {
            "job": frame["job"].to_numpy(),
            "p": np.where(use, pred / cost, -np.inf),
            "m": np.where(ok, meas / cost, -np.inf),
        }
    )
    out["top1"] = float((d.groupby("job")["p"].idxmax() == d.groupby("job")["m"].idxmax()).mean())
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--rate", type=int, default=10000)
    ap.add_argument("--warmup", type=int, default=14)
    ap.add_argument(
        "--nights", type=int, default=4, help="all-candidate nights; the last is scored"
    )
    ap.add_argument("--rows", type=int, default=150_000, help="training rows of each fit")
    ap.add_argument(
        "--large",
        action="store_true",
        help="the every-candidate fit with a 4× larger booster (255 leaves, learning rate 0.1, "
        "up to 1500 rounds with early stopping)",
    )
    a = ap.parse_args()
    t0 = time.perf_counter()
    catalog = load_catalog()
    specs = catalog.spec_matrix()
    sim = FleetSimulator(SimConfig(seed=a.seed, days=a.warmup + a.nights, rate=a.rate), catalog)
    rep = pit.Replayer()
    ran: list[tuple[pd.DataFrame, pd.DataFrame]] = []
    every: list[tuple[pd.DataFrame, np.ndarray, np.ndarray]] = []
    for d in range(a.warmup + a.nights):
        day = sim.step_day()
        rep.add_completions(day.completions)
        snap = rep.snapshot(day.submissions)
        measured = pit.measured(day.dataset.assign(_snap=np.arange(len(day.dataset))))
        i = measured["_snap"].to_numpy()
        ran.append(
            (
                F.build(
                    measured,
                    [[h] for h in measured["hardware_type"]],
                    [snap.histories[j] for j in i],
                    [snap.aggregates[j] for j in i],
                    specs,
                    snap.now[i],
                ),
                measured,
            )
        )
        if d >= a.warmup:
            subs = day.submissions
            frame = F.build(
                subs, _candidates(subs), snap.histories, snap.aggregates, specs, snap.now
            )
            lin = subs["lineage_id"].to_numpy(object)[frame["job"].to_numpy()]
            every.append((frame, _measured_on_every_candidate(day, frame), lin))
    rng = np.random.default_rng(a.seed)
    last_start = pd.Timestamp(sim.config.start, tz="UTC").timestamp() + 86400.0 * (
        a.warmup + a.nights - 1
    )
    # fleet: ran-on rows that had ended before the last night, the last 14 days
    fr = pd.concat([f for f, _ in ran[-15:-1]], ignore_index=True)
    rows = pd.concat([r for _, r in ran[-15:-1]], ignore_index=True)
    known = np.flatnonzero(epoch_seconds(rows["ended_at"]) < last_start)
    pick = rng.choice(known, min(a.rows, len(known)), replace=False)
    fleet = ThroughputModel.fit(
        fr.iloc[pick].reset_index(drop=True),
        rows["samples_per_s"].to_numpy(np.float64)[pick],
        rows["lineage_id"].to_numpy(object)[pick],
        seed=a.seed,
    )
    # oracle-data: every candidate of the nights before the last
    ef = pd.concat([f for f, _m, _l in every[:-1]], ignore_index=True)
    em = np.concatenate([m for _f, m, _l in every[:-1]])
    el = np.concatenate([lin for _f, _m, lin in every[:-1]])
    ok = np.flatnonzero(np.isfinite(em))
    pick = rng.choice(ok, min(a.rows, len(ok)), replace=False)
    large = {"learning_rate": 0.1, "num_leaves": 255, "min_data_in_leaf": 10}
    oracle_data = ThroughputModel.fit(
        ef.iloc[pick].reset_index(drop=True),
        em[pick],
        el[pick],
        seed=a.seed,
        params=large if a.large else None,
        num_rounds=1500 if a.large else 150,
    )
    frame, meas, _lin = every[-1]
    out = {
        "seed": a.seed,
        "rate": a.rate,
        "fleet": _scores(fleet, frame, meas),
        "oracle_data": _scores(oracle_data, frame, meas),
        "wall_s": round(time.perf_counter() - t0, 1),
    }
    for name in ("fleet", "oracle_data"):
        s = out[name]
        print(
            f"{name:12s} accuracy {s['accuracy']:.3f} (self {s['accuracy_self']:.3f}, "
            f"transfer {s['accuracy_transfer']:.3f}, model {s['accuracy_model']:.3f}) "
            f"top1 {s['top1']:.3f}"
        )
    print(orjson.dumps(out).decode())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
