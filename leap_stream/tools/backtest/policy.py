"""The closed loop's scheduler: it runs each job where the ranking says, explores where the
ranking marks an exploration, and probes where it marks a probe, then chooses on what the
probes measured (`core.probe.choose_after_probes`); the probes' measurements enter the history
and the training rows like any completion."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import pandas as pd

from leap_stream.contracts.timestamps import epoch_seconds
from leap_stream.core.explore import explorations, never_measured
from leap_stream.core.lookup import LookupTable
from leap_stream.core.predictor import ThroughputModel
from leap_stream.core.probe import (
    ProbeSettings,
    carry,
    choose_after_probes,
    plan_probes,
    probe_cost_as_run,
)
from leap_stream.core.ranker import SRC_MODEL, SRC_NONE, Ranker
from leap_stream.core.ranking import best_per_job, throughput_per_cost, within_noise_of_best
from leap_stream.core.slices import probe_rates, probe_slices, slice_predictions
from leap_stream.tools.backtest.truth import _candidates, _SpecCatalog
from leap_stream.tools.sim.short_runs import ShortRuns, probe_dataset_rows
from leap_stream.train import pit


@dataclasses.dataclass(frozen=True)
class Probed:
    """One probed job attempt: the types probed, where it then ran, the probes' cost as run
    (USD; `core.probe.probe_cost_as_run`)."""

    types: tuple[str, ...]
    ran_on: str
    cost: float


@dataclasses.dataclass
class RankedPolicy:
    """The ranker's top choice as the simulator policy, with start-of-day history; where the
    ranking marks an exploration (`core.explore`, within `explore_budget`), the explored type;
    where it marks a probe (`core.probe`, within `probe.budget`), the type
    `core.probe.choose_after_probes` picks on what the probes measured. `explored`, `probed`: per (job_id, attempt), over
    every call (a day calls it once per round of submissions); `probe_rows`: the probes'
    dataset rows since the last `take_probe_rows`."""

    model: ThroughputModel
    lookup: LookupTable
    specs: pd.DataFrame
    rep: pit.Replayer
    explore_budget: float = 0.0
    probe: ProbeSettings = dataclasses.field(default_factory=lambda: ProbeSettings(budget=0.0))
    short_runs: Any = None  # () -> ShortRuns of the running day (the simulator's)
    dataset_columns: tuple[str, ...] = ()
    explored: dict[tuple[str, int], str] = dataclasses.field(default_factory=dict)
    probed: dict[tuple[str, int], Probed] = dataclasses.field(default_factory=dict)
    probe_rows: list[pd.DataFrame] = dataclasses.field(default_factory=list)

    def __call__(self, subs: pd.DataFrame) -> pd.Series:
        book = self.rep.book
        hist = [book.lineage(x) for x in subs["lineage_id"].tolist()]
        aggs_by_type = {m: book.aggregates(m) for m in subs["model_type"].unique()}
        aggs = [aggs_by_type[m] for m in subs["model_type"].tolist()]
        now = epoch_seconds(subs["submitted_at"])
        ranker = Ranker(_SpecCatalog(self.specs), self.model, self.lookup, probe=self.probe)
        fr, _ = ranker.score_batch(subs, _candidates(subs), hist, aggs, now)
        job = fr["job"].to_numpy(np.int64)
        usable = fr["source"].to_numpy() != SRC_NONE
        tpc = fr["tpc"].to_numpy(np.float64)
        top = best_per_job(job, np.where(usable, tpc, -np.inf), len(subs))
        hw = fr["hardware_type"].to_numpy(object)
        nd = subs["num_devices"].to_numpy(np.float64)[job]
        explore, _extra = self._explorations(fr, job, tpc, nd, usable, len(subs))
        pick = np.where(explore >= 0, explore, top)
        keys = list(zip(subs["job_id"].tolist(), subs["attempt"].tolist(), strict=True))
        choice = np.where(pick >= 0, hw[np.maximum(pick, 0)], subs["default_hardware"].to_numpy())
        context = (hist, aggs, np.asarray(now, np.float64))
        for j, ran_on in self._probe(ranker, subs, fr, top, context).items():
            choice[j] = ran_on
            explore[j] = -1
        for j in np.flatnonzero(explore >= 0).tolist():
            self.explored[(str(keys[j][0]), int(keys[j][1]))] = str(hw[explore[j]])
        return pd.Series(choice, index=subs.index)

    def take_probe_rows(self) -> pd.DataFrame | None:
        """The probes' dataset rows since the last call (None: no probe ran)."""
        rows, self.probe_rows = self.probe_rows, []
        return pd.concat(rows, ignore_index=True) if rows else None

    def _probe(
        self,
        ranker: Ranker,
        subs: pd.DataFrame,
        fr: pd.DataFrame,
        first: np.ndarray,
        context: tuple[list[Any], list[Any], np.ndarray],
    ) -> dict[int, str]:
        """Run the probes the ranking marks; per probed job (position), where it runs.
        `first`: per job the ranking's first row (a probed job's rows are all the model's);
        `context`: per job its history, aggregates and submission time (as `score_batch`)."""
        if not self.probe.enabled or self.short_runs is None:
            return {}
        job = fr["job"].to_numpy(np.int64)
        slices = probe_slices(ranker.spec_arrays, self.probe, subs, fr)
        price = fr["cost"].to_numpy(np.float64)
        probe_rate = probe_rates(subs, fr, slices)
        # the model's rows as the ranker gives them to `plan_probes` (a lookup has no interval)
        belief = (
            job,
            np.where(fr["source"].to_numpy() == SRC_MODEL, fr["pred"].to_numpy(np.float64), np.nan),
            fr["low"].to_numpy(np.float64),
            fr["high"].to_numpy(np.float64),
            price * subs["num_devices"].to_numpy(np.float64)[job],
        )
        plan = plan_probes(
            *belief,
            subs["planned_samples"].to_numpy(np.float64)
            if "planned_samples" in subs
            else np.full(len(subs), np.nan),
            self.probe,
            probe_rate,
        )
        rows = np.flatnonzero(plan.rows)
        if not len(rows):
            return {}
        rows, at_probe = self._at_probe_size(ranker, subs, fr, rows, slices, context)
        if not len(rows):
            return {}
        runs: ShortRuns = self.short_runs()
        hw_all = fr["hardware_type"].to_numpy(object)
        at, types = job[rows], hw_all[rows].tolist()
        measured = runs.measure(at, types, self.probe.minutes, slices[rows])
        self.probe_rows.append(
            probe_dataset_rows(
                subs, at, types, measured, self.probe.minutes, self.dataset_columns, slices[rows]
            )
        )
        meas_rows = np.full(len(fr), np.nan)
        meas_rows[rows] = carry(measured, belief[1][rows], at_probe)
        post = choose_after_probes(*belief, meas_rows, self.probe, len(subs))
        out: dict[int, str] = {}
        job_ids, attempts = subs["job_id"].tolist(), subs["attempt"].tolist()
        for j in np.unique(at).tolist():
            if post[j] < 0:
                continue
            out[j] = str(hw_all[post[j]])
            mine = rows[at == j]
            rates = {str(hw_all[r]): float(probe_rate[r]) for r in mine.tolist()}
            cost = probe_cost_as_run(rates, str(hw_all[first[j]]), out[j], self.probe)
            self.probed[(str(job_ids[j]), int(attempts[j]))] = Probed(tuple(rates), out[j], cost)
        return out

    @staticmethod
    def _at_probe_size(
        ranker: Ranker,
        subs: pd.DataFrame,
        fr: pd.DataFrame,
        rows: np.ndarray,
        slices: np.ndarray,
        context: tuple[list[Any], list[Any], np.ndarray],
    ) -> tuple[np.ndarray, np.ndarray]:
        """The probed rows that can run (as the ranker keeps them: a job whose every probed
        type has a prediction at its slice) and those predictions."""
        job = fr["job"].to_numpy(np.int64)
        pred = slice_predictions(ranker.score_columns, subs, fr, rows, slices, *context)
        bad = np.unique(job[rows][~(np.isfinite(pred) & (pred > 0))])
        keep = ~np.isin(job[rows], bad)
        return rows[keep], pred[keep]

    def _explorations(
        self,
        fr: pd.DataFrame,
        job: np.ndarray,
        tpc: np.ndarray,
        nd: np.ndarray,
        usable: np.ndarray,
        n: int,
    ) -> tuple[np.ndarray, np.ndarray]:
        """Per job the row the ranking marks `explore` (-1: none), as `Ranker` marks it."""
        if self.explore_budget <= 0:
            return np.full(n, -1, np.int64), np.full(n, np.nan)
        high = throughput_per_cost(fr["high"].to_numpy(np.float64), fr["cost"].to_numpy(), nd)
        near = within_noise_of_best(job, tpc, high, usable, n)
        return explorations(job, tpc, near, never_measured(fr), self.explore_budget, n)


__all__ = ["Probed", "RankedPolicy"]
