"""The run's summary: nights pooled, the savings share's interval, every headline figure as
model / each ceiling (the informed and the attainable oracle)."""

from __future__ import annotations

from typing import Any

import numpy as np

from leap_stream.tools.backtest.params import (
    ABLATION_KEYS,
    CEILING_KEYS,
    CEILINGS,
    INFORMED,
    KIND_KEYS,
    PREDICTORS,
    TRANSFER_KEYS,
)


def _savings_share(out: dict[str, Any], replicates: list[dict[str, np.ndarray]]) -> dict[str, Any]:
    """The model's savings as a share of the oracle's (each the mean over nights), and its 95 %
    interval over resampled lineages (None without resamples)."""
    oracle = out["oracle"]["savings"]
    share = round(out["model"]["savings"] / oracle, 4) if oracle > 0 else None
    interval = None
    if replicates and share is not None:
        model = np.nanmean([r["model"] for r in replicates], axis=0)
        ratio = model / np.nanmean([r["oracle"] for r in replicates], axis=0)
        interval = [round(float(q), 4) for q in np.nanquantile(ratio, [0.025, 0.975])]
    return {"savings_share_of_oracle": share, "savings_share_of_oracle_95": interval}


def _summarise(
    per_night: list[dict[str, Any]],
    variants: list[str],
    replicates: list[dict[str, np.ndarray]],
) -> dict[str, Any]:
    out: dict[str, Any] = {}
    keys = (
        "accuracy",
        "accuracy_ran",
        "mape",
        "median_ape",
        "top1",
        "regret",
        "regret_top1pct",
        "savings",
        "coverage",
        "coverage_device_hours",
    )
    ceilings = [c for c in CEILINGS if per_night and c in per_night[0]]
    names = [*PREDICTORS, *ceilings]
    for name in names:
        out[name] = {k: round(float(np.nanmean([n[name][k] for n in per_night])), 4) for k in keys}
    for k, src in (
        ("interval_coverage_80", "interval_coverage"),
        ("interval_coverage_80_ran", "interval_coverage_ran"),
        ("noise_set_size", "noise_set_size"),
        ("best_in_noise_set", "best_in_noise_set"),
    ):
        out["model"][k] = round(float(np.nanmean([n["model"][src] for n in per_night])), 4)
    out["model"].update(_savings_share(out, replicates))
    for c in ceilings:
        if out["oracle"]["savings"] > 0:
            share = out[c]["savings"] / out["oracle"]["savings"]
            out[c]["savings_share_of_oracle"] = round(share, 4)
    ablation: dict[str, Any] = {}
    for v in variants[1:]:
        ablation[v[1:]] = {
            k: round(float(np.nanmean([n[v][k] for n in per_night])) - out["model"][k], 4)
            for k in ABLATION_KEYS
        }
    for key in ("by_anchor", *(f"by_anchor_{c}" for c in ceilings)):
        if pooled := _pooled_anchors(per_night, key):
            out[key] = pooled
    if per_night and "as_run" in per_night[0]:
        _as_run_summary(per_night, out)
    if INFORMED in out:
        out["ceiling"] = _ceiling(out, ceilings)
    if ablation:
        out["ablation_delta"] = ablation  # variant minus full model, mean over nights
    return out


def _as_run_summary(per_night: list[dict[str, Any]], out: dict[str, Any]) -> None:
    """The closed loop as it ran (`scoring.as_run_figures` per night): the explorations and
    probes, their cost as a share of the fleet's (and the probes' of the probed jobs'), and
    the model's savings and worst-1 % regret as run, net of every probe and exploration
    (`model.savings_net`, its share of the oracle's, `model.regret_top1pct`; the first
    choice's regret stays in `model.regret_top1pct_first_choice`), and the share of jobs run
    on their measured best (`model.top1_as_run`; `model.top1` is the first choice's)."""
    nights = [n["as_run"] for n in per_night]

    def total(key: str) -> float:
        return float(sum(n[key] for n in nights))

    fleet = total("fleet_cost")
    net = float(
        np.nanmean(
            [
                1.0 - n["as_run_cost"] / n["default_cost"] if n["default_cost"] else np.nan
                for n in nights
            ]
        )
    )
    oracle = out["oracle"]["savings"]
    model = out["model"]
    model["savings_net"] = round(net, 4)
    model["savings_share_of_oracle_net"] = round(net / oracle, 4) if oracle > 0 else None
    model["regret_top1pct_first_choice"] = model["regret_top1pct"]
    model["regret_top1pct"] = round(float(np.mean([n["regret_top1pct"] for n in nights])), 2)
    model["top1_as_run"] = round(float(np.nanmean([n["top1"] for n in nights])), 4)
    out["explore"] = {
        "count": int(total("explore_count")),
        "cost_share_fleet": round(total("explore_extra_cost") / fleet, 5) if fleet else None,
        "extra_cost_usd": round(total("explore_extra_cost"), 2),
    }
    probed = total("probed_jobs_cost")
    out["probes"] = {
        "count": int(total("probe_count")),
        "cost_usd": round(total("probe_cost"), 2),
        "cost_share_fleet": round(total("probe_cost") / fleet, 5) if fleet else None,
        "cost_share_probed": round(total("probe_cost") / probed, 5) if probed else None,
        "extra_cost_usd": round(total("probe_extra_cost"), 2),
        "measurements": int(total("probe_rows")),  # in the history and the training rows
    }


def _pooled_anchors(per_night: list[dict[str, Any]], key: str) -> dict[str, Any]:
    """The nights' anchor counts under `key`, pooled: accuracy (a candidate without a
    prediction is a miss), the coverage and width of the intervals given (as the overall
    coverage: a candidate the ranking excluded has no interval to hold or miss), and the
    share of rows per breakdown key."""
    by: dict[str, dict[str, list[float]]] = {}
    for n in per_night:
        for scope, d in n.get(key, {}).items():
            tgt = by.setdefault(scope, {})
            for k, counts in d.items():
                acc = tgt.setdefault(k, [0, 0, 0, 0, 0.0])
                for i, c in enumerate(counts):
                    acc[i] += c
    return {
        scope: {
            k: {
                "accuracy": round(c[1] / c[0], 4) if c[0] else None,
                "interval_coverage_80": round(c[2] / c[3], 4) if c[3] else None,
                "interval_width_log": round(c[4] / c[3], 4) if c[3] else None,
                "rows": int(c[0]),
                "share": round(
                    c[0] / max(1, sum(v[0] for kk, v in d.items() if kk in KIND_KEYS)), 4
                ),
            }
            for k, c in sorted(d.items())
        }
        for scope, d in by.items()
    }


def _ceiling(out: dict[str, Any], ceilings: list[str]) -> dict[str, dict[str, float | None]]:
    """Each headline figure as model and each ceiling's (`share`: the model's share of the
    informed oracle's; `share_<ceiling>` of each other's)."""
    keys = {"model": "by_anchor", **{c: f"by_anchor_{c}" for c in ceilings}}
    rows = {c: out.get(key, {}).get("all", {}) for c, key in keys.items()}
    figures = {k: {c: out[c][k] for c in ["model", *ceilings]} for k in CEILING_KEYS}
    for k in ("transfer", *TRANSFER_KEYS):
        if all(k in r for r in rows.values()):
            figures[k] = {c: r[k]["accuracy"] for c, r in rows.items()}
    result: dict[str, dict[str, float | None]] = {}
    for k, f in figures.items():
        m = f["model"]
        result[k] = dict(f)
        for c in ceilings:
            name = "share" if c == INFORMED else f"share_{c}"
            result[k][name] = round(m / f[c], 4) if m is not None and f[c] else None
    return result
