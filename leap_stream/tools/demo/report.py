"""The demo's figures, computed from what the run produced (pure: frames in, dicts out).

Inputs are the rankings the worker published, the wall-clock latencies the demo measured, and
the simulator's frames for the streamed day (what each job measured where it ran, and the
truth on every candidate). Nothing here talks to a service, so the unit tests can check every
number on frames small enough to work out by hand.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

KEY = ["job_id", "attempt"]
MEASURED = ("succeeded", "preempted")
TOLERANCE = 0.10  # "accurate" = within ±10 % of the measurement (LEAP's definition)


def rankings_frames(rankings: Iterable[Mapping[str, Any]]) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(one row per (job_id, attempt), one row per ranked candidate); the latest ranking wins,
    as for the scheduler (the worker delivers at least once)."""
    latest: dict[tuple[str, int], Mapping[str, Any]] = {}
    for r in rankings:
        latest[(str(r["job_id"]), int(r["attempt"]))] = r
    heads: list[dict[str, Any]] = []
    cands: list[dict[str, Any]] = []
    for (job_id, attempt), r in latest.items():
        ranked = list(r.get("candidates") or [])
        top = min(ranked, key=lambda c: int(c["rank"]))["hardware_type"] if ranked else None
        heads.append(
            {
                "job_id": job_id,
                "attempt": attempt,
                "source": r.get("source"),
                "reason": r.get("reason"),
                "model_version": r.get("model_version"),
                "history_used": bool(r.get("history_used", False)),
                "choice": top,
                "n_ranked": len(ranked),
            }
        )
        for c in ranked:
            interval = c.get("interval") or {}
            cands.append(
                {
                    "job_id": job_id,
                    "attempt": attempt,
                    "hardware_type": c["hardware_type"],
                    "predicted": float(c["predicted_throughput"]),
                    "low": float(interval.get("low", np.nan)),
                    "high": float(interval.get("high", np.nan)),
                    "rank": int(c["rank"]),
                }
            )
    head_cols = [*KEY, "source", "reason", "model_version", "history_used", "choice", "n_ranked"]
    cand_cols = [*KEY, "hardware_type", "predicted", "low", "high", "rank"]
    return pd.DataFrame(heads, columns=head_cols), pd.DataFrame(cands, columns=cand_cols)


def _n_candidates(subs: pd.DataFrame) -> pd.Series:
    return subs["candidate_hardware"].astype(str).str.count(r"\|") + 1


def _device_hours(completions: pd.DataFrame) -> pd.DataFrame:
    return completions.groupby(KEY, as_index=False).agg(device_hours=("device_hours", "sum"))


def coverage(subs: pd.DataFrame, heads: pd.DataFrame, completions: pd.DataFrame) -> dict[str, Any]:
    """Share of eligible submissions (a choice exists: ≥ 2 candidate types) and of their
    device-hours that got a ranking from the model or the lookup table (not `none`)."""
    s = subs[[*KEY, "candidate_hardware"]].copy()
    s["eligible"] = (_n_candidates(s) >= 2).to_numpy()
    s = s.merge(heads[[*KEY, "source", "reason"]], on=KEY, how="left")
    s = s.merge(_device_hours(completions), on=KEY, how="left")
    s["device_hours"] = s["device_hours"].fillna(0.0)
    s["source"] = s["source"].fillna("missing")
    el = s[s["eligible"]]
    covered = el["source"].isin(["model", "lookup"])
    dh = float(el["device_hours"].sum())
    return {
        "submissions": len(s),
        "rankings": int((s["source"] != "missing").sum()),
        "missing": int((s["source"] == "missing").sum()),
        "eligible": len(el),
        "covered": int(covered.sum()),
        "coverage": _ratio(int(covered.sum()), len(el)),
        "coverage_model": _ratio(int((el["source"] == "model").sum()), len(el)),
        "device_hours_eligible": round(dh, 2),
        "device_hours_coverage": _ratio(float(el.loc[covered, "device_hours"].sum()), dh),
        "by_source": {str(k): int(v) for k, v in s["source"].value_counts().items()},
        "by_reason": {str(k): int(v) for k, v in s["reason"].dropna().value_counts().items()},
    }


def _ratio(a: float, b: float) -> float:
    return float(a) / float(b) if b else float("nan")


def _acc(pred: np.ndarray, y: np.ndarray) -> dict[str, float]:
    """±10 % accuracy over every row (a missing prediction is a miss), MAPE and median APE
    over the predicted ones: the trainer's definition, so gate and demo figures compare."""
    pred = np.asarray(pred, np.float64)
    y = np.asarray(y, np.float64)
    have = np.isfinite(pred) & (pred > 0)
    ape = np.abs(pred[have] / y[have] - 1.0)
    n = len(y)
    return {
        "rows": n,
        # a prediction equal to its own measurement means the measurement leaked into it
        "exact": int(np.sum(ape < 1e-9)),
        "predicted": float(have.mean()) if n else float("nan"),
        "accuracy": float(np.sum(ape <= TOLERANCE) / n) if n else float("nan"),
        "mape": float(ape.mean()) if len(ape) else float("nan"),
        "median_ape": float(np.median(ape)) if len(ape) else float("nan"),
    }


def measured_rows(
    subs: pd.DataFrame,
    heads: pd.DataFrame,
    cands: pd.DataFrame,
    lookup: pd.DataFrame,
    completions: pd.DataFrame,
    truth: pd.DataFrame,
) -> pd.DataFrame:
    """Measured completions of ranked submissions, with the ranking's prediction on the
    hardware it ran on, the lookup baseline's, and the simulator's true throughput there."""
    c = completions[[*KEY, "hardware_type", "status", "samples_per_s"]]
    ok = c["status"].isin(list(MEASURED)) & np.isfinite(c["samples_per_s"].to_numpy(np.float64))
    c = c[ok & (c["samples_per_s"] > 0)]
    c = c.merge(heads[[*KEY, "source", "history_used"]], on=KEY, how="inner")
    c = c.merge(subs[[*KEY, "has_prior"]], on=KEY, how="left") if "has_prior" in subs else c
    on = [*KEY, "hardware_type"]
    c = c.merge(cands[[*on, "predicted", "low", "high"]], on=on, how="left")
    c = c.merge(lookup[[*on, "lookup"]], on=on, how="left")
    return c.merge(truth[[*on, "true_samples_per_s"]], on=on, how="left")


def accuracy(
    rows: pd.DataFrame,
    heads: pd.DataFrame,
    cands: pd.DataFrame,
    lookup: pd.DataFrame,
    truth: pd.DataFrame,
) -> dict[str, Any]:
    """Where the job ran (vs its measurement): the service, the lookup table and the oracle
    (the simulator's truth, i.e. the measurement-noise ceiling); on every candidate (vs the
    truth, what a ranking needs): the service and the lookup table."""
    y = rows["samples_per_s"].to_numpy(np.float64)
    out: dict[str, Any] = {
        "ran": {
            "service": _acc(rows["predicted"].to_numpy(), y),
            "lookup": _acc(rows["lookup"].to_numpy(), y),
            "oracle": _acc(rows["true_samples_per_s"].to_numpy(), y),
        }
    }
    hist = rows["history_used"].to_numpy(bool)
    out["ran"]["service_with_history"] = _acc(rows["predicted"].to_numpy()[hist], y[hist])
    out["ran"]["service_without_history"] = _acc(rows["predicted"].to_numpy()[~hist], y[~hist])
    on = [*KEY, "hardware_type"]
    allc = truth[[*on, "true_samples_per_s"]].merge(heads[KEY], on=KEY)
    allc = allc.merge(cands[[*on, "predicted"]], on=on, how="left")
    allc = allc.merge(lookup[[*on, "lookup"]], on=on, how="left")
    t = allc["true_samples_per_s"].to_numpy(np.float64)
    out["all_candidates"] = {
        "service": _acc(allc["predicted"].to_numpy(), t),
        "lookup": _acc(allc["lookup"].to_numpy(), t),
    }
    return out


def calibration(rows: pd.DataFrame, bins: int = 8) -> dict[str, Any]:
    """Does the 10th–90th percentile interval hold 80 % of measurements, overall and across the
    range of predictions, and is the median prediction unbiased (median measured/predicted)?"""
    r = rows[np.isfinite(rows["low"].to_numpy(np.float64)) & (rows["predicted"] > 0)]
    if r.empty:
        return {"rows": 0, "interval_coverage": float("nan"), "level": 0.8, "bins": []}
    y = r["samples_per_s"].to_numpy(np.float64)
    inside = (y >= r["low"].to_numpy(np.float64)) & (y <= r["high"].to_numpy(np.float64))
    ratio = y / r["predicted"].to_numpy(np.float64)
    logp = np.log10(r["predicted"].to_numpy(np.float64))
    edges = np.unique(np.quantile(logp, np.linspace(0, 1, bins + 1)))
    which = np.clip(np.searchsorted(edges, logp, side="right") - 1, 0, max(len(edges) - 2, 0))
    per_bin = []
    for b in range(max(len(edges) - 1, 1)):
        m = which == b
        if m.any():
            per_bin.append(
                {
                    "predicted_median": float(10 ** np.median(logp[m])),
                    "rows": int(m.sum()),
                    "interval_coverage": float(inside[m].mean()),
                    "median_ratio": float(np.median(ratio[m])),
                }
            )
    return {
        "rows": len(r),
        "level": 0.8,
        "interval_coverage": float(inside.mean()),
        "median_ratio": float(np.median(ratio)),
        "bins": per_bin,
    }


def choices(
    subs: pd.DataFrame,
    heads: pd.DataFrame,
    lookup: pd.DataFrame,
    truth: pd.DataFrame,
    prices: Mapping[str, float],
) -> pd.DataFrame:
    """Per ranked eligible submission: the default, the service's choice (rank 1, the default
    when `none`), the lookup baseline's and the oracle's (best true throughput per dollar)."""
    s = subs[[*KEY, "default_hardware", "candidate_hardware"]].copy()
    s = s[(_n_candidates(s) >= 2).to_numpy()]
    s = s.merge(heads[[*KEY, "source", "choice"]], on=KEY, how="inner")
    s["service"] = s["choice"].where(s["choice"].notna(), s["default_hardware"])
    on = [*KEY, "hardware_type"]
    t = truth[[*on, "true_samples_per_s"]].merge(s[KEY], on=KEY)
    t = t.merge(lookup[[*on, "lookup"]], on=on, how="left")
    price = t["hardware_type"].map(prices).astype(np.float64)
    t["true_tpc"] = t["true_samples_per_s"] / price
    t["lookup_tpc"] = t["lookup"] / price
    oracle = t.loc[t.groupby(KEY)["true_tpc"].idxmax(), [*KEY, "hardware_type"]]
    s = s.merge(oracle.rename(columns={"hardware_type": "oracle"}), on=KEY, how="left")
    lk = t[t["lookup_tpc"].notna()]
    lk = lk.loc[lk.groupby(KEY)["lookup_tpc"].idxmax(), [*KEY, "hardware_type"]]
    s = s.merge(lk.rename(columns={"hardware_type": "lookup"}), on=KEY, how="left")
    s["lookup"] = s["lookup"].where(s["lookup"].notna(), s["default_hardware"])
    return s.drop(columns=["candidate_hardware", "choice"])


def savings(
    picks: pd.DataFrame,
    truth: pd.DataFrame,
    completions: pd.DataFrame,
    prices: Mapping[str, float],
) -> dict[str, Any]:
    """Estimated cost and device-hours of the streamed day had each policy placed the jobs.

    The work of an attempt is fixed (device-hours on the default × its true throughput there),
    so on type h it takes device-hours × true(default) / true(h); the devices stay the same.
    The fleet itself ran on the defaults (shadow mode), so this is the simulator's estimate.
    """
    on = [*KEY, "hardware_type"]
    true = truth.set_index(on)["true_samples_per_s"]
    p = picks.merge(_device_hours(completions), on=KEY, how="inner")
    dh = p["device_hours"].to_numpy(np.float64)

    def true_at(col: str) -> np.ndarray:
        idx = pd.MultiIndex.from_arrays([p["job_id"], p["attempt"], p[col]], names=on)
        return true.reindex(idx).to_numpy(np.float64)

    t_def = true_at("default_hardware")
    ok = np.isfinite(t_def) & (t_def > 0) & (dh > 0)
    price_def = p["default_hardware"].map(prices).to_numpy(np.float64)
    base_cost = float(np.sum((dh * price_def)[ok]))
    base_dh = float(np.sum(dh[ok]))
    out: dict[str, Any] = {
        "jobs": int(ok.sum()),
        "default_cost_usd": round(base_cost, 2),
        "default_device_hours": round(base_dh, 2),
    }
    oracle_pick = p["oracle"].to_numpy(object)
    for policy in ("service", "lookup", "oracle"):
        t_pol = true_at(policy)
        use = ok & np.isfinite(t_pol) & (t_pol > 0)
        pol = np.where(use, p[policy].to_numpy(object), p["default_hardware"].to_numpy(object))
        factor = np.where(use, t_def / np.where(use, t_pol, 1.0), 1.0)
        dh_pol = dh * factor
        cost = float(np.sum((dh_pol * pd.Series(pol).map(prices).to_numpy(np.float64))[ok]))
        moved = ok & (pol != p["default_hardware"].to_numpy(object))
        out[policy] = {
            "cost_usd": round(cost, 2),
            "saving": 1.0 - cost / base_cost if base_cost > 0 else float("nan"),
            "device_hours": round(float(np.sum(dh_pol[ok])), 2),
            "device_hours_saving": 1.0 - float(np.sum(dh_pol[ok])) / base_dh
            if base_dh
            else float("nan"),
            "moved": int(moved.sum()),
            "oracle_match": float(np.mean(pol[ok] == oracle_pick[ok]))
            if ok.any()
            else float("nan"),
        }
    o = out["oracle"]["saving"]
    out["service_share_of_oracle"] = (
        out["service"]["saving"] / o if o and np.isfinite(o) and o > 0 else float("nan")
    )
    return out


def latency(seconds: np.ndarray | list[float]) -> dict[str, float]:
    """submitted (produced by the demo) → ranking received, wall clock, in milliseconds."""
    ms = np.asarray(seconds, np.float64) * 1000.0
    ms = ms[np.isfinite(ms)]
    if len(ms) == 0:
        return {"n": 0}
    q = np.percentile(ms, [50, 90, 99])
    return {
        "n": len(ms),
        "p50_ms": float(q[0]),
        "p90_ms": float(q[1]),
        "p99_ms": float(q[2]),
        "max_ms": float(ms.max()),
        "mean_ms": float(ms.mean()),
    }


def worker_metrics(text: str) -> dict[str, Any]:
    """The worker's own counters from its /metrics text, to cross-check the demo's figures
    (rankings by source, dead letters by kind, events in) and show its batch sizes and times."""
    from prometheus_client.parser import text_string_to_metric_families

    out: dict[str, Any] = {
        "rankings_out": {},
        "dead_letters": {},
        "events_in": {},
        "batches": {},
        "coverage_ratio": None,
        "duplicates": 0.0,
        "dataset_rows_written": 0.0,
    }
    sums: dict[tuple[str, str], float] = {}
    for fam in text_string_to_metric_families(text):
        for smp in fam.samples:
            lab = smp.labels
            if smp.name == "leap_rankings_out_total":
                out["rankings_out"][lab.get("source", "")] = smp.value
            elif smp.name == "leap_dead_letter_total":
                out["dead_letters"][lab.get("kind", "")] = (
                    out["dead_letters"].get(lab.get("kind", ""), 0.0) + smp.value
                )
            elif smp.name == "leap_events_in_total":
                key = f"{lab.get('topic', '')}:{lab.get('outcome', '')}"
                out["events_in"][key] = smp.value
            elif smp.name in ("leap_batch_seconds_sum", "leap_batch_seconds_count"):
                sums[(lab.get("agent", ""), smp.name.rsplit("_", 1)[1])] = smp.value
            elif smp.name in ("leap_batch_size_sum",):
                sums[(lab.get("agent", ""), "size")] = smp.value
            elif smp.name == "leap_coverage_ratio":
                out["coverage_ratio"] = smp.value
            elif smp.name == "leap_completions_duplicate_total":
                out["duplicates"] = smp.value
            elif smp.name == "leap_dataset_rows_written_total":
                out["dataset_rows_written"] = smp.value
    for agent in sorted({a for a, _k in sums}):
        n = sums.get((agent, "count"), 0.0)
        if n:
            out["batches"][agent] = {
                "batches": int(n),
                "mean_ms": 1000.0 * sums.get((agent, "sum"), 0.0) / n,
                "mean_size": sums.get((agent, "size"), 0.0) / n,
            }
    return out


@dataclass
class DemoInputs:
    """What the run gathered; `build_report` derives every figure from it."""

    submissions: pd.DataFrame  # the streamed day's submissions (simulator frame)
    completions: pd.DataFrame  # their completions (simulator frame: where each ran, measured)
    truth: pd.DataFrame  # true / measured throughput of every candidate
    rankings: Sequence[Mapping[str, Any]]  # as received from the rankings topic
    lookup: pd.DataFrame  # job_id, attempt, hardware_type, lookup (baseline prediction)
    latency_s: list[float]
    prices: Mapping[str, float]
    run: dict[str, Any] = field(default_factory=dict)  # timings, lag, DLQ, retrain, reload


def build_report(inp: DemoInputs) -> tuple[dict[str, Any], dict[str, pd.DataFrame]]:
    """(the report dict, the frames the plots draw from)."""
    heads, cands = rankings_frames(inp.rankings)
    rows = measured_rows(inp.submissions, heads, cands, inp.lookup, inp.completions, inp.truth)
    picks = choices(inp.submissions, heads, inp.lookup, inp.truth, inp.prices)
    report: dict[str, Any] = {
        "coverage": coverage(inp.submissions, heads, inp.completions),
        "accuracy": accuracy(rows, heads, cands, inp.lookup, inp.truth),
        "calibration": calibration(rows),
        "savings": savings(picks, inp.truth, inp.completions, inp.prices),
        "latency": latency(inp.latency_s),
        **inp.run,
    }
    frames = {"heads": heads, "candidates": cands, "measured": rows, "choices": picks}
    return report, frames


def _pct(x: Any) -> str:
    try:
        v = float(x)
    except (TypeError, ValueError):
        return "n/a"
    return "n/a" if not np.isfinite(v) else f"{100 * v:.1f} %"


def _signed(x: Any) -> str:
    v = float(x)
    return "n/a" if not np.isfinite(v) else f"{100 * v:+.1f} %"


def render_text(report: Mapping[str, Any]) -> str:
    """The short report printed at the end of the demo."""
    cov = report["coverage"]
    acc = report["accuracy"]["ran"]
    allc = report["accuracy"]["all_candidates"]
    cal = report["calibration"]
    sav = report["savings"]
    lat = report["latency"]
    lines = ["", "=== leap-stream demo report ==="]
    if "stream" in report:
        st = report["stream"]
        lines.append(
            f"streamed      {st.get('submissions', 0)} submissions + {st.get('completions', 0)} "
            f"completions in {st.get('seconds', 0):.0f} s ({st.get('events_per_s', 0):.0f} ev/s; "
            f"{st.get('completions_held_for_ranking', 0)} completions held until their ranking)"
        )
    lines += [
        f"coverage      {_pct(cov['coverage'])} of {cov['eligible']} eligible submissions "
        f"(model {_pct(cov['coverage_model'])}), {_pct(cov['device_hours_coverage'])} of "
        f"their {cov['device_hours_eligible']:.0f} device-hours; rankings for "
        f"{cov['rankings']}/{cov['submissions']} submissions",
        f"accuracy ±10% where it ran ({acc['service']['rows']} measured): service "
        f"{_pct(acc['service']['accuracy'])} (with history {_pct(acc['service_with_history']['accuracy'])}, "
        f"without {_pct(acc['service_without_history']['accuracy'])}), lookup "
        f"{_pct(acc['lookup']['accuracy'])}, oracle {_pct(acc['oracle']['accuracy'])}",
        f"              MAPE service {_pct(acc['service']['mape'])}, lookup "
        f"{_pct(acc['lookup']['mape'])}; on every candidate vs truth: service "
        f"{_pct(allc['service']['accuracy'])}, lookup {_pct(allc['lookup']['accuracy'])}",
        f"calibration   80 % interval holds {_pct(cal.get('interval_coverage'))} of "
        f"{cal.get('rows', 0)} measurements; median measured/predicted "
        f"{cal.get('median_ratio', float('nan')):.3f}",
        f"savings       vs the default choice over {sav['jobs']} jobs "
        f"(${sav['default_cost_usd']:,.0f}): service {_pct(sav['service']['saving'])} "
        f"(moved {sav['service']['moved']}, oracle pick {_pct(sav['service']['oracle_match'])}), "
        f"lookup {_pct(sav['lookup']['saving'])}, oracle {_pct(sav['oracle']['saving'])}",
        f"              device-hours vs the default: service "
        f"{_signed(-sav['service']['device_hours_saving'])}, oracle "
        f"{_signed(-sav['oracle']['device_hours_saving'])} (cheaper types run longer)",
    ]
    if lat.get("n"):
        lines.append(
            f"latency       submitted → ranking received: p50 {lat['p50_ms']:.0f} ms, "
            f"p99 {lat['p99_ms']:.0f} ms, max {lat['max_ms']:.0f} ms ({lat['n']} rankings)"
        )
        split = report.get("latency_split_ms") or {}
        if split.get("until_ranking_produced_p50") is not None:
            lines.append(
                f"              of which until the worker produced it: p50 "
                f"{split['until_ranking_produced_p50']:.0f} ms, p99 "
                f"{split['until_ranking_produced_p99']:.0f} ms"
            )
    wm = report.get("worker_metrics") or {}
    if wm.get("batches"):
        parts = [
            f"{a} {b['batches']} × {b['mean_size']:.1f} ev in {b['mean_ms']:.1f} ms"
            for a, b in wm["batches"].items()
        ]
        lines.append("worker        batches: " + "; ".join(parts))
        lines.append(
            f"              own counters: rankings {wm.get('rankings_out')}, dead letters "
            f"{wm.get('dead_letters')}, duplicates {wm.get('duplicates', 0):.0f}"
        )
    if "lag_end" in report:
        lines.append(f"lag at end    {report['lag_end']} events")
    if "dead_letters" in report:
        dl = report["dead_letters"]
        lines.append(
            f"dead letters  {dl.get('count', 0)} {dl.get('by_kind', {})} "
            f"(injected on purpose: {dl.get('injected', 0)})"
        )
    if "retrain" in report:
        rt = report["retrain"]
        lines.append(
            f"retrain       {rt.get('version')} {'PROMOTED' if rt.get('promoted') else 'not promoted'}"
            f": {rt.get('reason')}"
        )
    if "reload" in report:
        rl = report["reload"]
        lines.append(f"hot reload    {rl.get('summary')}")
    if "runtime_s" in report:
        lines.append(f"runtime       {report['runtime_s']:.0f} s")
    return "\n".join(lines)


__all__ = [
    "DemoInputs",
    "accuracy",
    "build_report",
    "calibration",
    "choices",
    "coverage",
    "latency",
    "measured_rows",
    "rankings_frames",
    "render_text",
    "savings",
    "worker_metrics",
]
