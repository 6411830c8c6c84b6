"""Scoring a night: each predictor's accuracy, choice, regret and savings, the anchor kinds,
the candidates within the noise, and the lineage resamples behind the savings share's
interval."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import pandas as pd

from leap_stream.core.lookup import LookupTable
from leap_stream.core.predictor import ThroughputModel
from leap_stream.core.ranker import SRC_LOOKUP, SRC_NONE, Ranker
from leap_stream.core.ranking import best_per_job, throughput_per_cost, within_noise_of_best
from leap_stream.tools.backtest.params import CEILINGS, SAVINGS_REPLICATES, TRANSFER_KEYS
from leap_stream.tools.backtest.truth import NightTruth, _candidates, _SpecCatalog
from leap_stream.train import pit
from leap_stream.train.trainer import metrics


def _top_choice(tr: NightTruth, p: np.ndarray, usable: np.ndarray) -> np.ndarray:
    """Per job, the row a predictor ranks first (best predicted throughput per cost among its
    usable rows with a truth); -1 when none."""
    score = np.where(usable & tr.in_truth, throughput_per_cost(p, tr.cost, tr.nd), -np.inf)
    return best_per_job(tr.job, score, tr.n_jobs)


def _choice_costs(tr: NightTruth, top: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per job, (the cost of the row chosen, or of the default where none is; the cost of the
    measured best; whether the job is scored: it has both and a default cost)."""
    chosen = np.where(top >= 0, tr.row_cost[np.maximum(top, 0)], tr.cost_default)
    best = np.where(tr.best_row >= 0, tr.row_cost[np.maximum(tr.best_row, 0)], np.nan)
    return chosen, best, tr.eligible & np.isfinite(chosen) & np.isfinite(best)


class LineageResamples:
    """Poisson(1) weights per (resample, lineage), drawn the first time a lineage is seen and
    kept, so that a lineage weighs the same in every night of a run (Poisson bootstrap of
    lineages: its jobs recur, and are not independent draws)."""

    def __init__(self, rng: np.random.Generator, replicates: int = SAVINGS_REPLICATES) -> None:
        self._rng = rng
        self._index: dict[str, int] = {}
        self._weights = np.zeros((replicates, 0), np.uint8)

    def weights(self, lineages: Sequence[str]) -> np.ndarray:
        """(resamples × jobs) weights of jobs of `lineages` (one lineage id per job)."""
        new = [x for x in dict.fromkeys(lineages) if x not in self._index]
        if new:
            first = len(self._index)
            self._index.update((x, first + i) for i, x in enumerate(new))
            drawn = self._rng.poisson(1.0, (self._weights.shape[0], len(new)))
            self._weights = np.hstack([self._weights, np.minimum(drawn, 255).astype(np.uint8)])
        idx = np.fromiter((self._index[x] for x in lineages), np.int64, len(lineages))
        return self._weights[:, idx]


def savings_replicates(
    default: np.ndarray, chosen: dict[str, np.ndarray], weights: np.ndarray
) -> dict[str, np.ndarray]:
    """Per predictor, its savings (1 − chosen cost ÷ default cost) on each resample of the
    jobs, every predictor on the same resamples. Jobs are the rows of `default` and of each
    `chosen`; `weights` (resamples × jobs) says how often each resample draws each job."""
    w = weights.astype(np.float64)
    total = w @ default
    with np.errstate(invalid="ignore", divide="ignore"):
        return {name: 1.0 - (w @ cost) / total for name, cost in chosen.items()}


def _noise_set(
    tr: NightTruth, p: np.ndarray, hi: np.ndarray, usable: np.ndarray, e: np.ndarray
) -> dict[str, float]:
    """The ranking's first candidate and those `within_noise_of_best`: how many, and how often
    they hold the measured best (over the jobs `e` that top-1 is scored on)."""
    if not e.any():
        return {"noise_set_size": float("nan"), "best_in_noise_set": float("nan")}
    rows = usable & tr.in_truth
    in_set = within_noise_of_best(
        tr.job,
        throughput_per_cost(p, tr.cost, tr.nd),
        throughput_per_cost(hi, tr.cost, tr.nd),
        rows,
        tr.n_jobs,
    )
    size = np.bincount(tr.job[in_set], minlength=tr.n_jobs)
    holds_best = (tr.best_row >= 0) & in_set[np.maximum(tr.best_row, 0)]
    return {
        "noise_set_size": float(np.mean(size[e])),
        "best_in_noise_set": float(np.mean(holds_best[e])),
    }


def _predictor_metrics(
    tr: NightTruth,
    p: np.ndarray,
    usable: np.ndarray,
    lo: np.ndarray | None,
    hi: np.ndarray | None,
    top: np.ndarray,
) -> dict[str, Any]:
    """Accuracy (every candidate and where the job ran), top-1, regret, savings and coverage of
    one predictor whose predictions ``p`` are usable where ``usable``; ``top`` is its first
    choice per job (`_top_choice`, which the caller needs too)."""

    def on(rows: np.ndarray) -> dict[str, Any]:
        return metrics(
            np.where(usable, p, np.nan)[rows],
            tr.meas[rows],
            None if lo is None else lo[rows],
            None if hi is None else hi[rows],
        )

    m = on(tr.in_truth)
    mr = on(tr.in_truth & tr.is_ran)  # the hardware the job actually ran on
    m["accuracy_ran"] = mr["accuracy"]
    if "interval_coverage" in mr:
        m["interval_coverage_ran"] = mr["interval_coverage"]
    covered = top >= 0
    chosen_cost, best_cost, e = _choice_costs(tr, top)
    m["top1"] = float(np.mean((top == tr.best_row)[e])) if e.any() else float("nan")
    if hi is not None:
        m.update(_noise_set(tr, p, hi, usable, e))
    m["regret"] = float(chosen_cost[e].sum() / best_cost[e].sum() - 1.0) if e.any() else 0.0
    m["regret_top1pct"] = regret_of_the_worst(chosen_cost[e] - best_cost[e])
    m["savings"] = float(1.0 - chosen_cost[e].sum() / tr.cost_default[e].sum()) if e.any() else 0.0
    has = tr.has_cand
    m["coverage"] = float(covered[has].mean()) if has.any() else 0.0
    hours = tr.dev_hours[has].sum()
    m["coverage_device_hours"] = (
        float(tr.dev_hours[covered & has].sum() / hours) if hours > 0 else 0.0
    )
    return m


def regret_of_the_worst(regret: np.ndarray, share: float = 0.01) -> float:
    """The regret (cost of the choice less the measured best's, in dollars) of the ``share`` of
    jobs with the most of it: where the savings are lost (docs/decisions/0006)."""
    if len(regret) == 0:
        return 0.0
    k = max(1, int(np.ceil(share * len(regret))))
    return float(np.sort(regret)[-k:].sum())


def _score_night(
    subs: pd.DataFrame,
    truth: pd.DataFrame,
    completions: pd.DataFrame,
    snap: pit.Snapshots,
    specs: pd.DataFrame,
    model: ThroughputModel | None,
    lookup: LookupTable | None,
) -> tuple[pd.DataFrame, NightTruth]:
    """Every candidate of the night's jobs as the ranker scores them, and what really happened."""
    base, _reason = Ranker(_SpecCatalog(specs), model, lookup).score_batch(
        subs, _candidates(subs), snap.histories, snap.aggregates, snap.now
    )
    return base, NightTruth.of(base, subs, truth, completions)


def as_run_figures(
    subs: pd.DataFrame,
    base: pd.DataFrame,
    tr: NightTruth,
    explored: Mapping[tuple[str, int], str],
    probed: Mapping[tuple[str, int], Any],
) -> dict[str, float]:
    """What the night's jobs cost as the closed loop ran them, on the same truth as the
    savings: the model's first choice, or the explored type, or the type a probe led to plus
    the probes' cost (`probed`: `policy.Probed` per job attempt). Per kind, how many and the
    measured extra cost against the first choice (negative where it was in truth cheaper);
    the fleet's cost of the first choices, as run, and on defaults; the regret (as run less the
    measured best, USD) of the 1 % of jobs with the most; the share of jobs run on their
    measured best (`top1`)."""
    usable = (base["source"].to_numpy(np.int64) != SRC_NONE) & base["fits"].to_numpy(bool)
    pred = base["pred"].to_numpy(np.float64)
    top = _top_choice(tr, pred, usable & np.isfinite(pred) & (pred > 0))
    chosen, best, scored = _choice_costs(tr, top)
    keys = list(zip(subs["job_id"].tolist(), subs["attempt"].tolist(), strict=True))
    job = base["job"].to_numpy(np.int64)
    hw = base["hardware_type"].to_numpy(object)

    def ran_rows(want: np.ndarray) -> np.ndarray:
        rows = np.flatnonzero(hw == want[job])
        return rows[scored[job[rows]] & np.isfinite(tr.row_cost[rows])]

    ran, ran_row = chosen.copy(), top.copy()
    e_rows = ran_rows(np.asarray([explored.get((str(j), int(a)), "") for j, a in keys], object))
    ran[job[e_rows]], ran_row[job[e_rows]] = tr.row_cost[e_rows], e_rows
    p_of = [probed.get((str(j), int(a))) for j, a in keys]
    p_rows = ran_rows(np.asarray(["" if p is None else p.ran_on for p in p_of], object))
    ran[job[p_rows]], ran_row[job[p_rows]] = tr.row_cost[p_rows], p_rows
    probe_cost = np.asarray([0.0 if p is None else p.cost for p in p_of])
    is_probed = np.zeros(len(keys), bool)
    is_probed[job[p_rows]] = True
    total = ran + probe_cost
    return {
        "explore_count": float(len(explored)),
        "explore_scored": float(len(e_rows)),
        "explore_extra_cost": float((ran - chosen)[job[e_rows]].sum()),
        "probe_count": float(sum(p is not None for p in p_of)),
        "probe_scored": float(is_probed.sum()),
        "probe_cost": float(probe_cost[scored].sum()),
        "probe_extra_cost": float((ran - chosen)[is_probed].sum()),
        "probed_jobs_cost": float(ran[is_probed].sum()),
        "fleet_cost": float(chosen[scored].sum()),
        "as_run_cost": float(total[scored].sum()),
        "default_cost": float(tr.cost_default[scored].sum()),
        "regret_top1pct": regret_of_the_worst((total - best)[scored]),
        "top1": float(np.mean((ran_row == tr.best_row)[scored])) if scored.any() else np.nan,
    }


def _night_eval(
    subs: pd.DataFrame,
    base: pd.DataFrame,
    tr: NightTruth,
    model: ThroughputModel | None,
    lookup: LookupTable | None,
    watch: str | None = None,
    resamples: LineageResamples | None = None,
    ceilings: Mapping[str, np.ndarray] | None = None,
) -> tuple[dict[str, Any], pd.DataFrame]:
    """Metrics of one night's scored rows for model, lookup and oracle, and the rows with a
    truth (for plots); with `watch`, how the model treats that (new) hardware type; with
    `resamples`, the model's and the oracle's savings on resampled lineages
    (`savings_replicates`, arrays: the caller takes them out before the night is reported);
    with `ceilings` (per oracle of `CEILINGS`, its prediction per row), their metrics and
    their accuracy by the model's anchor kinds (`by_anchor_<name>`)."""
    only_lookup = _lookup_only(base, subs, lookup)
    preds = {
        "model": base["pred"].to_numpy(np.float64),
        "lookup": only_lookup["pred"].to_numpy(np.float64),
        "oracle": tr.true,
    }
    sources = {
        "model": base["source"].to_numpy(np.int64),
        "lookup": only_lookup["source"].to_numpy(np.int64),
        "oracle": np.where(tr.in_truth, 0, SRC_NONE),
    }
    fits = base["fits"].to_numpy(bool)
    out: dict[str, Any] = {}
    lo, hi = base["low"].to_numpy(np.float64), base["high"].to_numpy(np.float64)
    chosen: dict[str, np.ndarray] = {}  # per job, the cost of each predictor's first choice
    scored_jobs: dict[str, np.ndarray] = {}
    for name, pred in (ceilings or {}).items():
        preds[name] = pred
        sources[name] = sources["oracle"]
    for name in preds:
        p = preds[name]
        usable = (sources[name] != SRC_NONE) & np.isfinite(p) & (p > 0)
        if name not in ("oracle", *CEILINGS):
            usable &= fits
        is_model = name == "model"
        top = _top_choice(tr, p, usable)
        out[name] = _predictor_metrics(
            tr, p, usable, lo if is_model else None, hi if is_model else None, top
        )
        if resamples is not None and name != "lookup":
            chosen[name], _best, scored_jobs[name] = _choice_costs(tr, top)
    if resamples is not None and chosen:
        jobs = scored_jobs["model"] & scored_jobs["oracle"]  # every eligible job with a best
        lineages = subs["lineage_id"].to_numpy(object)[jobs].tolist()
        out["savings_replicates"] = savings_replicates(
            tr.cost_default[jobs],
            {k: v[jobs] for k, v in chosen.items()},
            resamples.weights(lineages),
        )
    usable_m = (sources["model"] != SRC_NONE) & np.isfinite(preds["model"]) & fits
    inside = (tr.meas >= lo) & (tr.meas <= hi)
    with np.errstate(invalid="ignore", divide="ignore"):
        width = np.log(hi / lo)
    if model is not None:
        out["by_anchor"] = _anchor_counts(
            base,
            subs,
            model,
            preds["model"],
            usable_m,
            tr.meas,
            tr.in_truth,
            tr.is_ran,
            inside,
            width,
        )
        none = np.zeros(len(base), bool)  # a ceiling gives no interval
        for name, pred in (ceilings or {}).items():
            out[f"by_anchor_{name}"] = _anchor_counts(
                base,
                subs,
                model,
                pred,
                tr.in_truth & np.isfinite(pred),
                tr.meas,
                tr.in_truth,
                tr.is_ran,
                none,
                np.full(len(base), np.nan),
            )
        # the rows a closed loop moves: the lineage's prior on another type, over every candidate
        rows, hits = (out["by_anchor"]["all"].get("transfer") or [0, 0])[:2]
        out["transfer_accuracy"] = round(hits / rows, 4) if rows else None
    if watch is not None:
        out["new_hardware"] = _watched_type(
            watch, base, tr, preds["model"], usable_m, inside, width
        )
    out["submissions"] = tr.n_jobs
    out["rows"] = int(tr.in_truth.sum())
    out["not_fit_excluded_in_truth"] = (
        float(np.mean(~fits[tr.in_truth])) if tr.in_truth.any() else 0.0
    )
    scored = pd.DataFrame(
        {"measured": tr.meas, "model": preds["model"], "lookup": preds["lookup"], "oracle": tr.true}
    )[tr.in_truth]
    return out, scored


def _lookup_only(
    base: pd.DataFrame, subs: pd.DataFrame, lookup: LookupTable | None
) -> pd.DataFrame:
    """What `Ranker(catalog, None, lookup)` scores, from the rows already built (no second
    feature build): the lookup on every fitting candidate."""
    fits = base["fits"].to_numpy(bool)
    pred = np.full(len(base), np.nan)
    if lookup is not None and fits.any():
        job = base["job"].to_numpy(np.int64)[fits]
        pred[fits], _lv = lookup.predict(
            subs["model_type"].to_numpy(object)[job],
            subs["family"].to_numpy(object)[job],
            base["hardware_type"].to_numpy(object)[fits],
            subs["num_devices"].to_numpy(np.float64)[job],
        )
    ok = np.isfinite(pred) & (pred > 0)
    return pd.DataFrame({"pred": pred, "source": np.where(ok, SRC_LOOKUP, SRC_NONE)})


def _anchor_counts(
    base: pd.DataFrame,
    subs: pd.DataFrame,
    model: ThroughputModel,
    pred: np.ndarray,
    usable: np.ndarray,
    meas: np.ndarray,
    in_truth: np.ndarray,
    is_ran: np.ndarray,
    inside: np.ndarray,
    width: np.ndarray,
) -> dict[str, dict[str, list[float]]]:
    """[rows, hits, inside the 80 % interval, rows with an interval, the sum of their log
    widths] of the model per breakdown key, for all candidates and the ran-on ones: where
    accuracy is lost (anchor kind, device count changed since the prior, a rare pair, family)
    and whether the intervals are honest there, and how wide they are for it."""
    from leap_stream.core.intervals import crosses_vendor, devices_changed
    from leap_stream.core.predictor import KINDS, anchor_kind

    kind = np.asarray(KINDS, dtype=object)[anchor_kind(base, model.groups)]
    moved = np.where(crosses_vendor(base), TRANSFER_KEYS[1], TRANSFER_KEYS[0])
    transfer = np.where(kind == "transfer", moved, "")
    dev = np.where(
        kind == "self",
        np.where(devices_changed(base), "self_devices_changed", "self_same_devices"),
        "",
    )
    # a candidate anchored on anything but its own prior whose (model type × type) pair was
    # rare in training: the calibration's `rare_pair` term
    rare = np.where((kind != "self") & model.rare_pairs(base), "rare_pair", "")
    family = subs["family"].to_numpy(object)[base["job"].to_numpy(np.int64)].astype(str)
    fam = "family=" + family
    # (family, vendor of the candidate): what a vendor's software release moves
    fv = "fv=" + family + "|" + base["vendor"].to_numpy(object).astype(str)
    with np.errstate(invalid="ignore", divide="ignore"):
        hit = usable & (np.abs(pred / meas - 1.0) <= 0.10)
    has_width = usable & np.isfinite(width)
    out: dict[str, dict[str, list[float]]] = {}
    for scope, sel in (("all", in_truth), ("ran", in_truth & is_ran)):
        d: dict[str, list[float]] = {}
        for labels in (kind, transfer, dev, rare, fam, fv):
            lab = labels[sel]
            h = hit[sel]
            ins = (usable & inside)[sel]
            wm = has_width[sel]
            w = np.where(wm, width[sel], 0.0)
            for name in np.unique(lab):
                if not name:
                    continue
                m = lab == name
                d[str(name)] = [
                    int(m.sum()),
                    int(h[m].sum()),
                    int(ins[m].sum()),
                    int(wm[m].sum()),
                    round(float(w[m].sum()), 3),
                ]
        out[scope] = d
    return out


def _watched_type(
    hw_type: str,
    base: pd.DataFrame,
    tr: NightTruth,
    pred: np.ndarray,
    usable: np.ndarray,
    inside: np.ndarray,
    width: np.ndarray,
) -> dict[str, Any]:
    """One night of a type new to the fleet: how many jobs could use it, how often the model's
    top choice is it against the oracle's, the model's accuracy and interval honesty on it
    (``inside``, ``width``: per row, the measurement inside the 80 % interval, its log width)."""
    hw = base["hardware_type"].to_numpy(object)
    is_t = hw == hw_type
    top = _top_choice(tr, pred, usable)
    model_top = (top >= 0) & (hw[np.maximum(top, 0)] == hw_type)
    oracle_top = (tr.best_row >= 0) & (hw[np.maximum(tr.best_row, 0)] == hw_type)
    rows = is_t & tr.in_truth & usable
    with np.errstate(divide="ignore", invalid="ignore"):
        hit = np.abs(pred / tr.meas - 1.0) <= 0.10
    others = ~is_t & tr.in_truth & usable
    return {
        "jobs_with_candidate": len(np.unique(tr.job[is_t])),
        "ran_on": int((is_t & tr.is_ran).sum()),
        "model_top": int(model_top.sum()),
        "oracle_top": int(oracle_top.sum()),
        "both_top": int((model_top & oracle_top).sum()),
        "accuracy": float(hit[rows].mean()) if rows.any() else None,
        "interval_coverage_80": float(inside[rows].mean()) if rows.any() else None,
        "interval_width_log": float(np.median(width[rows])) if rows.any() else None,
        "interval_width_log_other_types": (
            float(np.median(width[others])) if others.any() else None
        ),
    }
