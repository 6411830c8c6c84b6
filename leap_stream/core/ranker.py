"""`Ranker`: submissions → hardware rankings, with the model → lookup → none fallback chain.

One feature build and one LightGBM call per batch; everything else is numpy over the flattened
(job × candidate) rows. `score_batch` returns the scored rows (the backtest uses them to compare
against the simulator's truth); `rank_batch` formats them as `hardware-ranking` events.
"""

from __future__ import annotations

import logging
from collections.abc import Container, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Protocol

import numpy as np
import pandas as pd

from leap_stream.contracts.events import (
    Excluded,
    Exploration,
    HardwareRanking,
    JobSubmitted,
    Probe,
    RankedCandidate,
    RankingSource,
)
from leap_stream.contracts.timestamps import format_ts, parse_ts
from leap_stream.core import features as F
from leap_stream.core.aggregates import AggregatesAsOf, AggregateTable
from leap_stream.core.columns import Columns, column_codes
from leap_stream.core.explore import REASON as EXPLORE_REASON
from leap_stream.core.explore import explorations, never_measured
from leap_stream.core.history import LineageHistory, TypeAggregates
from leap_stream.core.intervals import INTERVAL_LEVEL
from leap_stream.core.lookup import LookupTable
from leap_stream.core.predictor import OOD_MARGIN, ThroughputModel
from leap_stream.core.probe import ProbeSettings, plan_probes
from leap_stream.core.ranking import (
    SCHEMA_VERSION,
    SRC_LOOKUP,
    SRC_MODEL,
    SRC_NONE,
    rank_order,
    ranking_event_id,
    throughput_per_cost,
    within_noise_of_best,
)
from leap_stream.core.slices import probe_rates, probe_slices, size_probes
from leap_stream.core.specs import SpecArrays

log = logging.getLogger(__name__)


class Catalog(Protocol):
    def spec_matrix(self) -> pd.DataFrame: ...


def jobs_frame(submissions: Sequence[Mapping[str, Any]]) -> pd.DataFrame:
    """`job_columns` as a DataFrame."""
    return job_columns(submissions).to_pandas()


def job_columns(submissions: Sequence[Mapping[str, Any]]) -> Columns:
    """Flatten validated job-submitted events into the dataset's column names."""
    models = [s["model"] for s in submissions]
    training = [s["training"] for s in submissions]
    cols: dict[str, Any] = {
        "lineage_id": [s["lineage_id"] for s in submissions],
        "submitted_at_s": np.fromiter(
            (parse_ts(s["submitted_at"]) for s in submissions), np.float64, len(submissions)
        ),
    }
    for c in (
        "family",
        "model_type",
        "parameters",
        "layers",
        "hidden_size",
        "sequence_length",
        "precision",
        "optimizer",
        "framework",
    ):
        cols[c] = [m[c] for m in models]
    cols["active_parameters"] = [m.get("active_parameters", m["parameters"]) for m in models]
    for c in (
        "global_batch_size",
        "micro_batch_size",
        "num_devices",
        "data_parallel",
        "tensor_parallel",
        "pipeline_parallel",
        "activation_checkpointing",
    ):
        cols[c] = [t[c] for t in training]
    cols["planned_samples"] = np.fromiter(
        (t.get("planned_samples", np.nan) for t in training), np.float64, len(training)
    )
    out = Columns(n=len(submissions))
    for c, v in cols.items():
        out[c] = np.asarray(v, dtype=object if c in _STRING_COLUMNS else None)
    return out


_STRING_COLUMNS = frozenset(
    ("lineage_id", "family", "model_type", "precision", "optimizer", "framework")
)


class Ranker:
    def __init__(
        self,
        catalog: Catalog,
        model: ThroughputModel | None = None,
        lookup: LookupTable | None = None,
        explore_budget: float = 0.0,
        probe: ProbeSettings | None = None,
    ) -> None:
        self.specs = catalog.spec_matrix()
        # the largest expected extra cost share of an exploration (core/explore.py); 0: none
        self.explore_budget = explore_budget
        self.probe = probe  # what a probe may cost and measures (core/probe.py); None: none
        self._spec_arrays = SpecArrays.of(self.specs)
        self.model = model
        self.lookup = lookup
        self._known = self._spec_arrays.code  # type ids of the catalog (a dict: `in` is a lookup)

    @property
    def spec_arrays(self) -> SpecArrays:
        """Its catalog's specs as arrays (the physics of the history's guard uses them too)."""
        return self._spec_arrays

    @property
    def known_types(self) -> Container[str]:
        """The hardware types this ranker can offer (its catalog's)."""
        return self._known

    def score_batch(
        self,
        jobs: pd.DataFrame | Columns,
        candidates: Sequence[Sequence[str]],
        histories: Sequence[LineageHistory | None],
        aggregates: Sequence[TypeAggregates | None] | AggregatesAsOf,
        now: np.ndarray,
    ) -> tuple[pd.DataFrame, np.ndarray]:
        """Scored (job × known candidate) rows and a per-job reason code for the model stage.

        Row columns added: `pred`, `low`, `high` (NaN when no prediction), `source` (0 model,
        1 lookup, 2 none), `cost`, `tpc`.
        """
        frame, reason = self.score_columns(jobs, candidates, histories, aggregates, now)
        return frame.to_pandas(), reason

    def score_columns(
        self,
        jobs: pd.DataFrame | Columns,
        candidates: Sequence[Sequence[str]],
        histories: Sequence[LineageHistory | None],
        aggregates: Sequence[TypeAggregates | None] | AggregatesAsOf,
        now: np.ndarray,
    ) -> tuple[Columns, np.ndarray]:
        """`score_batch` without pandas (the serving path)."""
        known = self._known
        known_cands = [[t for t in c if t in known] for c in candidates]
        hist = [h or {} for h in histories]
        frame = F.build_columns(jobs, known_cands, hist, aggregates, self._spec_arrays, now)
        n, n_jobs = len(frame), len(jobs)
        pred = np.full(n, np.nan)
        low = np.full(n, np.nan)
        high = np.full(n, np.nan)
        source = np.full(n, SRC_NONE, np.int64)
        fits = np.asarray(frame["fits"], bool)
        model_reason = np.full(n_jobs, "ok" if self.model is not None else "no_model", object)
        ood = np.zeros(n_jobs, bool)  # the model extrapolates for this job (OOD_MARGIN)
        few = np.zeros(n, bool)  # the candidate's type had too few held-out measurements
        if self.model is not None and fits.any():
            try:
                # every row scored (no copy of the frame for the ~1 % that do not fit), kept
                # where the job fits
                excess = self.model.support_excess(frame)  # widens intervals, flags the job
                p50, p10, p90 = self.model.predict(frame, excess)
                pred[fits], low[fits], high[fits] = p50[fits], p10[fits], p90[fits]
                ok = fits & np.isfinite(pred) & (pred > 0)
                source[ok] = SRC_MODEL
                outside = ok & (excess > OOD_MARGIN)
                few = ok & self.model.few_measurements(frame)
                np.logical_or.at(ood, np.asarray(frame["job"], np.int64)[outside], True)
            except Exception:  # a bad model must not take the worker down: fall back
                log.exception("model prediction failed; falling back to the lookup table")
                model_reason[:] = "model_error"
                pred[:] = np.nan
        job = np.asarray(frame["job"], np.int64)
        hw_names = np.asarray(frame["hardware_type"], object)
        # A job whose fitting candidates did not all get a model prediction uses the lookup.
        all_model = np.ones(n_jobs, bool)
        np.logical_and.at(all_model, job[fits], source[fits] == SRC_MODEL)
        has_fit = np.zeros(n_jobs, bool)
        has_fit[job[fits]] = True
        need_lookup = has_fit & ~(all_model & (model_reason == "ok"))
        model_reason[has_fit & ~all_model & (model_reason == "ok")] = "model_error"
        rows_lk = fits & need_lookup[job]
        source[rows_lk] = SRC_NONE
        pred[rows_lk] = low[rows_lk] = high[rows_lk] = np.nan
        if self.lookup is not None and rows_lk.any():
            sub = job[rows_lk]
            lk, _lv = self.lookup.predict(
                np.asarray(jobs["model_type"], object)[sub],
                np.asarray(jobs["family"], object)[sub],
                hw_names[rows_lk],
                np.asarray(jobs["num_devices"], np.float64)[sub],
            )
            pred[rows_lk] = lk
            source[rows_lk] = np.where(np.isfinite(lk) & (lk > 0), SRC_LOOKUP, SRC_NONE)
        nd = np.asarray(jobs["num_devices"], np.float64)[job]
        hw_codes = column_codes(frame, "hardware_type", self._spec_arrays.code)
        cost = self._spec_arrays.cost[hw_codes]  # -1: NaN
        frame["pred"] = pred
        frame["low"] = low
        frame["high"] = high
        frame["source"] = source
        frame["cost"] = cost
        frame["tpc"] = throughput_per_cost(pred, cost, nd)
        frame["ood"] = ood[job]
        frame["few"] = few & (source == SRC_MODEL)
        return frame, model_reason

    def rank_batch(
        self,
        submissions: Sequence[JobSubmitted],
        histories: Sequence[LineageHistory | None],
        aggregates: Mapping[str, TypeAggregates],
        now: datetime,
    ) -> list[HardwareRanking]:
        """One hardware-ranking event per submission (see docs/design.md, Core API)."""
        if not submissions:
            return []
        jobs = job_columns(submissions)
        model_types = jobs["model_type"].tolist()
        aggs: Sequence[TypeAggregates | None] | AggregatesAsOf = (
            aggregates.as_of(model_types)  # the online store's flat table: no dict per job
            if isinstance(aggregates, AggregateTable)
            else [aggregates.get(m) for m in model_types]
        )
        frame, model_reason = self.score_columns(
            jobs,
            [s["candidate_hardware"] for s in submissions],
            histories,
            aggs,
            jobs["submitted_at_s"],
        )
        planned = np.asarray(jobs["planned_samples"], np.float64)
        # slices only when probes run them (whole-job probes cost the job's own rate)
        sliced = self.probe is not None and self.probe.enabled and not self.probe.in_place
        slices = (
            probe_slices(self._spec_arrays, self.probe, jobs, frame)
            if sliced and bool((planned > 0).any())
            else None
        )
        rows = _RankedRows.of(
            frame,
            np.asarray(jobs["num_devices"], np.int64),
            len(submissions),
            self.explore_budget,
            self.probe,
            planned,
            None if slices is None else probe_rates(jobs, frame, slices),
        )
        if slices is not None and any(p is not None for p in rows.probes):
            size_probes(self.score_columns, rows.probes, frame, jobs, slices, histories, aggs)
        ood = np.zeros(len(submissions), bool)
        ood[np.asarray(frame["job"], np.int64)] = np.asarray(frame["ood"], bool)
        version = self.model.version if self.model is not None else None
        produced = format_ts(now)
        now_s = now.timestamp()
        submitted_s = np.asarray(jobs["submitted_at_s"], np.float64).tolist()
        out: list[HardwareRanking] = []
        for j, s in enumerate(submissions):
            cands, excluded = rows.of_job(j, s["candidate_hardware"])
            source_name, reason = rows.verdict(j, bool(cands), str(model_reason[j]))
            out.append(
                {
                    "schema_version": SCHEMA_VERSION,
                    "event_id": ranking_event_id(s["event_id"]),
                    "job_id": s["job_id"],
                    "attempt": s["attempt"],
                    "lineage_id": s["lineage_id"],
                    "submission_event_id": s["event_id"],
                    "submitted_at": s["submitted_at"],
                    "produced_at": produced,
                    "model_version": version if source_name == "model" else None,
                    "source": source_name,
                    "reason": reason,
                    "history_used": bool(histories[j]),
                    "candidates": cands,
                    "excluded": excluded,
                    "latency_ms": max(0.0, (now_s - submitted_s[j]) * 1000.0),
                }
            )
            if ood[j] and source_name == "model":
                out[-1]["out_of_distribution"] = True
            # a probe measures what an exploration would guess at: a probed job explores nothing
            if (probe := rows.probes[j]) is not None and source_name == "model":
                out[-1]["probe"] = probe
            elif (explore := rows.explored[j]) is not None and source_name == "model":
                out[-1]["explore"] = explore
        return out


class _LazyTypes:
    """Job j's catalog candidate types, computed only for the (rare) job that names unknown
    ones."""

    def __init__(self, hw_all: np.ndarray, order: np.ndarray, starts: np.ndarray) -> None:
        self._hw, self._order, self._starts = hw_all, order, starts

    def __getitem__(self, j: int) -> set[str]:
        rows = self._order[self._starts[j] : self._starts[j + 1]].tolist()
        return {self._hw[r] for r in rows}


@dataclass(frozen=True)
class _RankedRows:
    """The scored (job × candidate) rows in ranking order: per job, its usable candidates
    (best throughput per cost first) as schema entries, then its exclusions, each a
    contiguous run built by two comprehensions (no per-row branching in Python)."""

    entries: list[RankedCandidate]
    excluded: list[Excluded]
    ok_start: list[int]
    bad_start: list[int]
    n_rows: list[int]
    row_types: _LazyTypes  # the candidate types of each job that are in the catalog
    has_model: list[bool]
    any_fit: list[bool]
    explored: list[Exploration | None]  # per job, its exploration (core/explore.py) or None
    probes: list[Probe | None]  # per job, its probe (core/probe.py) or None

    @classmethod
    def of(
        cls,
        frame: Columns,
        num_devices: np.ndarray,
        n_sub: int,
        explore_budget: float = 0.0,
        probe: ProbeSettings | None = None,
        planned_samples: np.ndarray | None = None,
        probe_rates: np.ndarray | None = None,
    ) -> _RankedRows:
        job = np.asarray(frame["job"], np.int64)
        source = np.asarray(frame["source"], np.int64)
        fits = np.asarray(frame["fits"], bool)
        usable = source != SRC_NONE
        score = np.where(usable, np.asarray(frame["tpc"], np.float64), -np.inf)
        # usable rows first within each job (a usable row's score may be NaN, which sorts
        # after -inf), both parts in `rank_order`
        order = rank_order(job, score, first=usable)
        ok_o = usable[order]
        job_o = job[order]
        starts = np.searchsorted(job_o, np.arange(n_sub + 1))
        n_ok = np.bincount(job_o[ok_o], minlength=n_sub)
        rank_arr = (np.arange(len(order)) - starts[job_o] + 1)[ok_o]
        rank = rank_arr.tolist()
        o_ok = order[ok_o]
        tpc = np.asarray(frame["tpc"], np.float64)
        high_all = np.asarray(frame["high"], np.float64)
        cost_all = np.asarray(frame["cost"], np.float64)
        # a high bound far outside the training support can exceed the float range as samples
        # per USD: infinity compares as it should (within noise of anything)
        with np.errstate(over="ignore"):
            high_tpc = throughput_per_cost(high_all, cost_all, num_devices[job])
        near = within_noise_of_best(job, tpc, high_tpc, usable, n_sub)
        # intervals clipped at 0: a throughput is never negative
        low = np.fmax(np.asarray(frame["low"], np.float64)[o_ok], 0.0).tolist()
        high = np.fmax(high_all[o_ok], 0.0).tolist()
        is_model = (source[o_ok] == SRC_MODEL).tolist()
        hw_all = np.asarray(frame["hardware_type"], object)
        # one candidate entry of the schema, built inline (the hot loop)
        entries: list[RankedCandidate] = [
            {
                "hardware_type": t,
                "predicted_throughput": p,
                "interval": {"low": lo, "high": hi, "level": INTERVAL_LEVEL} if m else None,
                "cost_per_device_hour": c,
                "num_devices": nd,
                "throughput_per_cost": tp,
                "rank": rk,
            }
            for t, p, lo, hi, m, c, nd, tp, rk in zip(
                hw_all[o_ok].tolist(),
                np.asarray(frame["pred"], np.float64)[o_ok].tolist(),
                low,
                high,
                is_model,
                cost_all[o_ok].tolist(),
                num_devices[job][o_ok].tolist(),
                tpc[o_ok].tolist(),
                rank,
                strict=True,
            )
        ]
        # rare: a candidate on a type the model has little evidence for says so
        for i in np.flatnonzero(np.asarray(frame["few"], bool)[o_ok]).tolist():
            entries[i]["few_measurements"] = True
        # a candidate after the first that could still be the best (its interval reaches it)
        for i in np.flatnonzero(near[o_ok] & (rank_arr > 1)).tolist():
            entries[i]["within_noise_of_best"] = True
        explored: list[Exploration | None] = [None] * n_sub
        if explore_budget > 0:  # the candidate within the noise whose run teaches most
            rows_e, extra = explorations(
                job, tpc, near, never_measured(frame), explore_budget, n_sub
            )
            for j in np.flatnonzero(rows_e >= 0).tolist():
                explored[j] = {
                    "hardware_type": str(hw_all[rows_e[j]]),
                    "reason": EXPLORE_REASON,
                    "expected_extra_cost": round(float(extra[j]), 4),
                }
        probes: list[Probe | None] = [None] * n_sub
        if probe is not None and probe.enabled and planned_samples is not None:
            plan = plan_probes(
                job,
                np.where(source == SRC_MODEL, np.asarray(frame["pred"], np.float64), np.nan),
                np.asarray(frame["low"], np.float64),
                high_all,
                cost_all * num_devices[job],
                planned_samples,
                probe,
                probe_rates,
            )
            probed = order[plan.rows[order]]  # in ranking order
            for j in np.flatnonzero(np.isfinite(plan.saving)).tolist():
                probes[j] = {
                    "hardware_types": hw_all[probed[job[probed] == j]].tolist(),
                    "minutes": probe.minutes,
                    "cost": round(float(plan.cost[j]), 2),
                    "expected_saving": round(float(plan.saving[j]), 2),
                }
        o_bad = order[~ok_o]
        excl: list[Excluded] = [
            {"hardware_type": t, "reason": "no_prediction" if f else "does_not_fit"}
            for t, f in zip(hw_all[o_bad].tolist(), fits[o_bad].tolist(), strict=True)
        ]
        n_rows = np.diff(starts).tolist()
        return cls(
            entries=entries,
            excluded=excl,
            ok_start=np.concatenate([[0], np.cumsum(n_ok)]).tolist(),
            bad_start=np.concatenate([[0], np.cumsum(np.diff(starts) - n_ok)]).tolist(),
            n_rows=n_rows,
            row_types=_LazyTypes(hw_all, order, starts),
            has_model=(
                np.bincount(job[usable & (source == SRC_MODEL)], minlength=n_sub) > 0
            ).tolist(),
            any_fit=(np.bincount(job[fits], minlength=n_sub) > 0).tolist(),
            explored=explored,
            probes=probes,
        )

    def of_job(
        self, j: int, candidate_hardware: Sequence[str]
    ) -> tuple[list[RankedCandidate], list[Excluded]]:
        """Job j's ranked candidates and exclusions (candidates not in the catalog last)."""
        cands = self.entries[self.ok_start[j] : self.ok_start[j + 1]]
        excluded = self.excluded[self.bad_start[j] : self.bad_start[j + 1]]
        if len(candidate_hardware) != self.n_rows[j]:  # some candidates are not in the catalog
            seen = self.row_types[j]
            excluded = excluded + [
                Excluded(hardware_type=t, reason="unknown_hardware")
                for t in candidate_hardware
                if t not in seen
            ]
        return cands, excluded

    def verdict(self, j: int, has_candidates: bool, model_reason: str) -> tuple[RankingSource, str]:
        """(source, reason) of job j's ranking."""
        if has_candidates:
            if self.has_model[j]:
                return "model", "ok"
            return "lookup", model_reason
        if not self.n_rows[j]:
            return "none", "no_known_candidate"
        return "none", "no_candidate_fits" if not self.any_fit[j] else "lookup_miss"
