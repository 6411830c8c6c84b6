"""The demo's PNGs (matplotlib, Agg backend: no display needed)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from leap_stream.tools.pyplot import pyplot

COLORS = {"service": "#1f77b4", "lookup": "#ff7f0e", "oracle": "#2ca02c", "default": "#7f7f7f"}


def _bars(ax: Any, labels: list[str], values: list[float], colors: list[str], fmt: str) -> None:
    vals = [0.0 if not np.isfinite(v) else v for v in values]
    bars = ax.bar(labels, vals, color=colors)
    for b, v in zip(bars, values, strict=True):
        text = "n/a" if not np.isfinite(v) else fmt.format(v)
        ax.annotate(
            text,
            (b.get_x() + b.get_width() / 2, b.get_height()),
            ha="center",
            va="bottom",
            fontsize=9,
        )


def accuracy_png(report: Mapping[str, Any], rows: pd.DataFrame, path: Path) -> Path:
    plt = pyplot()
    acc = report["accuracy"]
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(11, 4.2))
    labels = ["service", "service\nwith history", "service\nno history", "lookup", "oracle"]
    keys = ["service", "service_with_history", "service_without_history", "lookup", "oracle"]
    vals = [100 * acc["ran"][k]["accuracy"] for k in keys]
    cols = [COLORS["service"], "#6baed6", "#c6dbef", COLORS["lookup"], COLORS["oracle"]]
    _bars(a1, labels, vals, cols, "{:.1f}%")
    n = acc["ran"]["service"]["rows"]
    a1.set_ylim(0, 105)
    a1.set_ylabel("predictions within ±10 % of measured (%)")
    a1.set_title(f"Where the job ran ({n} measured completions)")
    y = rows["samples_per_s"].to_numpy(np.float64)
    grid = np.linspace(0, 0.5, 101)
    for key, col, label in (
        ("predicted", COLORS["service"], "service"),
        ("lookup", COLORS["lookup"], "lookup"),
        ("true_samples_per_s", COLORS["oracle"], "oracle (truth)"),
    ):
        p = rows[key].to_numpy(np.float64)
        ape = np.where(np.isfinite(p) & (p > 0), np.abs(p / y - 1.0), np.inf)
        if len(ape):
            a2.plot(100 * grid, [100 * np.mean(ape <= g) for g in grid], color=col, label=label)
    a2.axvline(10, color="k", lw=0.8, ls=":")
    a2.set_xlabel("absolute percentage error (%)")
    a2.set_ylabel("share of measured completions (%)")
    a2.set_title("Error distribution (missing prediction = never)")
    a2.legend(loc="lower right")
    a2.set_ylim(0, 100)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def calibration_png(report: Mapping[str, Any], rows: pd.DataFrame, path: Path) -> Path:
    plt = pyplot()
    cal = report["calibration"]
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(11, 4.4))
    r = rows[np.isfinite(rows["predicted"].to_numpy(np.float64)) & (rows["predicted"] > 0)]
    if len(r) > 6000:
        r = r.sample(6000, random_state=0)
    x = r["predicted"].to_numpy(np.float64)
    y = r["samples_per_s"].to_numpy(np.float64)
    hist = r["history_used"].to_numpy(bool)
    a1.scatter(x[~hist], y[~hist], s=4, alpha=0.4, color="#c44e52", label="no history")
    a1.scatter(x[hist], y[hist], s=4, alpha=0.4, color=COLORS["service"], label="with history")
    if len(x):
        lo, hi = float(min(x.min(), y.min())), float(max(x.max(), y.max()))
        line = np.geomspace(max(lo, 1e-3), hi, 50)
        a1.plot(line, line, "k-", lw=0.8)
        a1.fill_between(line, line * 0.9, line * 1.1, color="k", alpha=0.12, label="±10 %")
    a1.set_xscale("log")
    a1.set_yscale("log")
    a1.set_xlabel("predicted samples/s (ranking, hardware it ran on)")
    a1.set_ylabel("measured samples/s")
    a1.set_title("Predicted vs measured")
    a1.legend(loc="upper left", markerscale=3)
    bins = cal.get("bins") or []
    if bins:
        xs = [b["predicted_median"] for b in bins]
        a2.plot(xs, [100 * b["interval_coverage"] for b in bins], "o-", label="interval coverage")
        a2.axhline(100 * cal["level"], color="k", ls=":", lw=0.8, label="nominal 80 %")
        a2.set_xscale("log")
        a2.set_ylim(0, 105)
        a2.set_ylabel("measured inside the 10–90 % interval (%)")
        a3 = a2.twinx()
        a3.plot(xs, [b["median_ratio"] for b in bins], "s--", color="#8c564b", label="median ratio")
        a3.axhline(1.0, color="#8c564b", lw=0.5)
        a3.set_ylabel("median measured / predicted", color="#8c564b")
        a3.set_ylim(0.5, 1.5)
        h1, l1 = a2.get_legend_handles_labels()
        h3, l3 = a3.get_legend_handles_labels()
        a2.legend(h1 + h3, l1 + l3, loc="lower right")
    a2.set_xlabel("predicted samples/s (bins by predicted value)")
    cov = cal.get("interval_coverage", float("nan"))
    a2.set_title(f"Interval calibration (overall {100 * cov:.1f} % of {cal.get('rows', 0)})")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def savings_png(report: Mapping[str, Any], picks: pd.DataFrame, path: Path) -> Path:
    plt = pyplot()
    sav = report["savings"]
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(11, 4.2))
    labels = ["service", "lookup", "oracle"]
    _bars(
        a1,
        labels,
        [100 * sav[k]["saving"] for k in labels],
        [COLORS[k] for k in labels],
        "{:.1f}%",
    )
    a1.axhline(0, color="k", lw=0.8)
    a1.set_ylabel("cost saved vs the default choice (%)")
    a1.set_title(f"Estimated savings, {sav['jobs']} jobs, default ${sav['default_cost_usd']:,.0f}")
    if len(picks):
        moved = picks[picks["service"] != picks["default_hardware"]]
        counts = moved["service"].value_counts().head(12)
        a2.barh(counts.index[::-1], counts.to_numpy()[::-1], color=COLORS["service"])
        a2.set_xlabel("jobs")
        a2.set_title(f"Where the service moved jobs ({len(moved)} of {len(picks)})")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def latency_png(report: Mapping[str, Any], latency_s: list[float], path: Path) -> Path:
    plt = pyplot()
    lat = report["latency"]
    ms = np.asarray(latency_s, np.float64) * 1000.0
    ms = ms[np.isfinite(ms) & (ms > 0)]
    fig, ax = plt.subplots(figsize=(8, 4))
    if len(ms):
        edges = np.geomspace(max(ms.min(), 0.1), ms.max() * 1.01, 60)
        ax.hist(ms, bins=edges, color=COLORS["service"])
        ax.set_xscale("log")
        for q, style in (("p50_ms", "--"), ("p99_ms", ":")):
            ax.axvline(lat[q], color="k", ls=style, lw=1, label=f"{q[:3]} {lat[q]:.0f} ms")
        ax.legend()
    ax.set_xlabel("submitted → ranking received (ms, wall clock)")
    ax.set_ylabel("rankings")
    ax.set_title(f"Ranking latency ({lat.get('n', 0)} rankings)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def all_plots(
    report: Mapping[str, Any],
    frames: Mapping[str, pd.DataFrame],
    latency_s: list[float],
    out: Path,
) -> dict[str, Path]:
    out.mkdir(parents=True, exist_ok=True)
    return {
        "accuracy": accuracy_png(report, frames["measured"], out / "accuracy.png"),
        "calibration": calibration_png(report, frames["measured"], out / "calibration.png"),
        "savings": savings_png(report, frames["choices"], out / "savings.png"),
        "latency": latency_png(report, latency_s, out / "latency.png"),
    }


__all__ = ["all_plots"]
