"""`leap-stream backtest`: nightly retrains against the fleet simulator's ground truth.

Warm up the fleet for some days, then for each night: retrain on every measurement that had
arrived before it (the nightly job), and rank that day's submissions with the model, the lookup
table and an oracle that knows the true throughput. The simulator gives the measured throughput
on *every* candidate (`truth`), so accuracy covers the hardware a job did not run on, and a
choice's cost is the device-hours the job's work needs at the measured rate there × price.

Features are computed once per day with an incremental point-in-time replay (a row's features
never change once its submission time has passed), so a night costs one training run.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pandas as pd

from leap_stream.contracts.timestamps import epoch_seconds
from leap_stream.core import features as F
from leap_stream.core.lookup import LookupTable
from leap_stream.core.predictor import ThroughputModel
from leap_stream.core.ranker import SRC_LOOKUP, SRC_NONE, Ranker
from leap_stream.core.ranking import throughput_per_cost, within_noise_of_best
from leap_stream.settings import Settings
from leap_stream.train import pit
from leap_stream.train.trainer import metrics

PREDICTORS = ("model", "lookup", "oracle")
# the informed oracle (tools/sim/informed.py): the ceiling every model figure is read against
INFORMED = "informed"
KIND_KEYS = ("self", "transfer", "model")
# transfer rows by whether the lineage's prior is on the candidate's vendor
TRANSFER_KEYS = ("transfer_same_vendor", "transfer_cross_vendor")
# the figures reported as model / informed oracle (`ceiling`)
CEILING_KEYS = ("accuracy", "accuracy_ran", "top1", "savings")
# Nightly training set: the last days' point-in-time rows, subsampled. At the simulator's full
# rate (30000/day) that is ~25k measured rows a day; older rows add little under drift.
TRAIN_WINDOW_DAYS = 14
TRAIN_ROWS = 150_000
DEFAULT_RATE = 30000
ABLATION_KEYS = ("accuracy", "accuracy_ran", "mape", "top1", "savings")
# Resamples of the fleet's lineages behind the savings share's interval. The share is decided
# by the few largest jobs (docs/decisions/0006), and a lineage's jobs
# recur night after night, so it says how far the figure would move on another draw of them.
SAVINGS_REPLICATES = 200


@dataclass
class _SpecCatalog:
    specs: pd.DataFrame

    def spec_matrix(self) -> pd.DataFrame:
        return self.specs


def _candidates(subs: pd.DataFrame) -> list[list[str]]:
    return [c.split("|") if c else [] for c in subs["candidate_hardware"].tolist()]


@dataclass(frozen=True)
class NightTruth:
    """What really happened to one night's (job × candidate) rows: measured and true rates,
    where each job ran, and what running it on each row would have cost."""

    job: np.ndarray
    meas: np.ndarray
    true: np.ndarray
    known: np.ndarray  # what a fleet's data determines (the informed oracle's base)
    in_truth: np.ndarray
    is_ran: np.ndarray
    nd: np.ndarray
    cost: np.ndarray
    row_cost: np.ndarray  # USD to run job j on row r's hardware at the measured rate there
    best_row: np.ndarray  # per job, the row with the best measured throughput per cost
    cost_default: np.ndarray  # per job, the cost on its default hardware
    eligible: np.ndarray  # per job: a default cost and some work to weigh
    dev_hours: np.ndarray
    has_cand: np.ndarray  # per job: at least one candidate in the catalog

    @property
    def n_jobs(self) -> int:
        return len(self.cost_default)

    @classmethod
    def of(
        cls, base: pd.DataFrame, subs: pd.DataFrame, truth: pd.DataFrame, completions: pd.DataFrame
    ) -> NightTruth:
        key = pd.DataFrame(
            {
                "job_id": subs["job_id"].to_numpy(object)[base["job"].to_numpy()],
                "attempt": subs["attempt"].to_numpy()[base["job"].to_numpy()],
                "hardware_type": base["hardware_type"].to_numpy(object),
            }
        )
        cols = ["job_id", "attempt", "hardware_type", "true_samples_per_s"]
        extra = [c for c in ("measured_samples_per_s", "known_samples_per_s") if c in truth]
        t = key.merge(
            truth[[*cols, *extra]],
            on=["job_id", "attempt", "hardware_type"],
            how="left",
        )
        meas = t["measured_samples_per_s"].to_numpy(np.float64)
        job = base["job"].to_numpy(np.int64)
        hw = base["hardware_type"].to_numpy(object)
        nd = subs["num_devices"].to_numpy(np.float64)[job]
        cost = base["cost"].to_numpy(np.float64)
        in_truth = np.isfinite(meas)
        n_jobs = len(subs)
        # the job's work: what its run processed (samples), a weight per job
        c = completions.set_index(["job_id", "attempt"]).reindex(
            pd.MultiIndex.from_arrays([subs["job_id"], subs["attempt"]])
        )
        dur = (
            (pd.to_datetime(c["ended_at"], utc=True) - pd.to_datetime(c["started_at"], utc=True))
            .dt.total_seconds()
            .to_numpy(np.float64)
        )
        is_default = hw == subs["default_hardware"].to_numpy(object)[job]
        is_ran = hw == c["hardware_type"].to_numpy(object)[job]  # the default, or the choice
        meas_ran = np.full(n_jobs, np.nan)
        meas_ran[job[is_ran & in_truth]] = meas[is_ran & in_truth]
        work = np.nan_to_num(dur * meas_ran, nan=0.0)
        row_cost = work[job] / meas * nd * cost / 3600.0
        meas_tpc = throughput_per_cost(meas, cost, nd)
        cost_default = np.full(n_jobs, np.nan)
        cost_default[job[is_default & in_truth]] = row_cost[is_default & in_truth]
        has_cand = np.zeros(n_jobs, bool)
        has_cand[job[base["known"].to_numpy(bool)]] = True
        return cls(
            job=job,
            meas=meas,
            true=t["true_samples_per_s"].to_numpy(np.float64),
            known=t.get("known_samples_per_s", pd.Series(np.nan, t.index)).to_numpy(np.float64),
            in_truth=in_truth,
            is_ran=is_ran,
            nd=nd,
            cost=cost,
            row_cost=row_cost,
            best_row=_argmax_per_job(job, np.where(in_truth, meas_tpc, -np.inf), n_jobs),
            cost_default=cost_default,
            eligible=np.isfinite(cost_default) & (work > 0),
            dev_hours=np.nan_to_num(c["device_hours"].to_numpy(np.float64), nan=0.0),
            has_cand=has_cand,
        )


@dataclass(frozen=True)
class Night:
    """One night of the backtest as `run_backtest(on_night=…)` hands it to a diagnosis: the rows
    the nightly model was fitted on, the model, every candidate it scored (the ranker's frame
    with predictions and intervals) with what really happened there, and the submissions with
    their point-in-time histories (to score a variant of the features)."""

    index: int
    train_frame: pd.DataFrame
    train_samples_per_s: np.ndarray
    train_lineages: np.ndarray
    seed: int
    model: ThroughputModel
    scored: pd.DataFrame
    truth: NightTruth
    submissions: pd.DataFrame
    snapshot: pit.Snapshots


def _top_choice(tr: NightTruth, p: np.ndarray, usable: np.ndarray) -> np.ndarray:
    """Per job, the row a predictor ranks first (best predicted throughput per cost among its
    usable rows with a truth); -1 when none."""
    score = np.where(usable & tr.in_truth, throughput_per_cost(p, tr.cost, tr.nd), -np.inf)
    return _argmax_per_job(tr.job, score, tr.n_jobs)


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
    m["savings"] = float(1.0 - chosen_cost[e].sum() / tr.cost_default[e].sum()) if e.any() else 0.0
    has = tr.has_cand
    m["coverage"] = float(covered[has].mean()) if has.any() else 0.0
    hours = tr.dev_hours[has].sum()
    m["coverage_device_hours"] = (
        float(tr.dev_hours[covered & has].sum() / hours) if hours > 0 else 0.0
    )
    return m


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


def _night_eval(
    subs: pd.DataFrame,
    base: pd.DataFrame,
    tr: NightTruth,
    model: ThroughputModel | None,
    lookup: LookupTable | None,
    watch: str | None = None,
    resamples: LineageResamples | None = None,
    informed: np.ndarray | None = None,
) -> tuple[dict[str, Any], pd.DataFrame]:
    """Metrics of one night's scored rows for model, lookup and oracle, and the rows with a
    truth (for plots); with `watch`, how the model treats that (new) hardware type; with
    `resamples`, the model's and the oracle's savings on resampled lineages
    (`savings_replicates`, arrays: the caller takes them out before the night is reported);
    with `informed` (the informed oracle's prediction per row), its metrics and its accuracy
    by the model's anchor kinds."""
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
    if informed is not None:
        preds[INFORMED] = informed
        sources[INFORMED] = sources["oracle"]
    for name in preds:
        p = preds[name]
        usable = (sources[name] != SRC_NONE) & np.isfinite(p) & (p > 0)
        if name not in ("oracle", INFORMED):
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
        if informed is not None:
            none = np.zeros(len(base), bool)
            out["by_anchor_informed"] = _anchor_counts(
                base,
                subs,
                model,
                informed,
                tr.in_truth & np.isfinite(informed),
                tr.meas,
                tr.in_truth,
                tr.is_ran,
                none,
                np.full(len(base), np.nan),
            )
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


def new_hardware_summary(
    per_night: list[dict[str, Any]], hw_type: str, from_day: int, warmup_days: int
) -> dict[str, Any]:
    """The nights from the type's first day: the per-night figures, the first night on which
    the model's top choice is the new type for at least half the jobs the oracle would send
    there (routed), and the model's savings as a share of the oracle's over those nights."""
    first = max(0, from_day - warmup_days)
    nights = [n for n in per_night[first:] if "new_hardware" in n]
    routed = next(
        (
            i
            for i, n in enumerate(nights)
            if n["new_hardware"]["oracle_top"] > 0
            and n["new_hardware"]["model_top"] >= 0.5 * n["new_hardware"]["oracle_top"]
        ),
        None,
    )
    model_savings = float(np.mean([n["model"]["savings"] for n in nights])) if nights else 0.0
    oracle_savings = float(np.mean([n["oracle"]["savings"] for n in nights])) if nights else 0.0
    return {
        "type": hw_type,
        "from_day": from_day,
        "nights_until_routed": routed,
        "savings_share_of_oracle": round(model_savings / oracle_savings, 4)
        if oracle_savings
        else None,
        "per_night": [{"night": first + i + 1, **n["new_hardware"]} for i, n in enumerate(nights)],
    }


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
    accuracy is lost (anchor kind, device count changed since the prior, family) and whether
    the intervals are honest there, and how wide they are for it."""
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
        for labels in (kind, transfer, dev, fam, fv):
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


def _argmax_per_job(job: np.ndarray, score: np.ndarray, n_jobs: int) -> np.ndarray:
    """Row index of the best finite score per job, -1 when none (job sorted or not)."""
    out = np.full(n_jobs, -1, np.int64)
    ok = np.isfinite(score)
    if not ok.any():
        return out
    rows = np.flatnonzero(ok)
    order = rows[np.lexsort((-score[rows], job[rows]))]
    first = np.ones(len(order), bool)
    first[1:] = job[order][1:] != job[order][:-1]
    out[job[order][first]] = order[first]
    return out


def run_backtest(
    seed: int = 0,
    nights: int = 30,
    warmup_days: int = 14,
    rate: int = DEFAULT_RATE,
    ablate: list[str] | None = None,
    policy: str = "default",
    progress: bool = True,
    train_window_days: int = TRAIN_WINDOW_DAYS,
    train_rows: int = TRAIN_ROWS,
    drift: list[Any] | None = None,
    new_hardware: tuple[str, int] | None = None,
    on_night: Callable[[Night], None] | None = None,
) -> tuple[dict[str, Any], list[pd.DataFrame]]:
    """`drift`: the simulator's DriftEvents to run instead of its random ones (a controlled
    software-release scenario; `drift_recovery` in the summary follows each).
    `new_hardware`: (type, day) a catalog type the fleet only gets on that day (0-based); the
    summary's `new_hardware` follows it from then on.
    `on_night`: called after each night is scored (benchmarks' diagnoses; it changes nothing)."""
    from tqdm import tqdm

    from leap_stream.catalog import load_catalog
    from leap_stream.tools.sim.fleet import FleetSimulator, SimConfig
    from leap_stream.tools.sim.informed import InformedOracle

    catalog = load_catalog()
    specs = catalog.spec_matrix()
    config = SimConfig(seed=seed, days=warmup_days + nights, rate=rate)
    if drift is not None:
        config = dataclasses.replace(config, drift_events=tuple(drift))
    if new_hardware is not None:
        config = dataclasses.replace(config, hardware_from=(new_hardware,))
    sim = FleetSimulator(config, catalog)
    informed = InformedOracle(
        sim.config.lineage_sigma, sim.config.lineage_vendor_sigma, sim.config.noise_sigma
    )
    vendor_of = {t: catalog[t].vendor for t in catalog.types}
    rep = pit.Replayer()
    train_parts: list[tuple[pd.DataFrame, pd.DataFrame, np.ndarray]] = []  # frame, rows, ended
    datasets: list[pd.DataFrame] = []
    variants = ["full"] + [f"-{g}" for g in (ablate or [])]
    per_night: list[dict[str, Any]] = []
    resamples = LineageResamples(np.random.default_rng([seed, 7]))
    replicates: list[dict[str, np.ndarray]] = []  # per night, savings on resampled lineages
    scored_all: list[pd.DataFrame] = []
    t_start = time.perf_counter()
    train_s = 0.0
    verdicts: Counter[str] = Counter()  # what the history rules made of every measurement

    def ingest(day: Any) -> pit.Snapshots:
        """Histories for the day's submissions, then its rows become training material.

        The day's completions go in first: a retry or resume submitted later the same day sees
        the completions that ended before it (the replay is point in time), as Redis would."""
        rep.add_completions(day.completions)
        informed.add(day.completions, day.truth, vendor_of)
        snap = rep.snapshot(day.submissions)
        verdicts.update(v for v in snap.verdicts.tolist() if v != "none")
        ds = day.dataset
        measured = pit.measured(ds.assign(_snap=np.arange(len(ds))))
        idx = measured["_snap"].to_numpy()
        frame = F.build(
            measured,
            [[h] for h in measured["hardware_type"].tolist()],
            [snap.histories[i] for i in idx],
            [snap.aggregates[i] for i in idx],
            specs,
            snap.now[idx],
        )
        ended = epoch_seconds(measured["ended_at"])
        train_parts.append((frame, measured, ended))
        datasets.append(ds)
        return snap

    bar = tqdm(
        total=warmup_days + nights,
        desc="backtest",
        unit="day",
        file=sys.stderr,
        disable=not progress,
    )
    for _ in range(warmup_days):
        ingest(sim.step_day())
        bar.update(1)
    rng = np.random.default_rng(seed)
    for _night in range(nights):
        t_n = pd.Timestamp(sim.config.start, tz="UTC").timestamp() + 86400.0 * sim.day_index
        # sliding window: the point-in-time rows of the last days (cached per day, never
        # rebuilt), reaching further back while it holds fewer than `train_rows` rows (at a low
        # rate the old rows are worth more than the window: 3000/day, all history vs 14 days
        # gave accuracy 0.321 vs 0.311, top1 0.574 vs 0.558)
        parts = train_parts
        if train_window_days > 0:
            start = max(0, len(train_parts) - train_window_days)
            held = sum(len(p[1]) for p in train_parts[start:])
            while start > 0 and train_rows > 0 and held < train_rows:
                start -= 1
                held += len(train_parts[start][1])
            parts = train_parts[start:]
        frame = pd.concat([p[0] for p in parts], ignore_index=True)
        rows = pd.concat([p[1] for p in parts], ignore_index=True)
        ended = np.concatenate([p[2] for p in parts])
        known = ended < t_n  # measurements that had arrived by the nightly run
        if train_rows > 0 and known.sum() > train_rows:
            keep = rng.choice(np.flatnonzero(known), train_rows, replace=False)
            known = np.zeros(len(known), bool)
            known[keep] = True
        all_ds = pd.concat(datasets, ignore_index=True)
        lookup = LookupTable.fit(all_ds[(epoch_seconds(all_ds["ended_at"]) < t_n)])
        models: dict[str, ThroughputModel] = {}
        t0 = time.perf_counter()
        train_frame = frame.loc[known].reset_index(drop=True)
        train_sps = rows["samples_per_s"].to_numpy(np.float64)[known]
        train_lineages = rows["lineage_id"].to_numpy(object)[known]
        for v in variants:
            groups = [g for g in F.GROUPS if v == "full" or g != v[1:]]
            models[v] = ThroughputModel.fit(
                train_frame, train_sps, train_lineages, groups=groups, seed=seed
            )
        train_s += time.perf_counter() - t0
        policy_fn = None
        if policy == "ranked":
            policy_fn = _ranked_policy(models["full"], lookup, specs, rep)
        day = sim.step_day(policy_fn)
        snap = ingest(day)
        base, tr = _score_night(
            day.submissions, day.truth, day.completions, snap, specs, models["full"], lookup
        )
        watch = None if new_hardware is None else new_hardware[0]
        informed_pred = informed.predict(
            day.submissions,
            base["job"].to_numpy(np.int64),
            base["vendor"].to_numpy(object),
            tr.known,
        )
        result, scored = _night_eval(
            day.submissions,
            base,
            tr,
            models["full"],
            lookup,
            watch,
            resamples,
            informed_pred,
        )
        replicates.append(result.pop("savings_replicates"))
        result["date"] = str(day.day)
        result["train_rows"] = int(known.sum())
        for v in variants[1:]:
            vbase, vtr = _score_night(
                day.submissions, day.truth, day.completions, snap, specs, models[v], None
            )
            r, _ = _night_eval(day.submissions, vbase, vtr, models[v], None)
            result[v] = {k: r["model"][k] for k in ABLATION_KEYS}
        if on_night is not None:
            night = Night(
                index=len(per_night),
                train_frame=train_frame,
                train_samples_per_s=train_sps,
                train_lineages=train_lineages,
                seed=seed,
                model=models["full"],
                scored=base,
                truth=tr,
                submissions=day.submissions,
                snapshot=snap,
            )
            on_night(night)
        per_night.append(result)
        scored_all.append(scored.assign(night=len(per_night)))
        bar.update(1)
        bar.set_postfix(
            acc=f"{result['model']['accuracy']:.3f}", top1=f"{result['model']['top1']:.3f}"
        )
    bar.close()
    summary = _summarise(per_night, variants, replicates)
    summary["drift_recovery"] = drift_recovery(per_night, sim.drift_events, warmup_days)
    summary["history_verdicts"] = dict(sorted(verdicts.items()))
    if new_hardware is not None:
        summary["new_hardware"] = new_hardware_summary(per_night, *new_hardware, warmup_days)
    summary.update(
        seed=seed,
        nights=nights,
        warmup_days=warmup_days,
        rate_per_day=rate,
        policy=policy,
        train_window_days=train_window_days,
        train_rows_cap=train_rows,
        train_s=round(train_s, 1),
        wall_s=round(time.perf_counter() - t_start, 1),
        per_night=per_night,
    )
    return summary, scored_all


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
        "savings",
        "coverage",
        "coverage_device_hours",
    )
    names = [*PREDICTORS, *([INFORMED] if per_night and INFORMED in per_night[0] else [])]
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
    if INFORMED in out and out["oracle"]["savings"] > 0:
        share = out[INFORMED]["savings"] / out["oracle"]["savings"]
        out[INFORMED]["savings_share_of_oracle"] = round(share, 4)
    ablation: dict[str, Any] = {}
    for v in variants[1:]:
        ablation[v[1:]] = {
            k: round(float(np.nanmean([n[v][k] for n in per_night])) - out["model"][k], 4)
            for k in ABLATION_KEYS
        }
    for key in ("by_anchor", "by_anchor_informed"):
        if pooled := _pooled_anchors(per_night, key):
            out[key] = pooled
    if INFORMED in out:
        out["ceiling"] = _ceiling(out)
    if ablation:
        out["ablation_delta"] = ablation  # variant minus full model, mean over nights
    return out


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


def _ceiling(out: dict[str, Any]) -> dict[str, dict[str, float | None]]:
    """Each headline figure as model / informed oracle (`share`: the model's share of it)."""
    figures = {k: (out["model"][k], out[INFORMED][k]) for k in CEILING_KEYS}
    model_rows = out.get("by_anchor", {}).get("all", {})
    informed_rows = out.get("by_anchor_informed", {}).get("all", {})
    for k in ("transfer", *TRANSFER_KEYS):
        if k in model_rows and k in informed_rows:
            figures[k] = (model_rows[k]["accuracy"], informed_rows[k]["accuracy"])
    return {
        k: {"model": m, "informed": i, "share": round(m / i, 4) if m is not None and i else None}
        for k, (m, i) in figures.items()
    }


DRIFT_OFFSETS = (-1, 0, 1, 2, 3, 5, 7)


def parse_drift(text: str) -> Any:
    """FAMILY:VENDOR:DAY:FACTOR → the simulator's DriftEvent (ValueError naming what is off)."""
    from leap_stream.contracts.vocab import FAMILIES, VENDORS
    from leap_stream.tools.sim.fleet import DriftEvent

    parts = text.split(":")
    if len(parts) != 4:
        raise ValueError(f"--drift {text!r}: expected FAMILY:VENDOR:DAY:FACTOR")
    family, vendor, day, factor = parts
    if family not in FAMILIES or vendor not in VENDORS:
        raise ValueError(f"--drift {text!r}: family one of {FAMILIES}, vendor one of {VENDORS}")
    try:
        event = DriftEvent(int(day), vendor, family, float(factor), "scenario")
    except ValueError:
        raise ValueError(f"--drift {text!r}: DAY is a whole number, FACTOR a number") from None
    if event.day < 0 or not event.factor > 0:
        raise ValueError(f"--drift {text!r}: DAY ≥ 0 and FACTOR > 0")
    return event


def drift_recovery(
    per_night: list[dict[str, Any]], events: list[Any], warmup_days: int
) -> list[dict[str, Any]]:
    """For each drift event inside the scored nights: the model's accuracy on the rows of the
    family and vendor it changed, on the hardware the jobs ran on and over every candidate, at
    nights relative to the event (night 0: the first day at the new speed, ranked by a model
    trained before it). How many nights until it is back is what on-call wants to know."""
    out = []
    for e in events:
        night0 = e.day - warmup_days
        if not 0 <= night0 < len(per_night):
            continue
        key = f"fv={e.family}|{e.vendor}"
        row: dict[str, Any] = {
            "day": e.day,
            "night": night0 + 1,
            "family": e.family,
            "vendor": e.vendor,
            "factor": round(e.factor, 4),
        }
        for scope in ("ran", "all"):
            acc = {}
            for off in DRIFT_OFFSETS:
                n = night0 + off
                if 0 <= n < len(per_night):
                    counts = per_night[n].get("by_anchor", {}).get(scope, {}).get(key)
                    if counts and counts[0]:
                        acc[str(off)] = round(counts[1] / counts[0], 4)
            row[f"accuracy_{scope}_by_offset"] = acc
        out.append(row)
    return out


def _ranked_policy(
    model: ThroughputModel, lookup: LookupTable, specs: pd.DataFrame, rep: pit.Replayer
) -> Any:
    """The ranker's top choice as the simulator policy, with start-of-day history."""

    def policy(subs: pd.DataFrame) -> pd.Series:
        book = rep.book
        hist = [book.lineage(x) for x in subs["lineage_id"].tolist()]
        aggs_by_type = {m: book.aggregates(m) for m in subs["model_type"].unique()}
        aggs = [aggs_by_type[m] for m in subs["model_type"].tolist()]
        now = epoch_seconds(subs["submitted_at"])
        fr, _ = Ranker(_SpecCatalog(specs), model, lookup).score_batch(
            subs, _candidates(subs), hist, aggs, now
        )
        job = fr["job"].to_numpy(np.int64)
        score = np.where(fr["source"].to_numpy() != SRC_NONE, fr["tpc"].to_numpy(), -np.inf)
        top = _argmax_per_job(job, score, len(subs))
        hw = fr["hardware_type"].to_numpy(object)
        choice = np.where(top >= 0, hw[np.maximum(top, 0)], subs["default_hardware"].to_numpy())
        return pd.Series(choice, index=subs.index)

    return policy


def plots(summary: dict[str, Any], scored: list[pd.DataFrame], out_dir: Path) -> list[Path]:
    from leap_stream.tools.pyplot import pyplot

    plt = pyplot()

    out_dir.mkdir(parents=True, exist_ok=True)
    nights = summary["per_night"]
    x = np.arange(1, len(nights) + 1)
    paths = []
    for metric, fname, ylabel in (
        ("accuracy", "accuracy_per_night.png", "share within ±10 % of measured"),
        ("savings", "savings_per_night.png", "cost saved vs default hardware"),
    ):
        fig, ax = plt.subplots(figsize=(7, 4))
        for name in PREDICTORS:
            ax.plot(x, [n[name][metric] for n in nights], marker="o", ms=3, label=name)
        ax.set_xlabel("night")
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
        ax.legend()
        fig.tight_layout()
        p = out_dir / fname
        fig.savefig(p, dpi=110)
        plt.close(fig)
        paths.append(p)
    allsc = pd.concat(scored, ignore_index=True) if scored else pd.DataFrame()
    if len(allsc):
        sample = allsc.sample(min(len(allsc), 20000), random_state=0)
        fig, ax = plt.subplots(figsize=(6, 6))
        for name in ("lookup", "model"):
            ok = np.isfinite(sample[name]) & (sample[name] > 0)
            ax.scatter(sample["measured"][ok], sample[name][ok], s=2, alpha=0.3, label=name)
        lim = [max(1e-3, float(sample["measured"].min())), float(sample["measured"].max())]
        ax.plot(lim, lim, "k--", lw=1)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("measured samples/s")
        ax.set_ylabel("predicted samples/s")
        ax.legend()
        fig.tight_layout()
        p = out_dir / "calibration.png"
        fig.savefig(p, dpi=110)
        plt.close(fig)
        paths.append(p)
    return paths


def register(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--nights", type=int, default=30)
    parser.add_argument("--warmup-days", type=int, default=14)
    parser.add_argument(
        "--rate",
        type=int,
        default=DEFAULT_RATE,
        help="submissions per simulated day (the simulator's own default is 30000)",
    )
    parser.add_argument(
        "--train-window-days",
        type=int,
        default=TRAIN_WINDOW_DAYS,
        help="nightly training on the last N days of rows, further back while they hold fewer "
        "than --train-rows rows (0: everything)",
    )
    parser.add_argument(
        "--train-rows",
        type=int,
        default=TRAIN_ROWS,
        help="subsample the nightly training rows to at most this many (0: all)",
    )
    parser.add_argument("--ablate", default="", help="feature groups to drop, e.g. prior,specs")
    parser.add_argument("--policy", choices=("default", "ranked"), default="default")
    parser.add_argument(
        "--new-hardware",
        metavar="TYPE",
        help="a catalog type the fleet only gets from --from-day on (no history before it)",
    )
    parser.add_argument("--from-day", type=int, default=20, help="with --new-hardware (0-based)")
    parser.add_argument(
        "--drift",
        action="append",
        metavar="FAMILY:VENDOR:DAY:FACTOR",
        help="a software release from DAY (0-based, warm-up included) multiplying VENDOR's speed "
        "on FAMILY by FACTOR, instead of the simulator's random ones; repeatable",
    )
    parser.add_argument("--plots", type=Path, help="folder for PNG plots")
    parser.add_argument("--json", action="store_true", help="print the full per-night JSON")
    parser.add_argument("--no-progress", action="store_true")


def run(args: argparse.Namespace, _settings: Settings) -> int:
    ablate = [g.strip() for g in args.ablate.split(",") if g.strip()]
    unknown = [g for g in ablate if g not in F.GROUPS]
    if unknown:
        print(
            f"backtest: unknown feature groups {unknown}; known: {list(F.GROUPS)}", file=sys.stderr
        )
        return 2
    try:
        drift = None if args.drift is None else [parse_drift(d) for d in args.drift]
    except ValueError as exc:
        print(f"backtest: {exc}", file=sys.stderr)
        return 2
    from leap_stream.tools.pyplot import INSTALL_HINT, plots_available

    if args.plots and not plots_available():  # before the run, not after it
        print(f"backtest: --plots: {INSTALL_HINT}", file=sys.stderr)
        return 2
    new_hw = None
    if args.new_hardware:
        from leap_stream.catalog import load_catalog

        if args.new_hardware not in load_catalog():
            print(
                f"backtest: --new-hardware {args.new_hardware!r} is not in the catalog",
                file=sys.stderr,
            )
            return 2
        new_hw = (args.new_hardware, args.from_day)
    summary, scored = run_backtest(
        new_hardware=new_hw,
        drift=drift,
        seed=args.seed,
        nights=args.nights,
        warmup_days=args.warmup_days,
        rate=args.rate,
        ablate=ablate,
        policy=args.policy,
        progress=not args.no_progress,
        train_window_days=args.train_window_days,
        train_rows=args.train_rows,
    )
    if args.plots:
        summary["plots"] = [str(p) for p in plots(summary, scored, args.plots)]
    if not args.json:
        summary = {k: v for k, v in summary.items() if k != "per_night"}
    for name in (*PREDICTORS, INFORMED):
        m = summary[name]
        print(
            f"{name:8s} accuracy {m['accuracy']:.3f} (ran-on {m['accuracy_ran']:.3f}) "
            f"MAPE {m['mape']:.3f} top1 {m['top1']:.3f} regret {m['regret']:.3f} "
            f"savings {m['savings']:.3f} coverage {m['coverage']:.3f}",
            file=sys.stderr,
        )
    m = summary["model"]
    print(
        f"model   first + within the noise of it: {m['noise_set_size']:.2f} candidates, "
        f"holding the measured best {m['best_in_noise_set']:.3f}",
        file=sys.stderr,
    )
    if m["savings_share_of_oracle"] is not None:
        lo_hi = m["savings_share_of_oracle_95"]
        band = f" (95 % over resampled lineages {lo_hi[0]:.3f}–{lo_hi[1]:.3f})" if lo_hi else ""
        print(
            f"model   savings {m['savings_share_of_oracle']:.3f} of the oracle's{band}",
            file=sys.stderr,
        )
    print(
        "model / informed oracle: "
        + ", ".join(
            f"{k} {v['model']:.3f} / {v['informed']:.3f}" for k, v in summary["ceiling"].items()
        ),
        file=sys.stderr,
    )
    print(orjson.dumps(summary, option=orjson.OPT_SERIALIZE_NUMPY).decode())
    return 0
