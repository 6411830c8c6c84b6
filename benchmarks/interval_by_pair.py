"""80 % interval coverage by anchor kind and by how many training rows the row's (model type ×
hardware) pair had: are the intervals honest on the rare pairs a ranking meets on every
candidate? A diagnosis, not a metric of the service. Asserts nothing.

    .venv/bin/python benchmarks/interval_by_pair.py --seed 11 --nights 6

Runs `leap-stream backtest`'s nightly loop (full rate, default settings) and, each night, scores
every candidate of every job as the backtest does; a row counts when the model ranked it and the
simulator has its measured truth. The pair's count is over the rows the night's model was
fitted on (held-out lineages included). Buckets: 0 (the pair never trained; the model's
unseen-pair factor applies), 1-9, 10-99, 100-999, 1000+.
"""

from __future__ import annotations

import argparse

import numpy as np
import pandas as pd

BUCKETS = [-1, 0, 9, 99, 999, float("inf")]
LABELS = ["0", "1-9", "10-99", "100-999", "1000+"]


def _pairs(frame: pd.DataFrame) -> pd.MultiIndex:
    """(model type, hardware type) of each row."""
    return pd.MultiIndex.from_arrays(
        [frame["model_type"].to_numpy(object), frame["hardware_type"].to_numpy(object)]
    )


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seed", type=int, default=11)
    ap.add_argument("--nights", type=int, default=6)
    args = ap.parse_args()

    from leap_stream.core.predictor import KINDS, anchor_kind
    from leap_stream.core.ranker import SRC_MODEL
    from leap_stream.tools.backtest import Night, run_backtest

    rows: list[pd.DataFrame] = []

    def count(night: Night) -> None:
        train, base, tr = night.train_frame, night.scored, night.truth
        pair_rows = (
            pd.Series(1, index=_pairs(train)).groupby(level=[0, 1]).sum().reindex(_pairs(base))
        )
        ok = tr.in_truth & (base["source"].to_numpy() == SRC_MODEL)
        inside = (tr.meas >= base["low"].to_numpy()) & (tr.meas <= base["high"].to_numpy())
        rows.append(
            pd.DataFrame(
                {
                    "kind": anchor_kind(base, night.model.groups)[ok],
                    "pair_rows": pair_rows.fillna(0).to_numpy()[ok],
                    "inside": inside[ok],
                    "ran": tr.is_ran[ok],
                }
            )
        )

    run_backtest(seed=args.seed, nights=args.nights, progress=False, on_night=count)
    df = pd.concat(rows, ignore_index=True)
    df["bucket"] = pd.cut(df["pair_rows"], BUCKETS, labels=LABELS)
    print(f"seed {args.seed}, {args.nights} nights, {len(df)} candidate rows with a truth")
    for k, kind in enumerate(KINDS):
        g = df[df["kind"] == k]
        if g.empty:
            continue
        by = g.groupby("bucket", observed=True)["inside"].agg(["mean", "size"])
        cells = ", ".join(f"{b} {m:.3f} ({int(n)})" for b, (m, n) in by.iterrows())
        ran = float(np.mean(g.loc[g["ran"], "inside"])) if g["ran"].any() else float("nan")
        print(f"{kind:8s} all {g['inside'].mean():.3f}, ran-on {ran:.3f}; by pair rows: {cells}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
