"""Does the simulator's cross-hardware structure look like real measurements?

    .venv/bin/python benchmarks/sim_vs_real.py --plot docs/img/sim_vs_real.png

For accelerator type pairs that both the fleet catalog and the public tables have (A100, H100,
V100, T4, L4, TPU v4, Gaudi2 …): the distribution over workloads of the per-device throughput
ratio B/A, measured (MLPerf Training v0.5–v3.1 within a round and benchmark, systems at most
2× apart in size; NeuSight training iterations; each pair of rows of one job) against simulated (the measured throughput of every
candidate of a simulated day, each submission with both types as candidates). Prints one row per
pair — medians and quartiles of log2 ratios — and one JSON line; optionally a box plot.
Reads ../shared/data by default (--data). Asserts nothing.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import orjson
import pandas as pd

from leap_stream.catalog import load_catalog, load_reference_catalog
from leap_stream.tools.evaluate.protocol import pairs
from leap_stream.tools.evaluate.table import read_table
from leap_stream.tools.sim.config import SimConfig
from leap_stream.tools.sim.fleet import simulate

TABLES = ("mlperf_training_results_v0.5-v3.1.csv", "neusight_e2e.csv")
MIN_REAL = 8  # pairs of rows a type pair needs to be shown
# MLPerf systems range from 8 to thousands of devices and per-device throughput falls with
# scale: compare only systems within this factor of each other's size
MAX_COUNT_RATIO = 2.0


def real_ratios(data: Path) -> pd.DataFrame:
    """log2 per-device ratio B/A of every ordered pair of rows of one job, both types in the
    fleet catalog, from the public tables."""
    catalog = load_reference_catalog()
    fleet = set(load_catalog().types)
    out = []
    for name in TABLES:
        t = read_table(data / name, catalog)
        rows = t.rows[t.rows["group"] != "inference"]
        p = pairs(rows, catalog)
        p = p[p["a_type"].isin(fleet) & p["b_type"].isin(fleet)]
        p = p[np.abs(p["log_count_ratio"]) <= np.log(MAX_COUNT_RATIO)]
        out.append(p.assign(source=name.split("_")[0], log2=p["log_ratio"] / np.log(2)))
    return pd.concat(out, ignore_index=True)[["a_type", "b_type", "log2", "source"]]


# The frameworks the public results of a vendor's parts were measured with: MLPerf's TPU
# entries are JAX and TensorFlow (no PyTorch/XLA); everything else is compared on every job.
REAL_FRAMEWORKS = {"google": {"jax", "tensorflow"}}


def sim_ratios(seed: int, rate: int, days: int, keep: set[tuple[str, str]]) -> pd.DataFrame:
    """The same ratio on the simulator's measured throughput of every candidate; a pair with a
    part of a vendor in `REAL_FRAMEWORKS` only over jobs of those frameworks."""
    res = simulate(SimConfig(seed=seed, days=days, rate=rate))
    t = res.truth[["job_id", "attempt", "hardware_type", "measured_samples_per_s"]]
    w = t.pivot_table(
        index=["job_id", "attempt"], columns="hardware_type", values="measured_samples_per_s"
    )
    fw = res.submissions.set_index(["job_id", "attempt"])["framework"].reindex(w.index)
    vendor = {t: load_catalog()[t].vendor for t in w.columns}
    out = []
    for a, b in sorted(keep):
        if a in w.columns and b in w.columns:
            r = pd.Series(np.log2(w[b] / w[a]))  # same job, same device count: per device too
            for v in {vendor[a], vendor[b]} & set(REAL_FRAMEWORKS):
                r = r[fw.isin(REAL_FRAMEWORKS[v]).to_numpy()]
            r = r.dropna()
            out.append(pd.DataFrame({"a_type": a, "b_type": b, "log2": r.to_numpy()}))
    return pd.concat(out, ignore_index=True)


def summary(real: pd.DataFrame, sim: pd.DataFrame) -> list[dict[str, object]]:
    rows = []
    for (a, b), g in real.groupby(["a_type", "b_type"]):
        if str(a) > str(b):  # B/A mirrors A/B: one direction per pair
            continue
        s = sim[(sim["a_type"] == a) & (sim["b_type"] == b)]["log2"]
        if len(g) < MIN_REAL or s.empty:
            continue
        q = np.quantile(g["log2"], [0.25, 0.5, 0.75])
        qs = np.quantile(s, [0.25, 0.5, 0.75])
        rows.append(
            {
                "pair": f"{a}→{b}",
                "real_n": len(g),
                "real_q": [round(float(x), 3) for x in q],
                "sim_n": len(s),
                "sim_q": [round(float(x), 3) for x in qs],
                "median_gap_log2": round(float(qs[1] - q[1]), 3),
            }
        )
    return rows


def plot(real: pd.DataFrame, sim: pd.DataFrame, rows: list[dict[str, object]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 0.45 * len(rows) + 1.5))
    for i, r in enumerate(rows):
        a, b = str(r["pair"]).split("→")
        g = real[(real["a_type"] == a) & (real["b_type"] == b)]["log2"]
        s = sim[(sim["a_type"] == a) & (sim["b_type"] == b)]["log2"]
        ax.boxplot(
            [g],
            positions=[i + 0.18],
            orientation="horizontal",
            widths=0.3,
            showfliers=False,
            patch_artist=True,
            boxprops={"facecolor": "#4c72b0"},
        )
        ax.boxplot(
            [s],
            positions=[i - 0.18],
            orientation="horizontal",
            widths=0.3,
            showfliers=False,
            patch_artist=True,
            boxprops={"facecolor": "#dd8452"},
        )
    ax.set_yticks(range(len(rows)), [str(r["pair"]) for r in rows])
    ax.axvline(0, color="k", lw=0.5)
    ax.set_xlabel("log2 per-device throughput ratio B/A (blue: real tables, orange: simulator)")
    ax.grid(axis="x", alpha=0.3)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", type=Path, default=Path(__file__).parents[2] / "shared" / "data")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--rate", type=int, default=5000)
    ap.add_argument("--days", type=int, default=2)
    ap.add_argument("--plot", type=Path)
    a = ap.parse_args()
    real = real_ratios(a.data)
    keep = {(x, y) for x, y in zip(real["a_type"], real["b_type"], strict=True)}
    sim = sim_ratios(a.seed, a.rate, a.days, keep)
    rows = summary(real, sim)
    for r in rows:
        print(
            f"{r['pair']:24s} real n={r['real_n']:5d} q25/50/75 {r['real_q']}  "
            f"sim n={r['sim_n']:6d} {r['sim_q']}  median gap {r['median_gap_log2']:+.2f} (log2)"
        )
    if a.plot:
        plot(real, sim, rows, a.plot)
    print(orjson.dumps({"pairs": rows}).decode())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
