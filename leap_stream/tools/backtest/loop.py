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

import dataclasses
import sys
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

import numpy as np
import pandas as pd

from leap_stream.contracts.timestamps import epoch_seconds
from leap_stream.core import features as F
from leap_stream.core.lookup import LookupTable
from leap_stream.core.predictor import ThroughputModel
from leap_stream.core.probe import ProbeSettings
from leap_stream.store.offline import DATASET_COLUMNS
from leap_stream.tools.backtest.params import (
    ABLATION_KEYS,
    ATTAINABLE,
    DEFAULT_RATE,
    INFORMED,
    TRAIN_ROWS,
    TRAIN_WINDOW_DAYS,
)
from leap_stream.tools.backtest.policy import RankedPolicy
from leap_stream.tools.backtest.scenarios import drift_recovery, new_hardware_summary
from leap_stream.tools.backtest.scoring import (
    LineageResamples,
    _night_eval,
    _score_night,
    as_run_figures,
)
from leap_stream.tools.backtest.summary import _summarise
from leap_stream.tools.backtest.truth import Night
from leap_stream.train import pit


def run_backtest(
    seed: int = 0,
    nights: int = 30,
    warmup_days: int = 14,
    rate: int = DEFAULT_RATE,
    ablate: list[str] | None = None,
    policy: str = "ranked",
    progress: bool = True,
    train_window_days: int = TRAIN_WINDOW_DAYS,
    train_rows: int = TRAIN_ROWS,
    drift: list[Any] | None = None,
    new_hardware: tuple[str, int] | None = None,
    on_night: Callable[[Night], None] | None = None,
    explore_budget: float = 0.0,
    probe: ProbeSettings | None = None,
) -> tuple[dict[str, Any], list[pd.DataFrame]]:
    """`drift`: the simulator's DriftEvents to run instead of its random ones (a controlled
    software-release scenario; `drift_recovery` in the summary follows each).
    `new_hardware`: (type, day) a catalog type the fleet only gets on that day (0-based); the
    summary's `new_hardware` follows it from then on.
    `on_night`: called after each night is scored (benchmarks' diagnoses; it changes nothing).
    `probe`: the probes' settings (`core.probe`; None or a zero budget: no probes)."""
    from tqdm import tqdm

    from leap_stream.catalog import load_catalog
    from leap_stream.tools.sim.config import SimConfig
    from leap_stream.tools.sim.fleet import FleetSimulator
    from leap_stream.tools.sim.informed import AttainableOracle, FleetRuns, InformedOracle, Priors

    catalog = load_catalog()
    specs = catalog.spec_matrix()
    config = SimConfig(seed=seed, days=warmup_days + nights, rate=rate)
    if drift is not None:
        config = dataclasses.replace(config, drift_events=tuple(drift))
    if new_hardware is not None:
        config = dataclasses.replace(config, hardware_from=(new_hardware,))
    sim = FleetSimulator(config, catalog)
    priors = Priors(
        sim.config.lineage_sigma, sim.config.lineage_vendor_sigma, sim.config.noise_sigma
    )
    fleet_runs = FleetRuns()
    informed = InformedOracle(priors, fleet_runs)
    attainable = AttainableOracle(priors, sim.config.model_hw_sigma, fleet_runs)
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

    def ingest(day: Any, probes: pd.DataFrame | None = None) -> pit.Snapshots:
        """Histories for the day's submissions, then its rows become training material.

        The day's completions go in first: a retry or resume submitted later the same day sees
        the completions that ended before it (the replay is point in time), as Redis would.
        `probes`: the dataset rows of the day's probes, which enter the history and the
        training rows like any completion (features: their job's, at its submission)."""
        rep.add_completions(day.completions)
        ds = day.dataset.assign(_snap=np.arange(len(day.dataset)))
        runs = day.completions  # what the ceilings learn from: every measurement of the day
        if probes is not None:
            probe_runs = probes[[c for c in probes if c in day.completions]]
            rep.add_completions(probe_runs)
            keys = zip(ds["job_id"], ds["attempt"], strict=True)
            position = {key: i for i, key in enumerate(keys)}
            at = [position[k] for k in zip(probes["job_id"], probes["attempt"], strict=True)]
            ds = pd.concat([ds, probes.assign(_snap=at)], ignore_index=True)
            runs = pd.concat([runs, whole_job_runs(probe_runs, day.submissions)])
        fleet_runs.add(runs, day.truth, vendor_of)
        snap = rep.snapshot(day.submissions)
        verdicts.update(v for v in snap.verdicts.tolist() if v != "none")
        measured = pit.measured(ds)
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
        datasets.append(ds.drop(columns="_snap"))
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
            policy_fn = RankedPolicy(
                models["full"],
                lookup,
                specs,
                rep,
                explore_budget,
                probe or ProbeSettings(budget=0.0),
                lambda: sim.short_runs,
                DATASET_COLUMNS,
            )
        day = sim.step_day(policy_fn)
        probes = policy_fn.take_probe_rows() if policy_fn is not None else None
        snap = ingest(day, probes)
        base, tr = _score_night(
            day.submissions, day.truth, day.completions, snap, specs, models["full"], lookup
        )
        watch = None if new_hardware is None else new_hardware[0]
        job, vendor = base["job"].to_numpy(np.int64), base["vendor"].to_numpy(object)
        ceilings = {
            INFORMED: informed.predict(day.submissions, job, vendor, tr.known),
            ATTAINABLE: attainable.predict(
                day.submissions, job, vendor, base["hardware_type"].to_numpy(object), tr.physics
            ),
        }
        result, scored = _night_eval(
            day.submissions,
            base,
            tr,
            models["full"],
            lookup,
            watch,
            resamples,
            ceilings,
        )
        replicates.append(result.pop("savings_replicates"))
        if policy_fn is not None:
            result["as_run"] = as_run_figures(
                day.submissions, base, tr, policy_fn.explored, policy_fn.probed
            )
            result["as_run"]["probe_rows"] = (
                0.0 if probes is None else float(len(pit.measured(probes)))
            )
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
        explore_budget=explore_budget if policy == "ranked" else 0.0,
        probe_budget=probe.budget if probe is not None and policy == "ranked" else 0.0,
        train_window_days=train_window_days,
        train_rows_cap=train_rows,
        train_s=round(train_s, 1),
        wall_s=round(time.perf_counter() - t_start, 1),
        per_night=per_night,
    )
    return summary, scored_all


def whole_job_runs(probe_runs: pd.DataFrame, subs: pd.DataFrame) -> pd.DataFrame:
    """The probes that ran their whole job (its device count): the truth's rates are the
    job's, so only those measure what the ceilings model."""
    jobs = subs[["job_id", "attempt", "num_devices"]].rename(columns={"num_devices": "_job"})
    m = probe_runs.merge(jobs, on=["job_id", "attempt"], how="inner")
    return m[m["num_devices"].to_numpy() == m["_job"].to_numpy()].drop(columns="_job")
