"""A night's ground truth: every candidate's measured throughput and what a choice costs, and
what a night hands a diagnosis (`Night`)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from leap_stream.core.predictor import ThroughputModel
from leap_stream.core.ranking import best_per_job, throughput_per_cost
from leap_stream.train import pit


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
    physics: np.ndarray  # physics, software stack and drift (the attainable oracle's base)
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
        extra = [
            c
            for c in ("measured_samples_per_s", "known_samples_per_s", "physics_samples_per_s")
            if c in truth
        ]
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
            physics=t.get("physics_samples_per_s", pd.Series(np.nan, t.index)).to_numpy(np.float64),
            in_truth=in_truth,
            is_ran=is_ran,
            nd=nd,
            cost=cost,
            row_cost=row_cost,
            best_row=best_per_job(job, np.where(in_truth, meas_tpc, -np.inf), n_jobs),
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
