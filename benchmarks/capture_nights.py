"""Capture `leap-stream backtest`'s nights once, then re-measure calibration or the ratio model on
them in a minute instead of a 25-minute backtest. A diagnosis, not a metric of the service.
Asserts nothing.

    .venv/bin/python benchmarks/capture_nights.py capture --seed 1 --nights 6 --out /tmp/nights1
    .venv/bin/python benchmarks/capture_nights.py recalibrate /tmp/nights1
    .venv/bin/python benchmarks/capture_nights.py ratio /tmp/nights1 --nights 1,5

`capture` runs the backtest's nightly loop (full rate, default settings unless told) and writes,
per night, a pickle of: the rows the nightly model was fitted on (frame, samples/s, lineage
ids, fit arguments), the model (texts and metadata), and every candidate the backtest scored
(the feature frame with the model's predictions and intervals) with the simulator's measured
truth. ~4 minutes and ~150 MB a night at the full rate.

`recalibrate` reloads each night's model, runs the current code's calibration on the held-out
lineages of its own training rows (the unseen-type scale kept from the capture: it needs a
refit), and prints 80 % coverage and mean width (log) by anchor kind over every candidate with
a truth. `ratio` refits only the ratio model with the current code on each night's rows and
prints transfer rows within ±10 %. Run either from a checkout with a change to compare it with
the capture's own figures (printed first).
"""

from __future__ import annotations

import argparse
import pickle
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd


def capture(seed: int, nights: int, rate: int | None, out: Path) -> None:
    from leap_stream.tools.backtest import DEFAULT_RATE, Night, run_backtest

    out.mkdir(parents=True, exist_ok=True)

    def keep(night: Night) -> None:
        model, tr = night.model, night.truth
        record = {
            "train": (night.train_frame, night.train_samples_per_s, night.train_lineages,
                      {"seed": night.seed}),
            "model": (model.model_text(), model.ratio_text(), model.metadata),
            "base": night.scored, "meas": tr.meas, "in_truth": tr.in_truth, "is_ran": tr.is_ran,
        }  # fmt: skip
        with open(out / f"night{night.index}.pkl", "wb") as fh:
            pickle.dump(record, fh)

    run_backtest(seed=seed, nights=nights, rate=rate or DEFAULT_RATE, progress=False, on_night=keep)


def _load(path: Path) -> dict[str, Any]:
    from leap_stream.core.predictor import ThroughputModel, anchor_kind
    from leap_stream.core.ranker import SRC_MODEL

    with open(path, "rb") as fh:
        night: dict[str, Any] = pickle.load(fh)
    text, ratio, meta = night["model"]
    model = ThroughputModel.from_text(text.encode(), meta, ratio.encode() if ratio else None)
    base = night["base"]
    night["model"] = model
    night["ok"] = night["in_truth"] & (base["source"].to_numpy() == SRC_MODEL)
    night["kind"] = anchor_kind(base, model.groups)
    frame, sps, _lineages, _kw = night["train"]
    night["y"] = np.log(sps) - frame["log_devices"].to_numpy()
    return night


def _nights(d: Path, which: str | None) -> list[Path]:
    paths = sorted(d.glob("night*.pkl"), key=lambda p: int(p.stem[5:]))
    if which:
        keep = {int(n) for n in which.split(",")}
        paths = [p for p in paths if int(p.stem[5:]) in keep]
    return paths


def _coverage(night: dict[str, Any], low: np.ndarray, high: np.ndarray) -> pd.DataFrame:
    meas, ok = night["meas"], night["ok"]
    inside = (meas >= low) & (meas <= high)
    with np.errstate(invalid="ignore", divide="ignore"):
        width = np.log(high / low)
    return pd.DataFrame({"kind": night["kind"], "inside": inside, "width": width})[ok]


def recalibrate(d: Path, which: str | None) -> None:
    from leap_stream.core.predictor import KINDS, ThroughputModel, holdout_mask

    before, after = [], []
    for path in _nights(d, which):
        night = _load(path)
        model, base = night["model"], night["base"]
        before.append(_coverage(night, base["low"].to_numpy(), base["high"].to_numpy()))
        frame, _sps, lineages, kw = night["train"]
        kept = {
            k: v for k, v in model.metadata["interval_scale"].items() if k.startswith("unseen_type")
        }
        model._calibrate(frame, night["y"], holdout_mask(lineages, 0.15, kw.get("seed", 0)))
        model.metadata["interval_scale"].update(kept)
        again = ThroughputModel(model.booster, model.metadata, ratio=model.ratio)
        _p, low, high = again.predict(base)
        after.append(_coverage(night, low, high))
        print(f"{path.stem}: recalibrated", flush=True)
    for name, parts in (("captured", before), ("recalibrated", after)):
        df = pd.concat(parts)
        cells = [
            f"{k} {df.inside[df.kind == i].mean():.4f} ({df.width[df.kind == i].mean():.3f})"
            for i, k in enumerate(KINDS)
        ]
        print(f"{name:12s} 80 % coverage (width): " + ", ".join(cells))


def ratio(d: Path, which: str | None) -> None:
    from leap_stream.core.predictor import holdout_mask

    for path in _nights(d, which):
        night = _load(path)
        model, base = night["model"], night["base"]
        frame, _sps, lineages, kw = night["train"]
        rows = night["ok"] & (night["kind"] == 1)
        sub = base[rows].reset_index(drop=True)
        truth = np.log(night["meas"][rows]) - sub["log_devices"].to_numpy()
        cal = holdout_mask(lineages, 0.15, kw.get("seed", 0))
        refit = model._with_ratio_model(frame, night["y"], ~cal, cal, kw.get("seed", 0))
        figures = []
        for m in (model, refit):
            _blind, moved = m._log_pd_parts(sub)
            figures.append(float(np.mean(np.abs(np.expm1(truth - moved)) <= 0.10)))
        print(f"{path.stem}: transfer rows within ±10 %: captured {figures[0]:.4f}, "
              f"refitted {figures[1]:.4f} ({len(sub)} rows)")  # fmt: skip


def main() -> int:
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="cmd", required=True)
    cap = sub.add_parser("capture")
    cap.add_argument("--seed", type=int, default=1)
    cap.add_argument("--nights", type=int, default=6)
    cap.add_argument("--rate", type=int, default=None)
    cap.add_argument("--out", type=Path, required=True)
    for name in ("recalibrate", "ratio"):
        p = sub.add_parser(name)
        p.add_argument("dir", type=Path)
        p.add_argument("--nights", default=None, help="comma-separated night numbers")
    a = ap.parse_args()
    if a.cmd == "capture":
        capture(a.seed, a.nights, a.rate, a.out)
    elif a.cmd == "recalibrate":
        recalibrate(a.dir, a.nights)
    else:
        ratio(a.dir, a.nights)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
