"""The fleet simulator: a population of training lineages submitting attempts day after day.

Why it is built this way:

* Lineages persist and resubmit (resumes, retries after failure or preemption, new jobs of the
  same run), so most submissions have a prior measurement, the signal LEAP found most useful.
* Every random draw is made on arrays whose size does not depend on the policy (the schedule,
  statuses, noise for *every* candidate), so two policies run on the same seed see the same jobs
  and the same luck: compute saved by a policy is a paired comparison (common random numbers).
* The schedule of a lineage uses the planned duration, not the realised one, so a policy
  cannot change which jobs exist; it only changes where they run, how long they take, and so
  whether their measurement has arrived before the next submission.
* One ``step_day`` is a handful of vectorised numpy passes; the only Python loop is over
  "rounds" (the k-th submission of each lineage that day).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from datetime import UTC, date, datetime, timedelta
from typing import Any

import numpy as np
import numpy.typing as npt
import pandas as pd
import pyarrow as pa

from leap_stream.catalog import HardwareCatalog, load_catalog
from leap_stream.contracts.vocab import FAMILIES, FRAMEWORKS, OPTIMIZERS, PRECISIONS
from leap_stream.core.probe import slice_shape
from leap_stream.tools.sim.config import (
    FRAMEWORK_VERSIONS,
    MAX_DEVICES,
    PLANNED_SAMPLES_SIGMA,
    PLANNED_SAMPLES_STREAM,
    POPULARITY,
    PROBE_STREAM,
    STATUSES,
    DayResult,
    DriftEvent,
    Policy,
    SimConfig,
    SimResult,
)
from leap_stream.tools.sim.draw import (
    _choice_rows,
    _dataset_rows,
    _DayIds,
    _has_prior,
    _Lineages,
    _strings,
    _take,
)
from leap_stream.tools.sim.models import (
    SHARDED_FAMILIES,
    TOKEN_FAMILIES,
    model_catalog,
)
from leap_stream.tools.sim.population import LineageDraws
from leap_stream.tools.sim.short_runs import ShortRuns
from leap_stream.tools.sim.throughput import (
    VENDORS,
    HardwareArrays,
    base_throughput,
)

F64 = npt.NDArray[np.float64]
I64 = npt.NDArray[np.int64]


class FleetSimulator(LineageDraws):
    """Day-by-day simulation; ``step_day(policy)`` lets a backtest retrain between days."""

    def __init__(self, config: SimConfig, catalog: HardwareCatalog | None = None) -> None:
        self.config = config
        self.catalog = catalog or load_catalog()
        self.hw = HardwareArrays.from_catalog(self.catalog)
        self.models = model_catalog()
        self.day_index = 0
        # the running day's probes (a policy may call them while it chooses)
        self.short_runs: ShortRuns | None = None
        unknown = [t for t, _d in config.hardware_from if t not in self.hw.types]
        if unknown:
            raise ValueError(f"hardware_from names types the catalog lacks: {unknown}")
        self._from_day = np.zeros(len(self.hw.types), np.int64)
        for t, day in config.hardware_from:
            self._from_day[self.hw.types.index(t)] = day
        self._rng_master = np.random.SeedSequence(config.seed)
        init = np.random.default_rng(np.random.SeedSequence([config.seed, 1_000_003]))
        n_t = len(self.hw.types)
        self._types = np.array(self.hw.types, dtype=object)
        self._model_hw = np.exp(init.normal(0.0, config.model_hw_sigma, (len(self.models), n_t)))
        self._team_quota = self._draw_quotas(init)
        self._popularity = np.array([POPULARITY.get(t, 1.0) for t in self.hw.types])
        self.drift_events = (
            list(config.drift_events) if config.drift_events is not None else self._draw_drift(init)
        )
        self._lin = _Lineages(n_t)
        self._new_per_lineage = 4.0  # running estimate of same-day submissions per new lineage
        m = self.models
        self._m: dict[str, np.ndarray[Any, Any]] = {c: m[c].to_numpy() for c in m.columns}
        fam = m["family"].to_numpy()
        self._m_sharded = np.isin(fam, list(SHARDED_FAMILIES))
        self._m_tokens = np.isin(fam, list(TOKEN_FAMILIES))
        # per model: probability of each framework (its list order: 0.65 / 0.25 / 0.10)
        fw_p = np.zeros((len(m), len(FRAMEWORKS)))
        for i, names in enumerate(m["frameworks"]):
            for w, name in zip((0.65, 0.25, 0.10), names.split("|"), strict=False):
                fw_p[i, FRAMEWORKS.index(name)] = w
        self._m_framework_p = fw_p / fw_p.sum(axis=1, keepdims=True)
        width = max(len(v) for v in FRAMEWORK_VERSIONS.values())
        self._fw_version_count = np.array([len(FRAMEWORK_VERSIONS[f]) for f in FRAMEWORKS])
        self._fw_version_names = np.array(
            [
                list(FRAMEWORK_VERSIONS[f]) + [""] * (width - len(FRAMEWORK_VERSIONS[f]))
                for f in FRAMEWORKS
            ],
            dtype=object,
        )
        self._family_models = [np.flatnonzero(m["family_idx"].to_numpy() == i) for i in range(9)]
        self._vendors_present = len(set(self.hw.vendor_idx.tolist()))
        self._team_names = [f"team-{i:02d}" for i in range(config.teams)]
        self._model_names = m["model_type"].tolist()

    # ------------------------------------------------------------------ setup draws
    def _draw_quotas(self, rng: np.random.Generator) -> np.ndarray[Any, Any]:
        n_t = len(self.hw.types)
        pop = np.array([POPULARITY.get(t, 1.0) for t in self.hw.types])
        quota = np.zeros((self.config.teams, n_t), dtype=bool)
        for team in range(self.config.teams):
            k = 20 if rng.random() < 0.15 else int(rng.integers(3, 16))
            k = min(k, n_t)
            keys = np.log(rng.random(n_t)) / pop  # weighted sampling without replacement
            quota[team, np.argsort(-keys)[:k]] = True
        return quota

    def _draw_drift(self, rng: np.random.Generator) -> list[DriftEvent]:
        events = []
        vendors = sorted({VENDORS[v] for v in self.hw.vendor_idx.tolist()}, key=VENDORS.index)
        for d in range(1, self.config.days):
            if rng.random() >= self.config.drift_rate:
                continue
            vendor = vendors[int(rng.integers(len(vendors)))]
            family = FAMILIES[int(rng.integers(len(FAMILIES)))]
            if rng.random() < 0.75:
                factor, reason = math.exp(rng.normal(0.12, 0.05)), "software release"
            else:
                factor, reason = math.exp(rng.normal(-0.10, 0.04)), "regression"
            events.append(DriftEvent(d, vendor, family, factor, reason))
        return events

    def drift_matrix(self, day: int) -> F64:
        """(family × vendor) speed multiplier in force on ``day``."""
        mat = np.ones((len(FAMILIES), len(VENDORS)))
        for e in self.drift_events:
            if e.day <= day:
                mat[FAMILIES.index(e.family), VENDORS.index(e.vendor)] *= e.factor
        return mat

    # ------------------------------------------------------------------ schedule
    def _schedule(
        self, rng: np.random.Generator, lin_ids: I64, day_end: float
    ) -> dict[str, np.ndarray[Any, Any]]:
        """All submissions of ``lin_ids`` before ``day_end``; mutates their schedule state."""
        L = self._lin
        cfg = self.config
        out: dict[str, list[np.ndarray[Any, Any]]] = {}
        active = lin_ids[(L["next_submit"][lin_ids] < day_end) & (L["remaining"][lin_ids] > 0)]
        while len(active):
            k = len(active)
            retry = L["retry"][active]
            new_job = ~retry
            # a new job may move to another default type or change its data-parallel size
            move = new_job & (L["job_seq"][active] > 0) & (rng.random(k) < cfg.move_prob)
            if move.any():
                ids = active[move]
                w = np.where(L["cand"][ids] & self.available(), self._popularity[None, :], 0.0)
                w[np.arange(len(ids)), L["default"][ids]] = 0.0
                has = w.sum(axis=1) > 0
                pick = _choice_rows(rng, w / np.maximum(w.sum(axis=1, keepdims=True), 1e-12))
                L["default"][ids[has]] = pick[has]
            resc = new_job & (L["job_seq"][active] > 0) & (rng.random(k) < cfg.rescale_prob)
            if resc.any():
                ids = active[resc]
                up = rng.random(len(ids)) < 0.6
                mi = L["model_idx"][ids]
                can_down = (~self._m_sharded[mi]) & (self._m["embedding_params"][mi] == 0)
                factor = np.where(up | ~can_down, 2, 1)
                factor = np.where(~up & can_down & (L["dp"][ids] > 1), -2, factor)
                split = L["tp"][ids] * L["pp"][ids]
                dp = L["dp"][ids]
                new_dp = np.where(factor > 0, dp * 2, dp // 2)
                new_dp = np.clip(new_dp, 1, MAX_DEVICES // split)
                new_dp = np.where(L["global_batch"][ids] // dp * new_dp > 2**26, dp, new_dp)
                L["global_batch"][ids] = L["global_batch"][ids] // dp * new_dp
                L["dp"][ids] = new_dp
                L["num_devices"][ids] = new_dp * split
            L["job_seq"][active] += new_job
            L["attempt"][active] = np.where(new_job, 1, L["attempt"][active] + 1)
            sub_t = L["next_submit"][active]
            planned_h = np.clip(np.exp(rng.normal(math.log(0.5), 1.3, k)), 0.03, 72.0)
            queue_s = rng.exponential(180.0, k) * (1.0 + np.log2(L["num_devices"][active]) / 4)
            u = rng.random(k)
            p_fail = np.minimum(0.5, cfg.fail_prob * L["flaky"][active])
            status = np.where(u < p_fail, 1, np.where(u < p_fail + cfg.preempt_prob, 2, 0))
            frac = np.where(status == 0, 1.0, rng.uniform(0.02, 0.95, k))
            long_gap = rng.random(k) < np.where(status == 0, 0.3, 0.05)
            gap = np.where(
                long_gap,
                np.exp(rng.normal(math.log(8 * 3600.0), 0.8, k)),
                np.exp(rng.normal(math.log(600.0), 0.9, k)),
            )
            for name, arr in (
                ("lin", active),
                ("submitted", sub_t),
                ("job_seq", L["job_seq"][active].copy()),
                ("attempt", L["attempt"][active].copy()),
                ("default", L["default"][active].copy()),
                ("num_devices", L["num_devices"][active].copy()),
                ("dp", L["dp"][active].copy()),
                ("global_batch", L["global_batch"][active].copy()),
                ("planned_h", planned_h),
                ("queue_s", queue_s),
                ("status", status),
                ("frac", frac),
            ):
                out.setdefault(name, []).append(arr)
            L["retry"][active] = status != 0
            L["remaining"][active] -= 1
            L["next_submit"][active] = sub_t + queue_s + frac * planned_h * 3600.0 + gap
            still = (L["next_submit"][active] < day_end) & (L["remaining"][active] > 0)
            active = active[still]
        if not out:
            return {}
        return {k: np.concatenate(v) for k, v in out.items()}

    # ------------------------------------------------------------------ one day
    def step_day(self, policy: Policy | None = None) -> DayResult:
        cfg = self.config
        d = self.day_index
        day = cfg.start + timedelta(days=d)
        t0 = datetime(day.year, day.month, day.day, tzinfo=UTC).timestamp()
        t1 = t0 + 86400.0
        rng = np.random.default_rng(np.random.SeedSequence([cfg.seed, d]))
        L = self._lin
        parts = []
        if L.n:
            parts.append(self._schedule(rng, np.arange(L.n), t1))
        count = sum(len(p.get("lin", ())) for p in parts)
        rounds = 0
        while count < cfg.rate * 0.998 and rounds < 20:
            rounds += 1
            deficit = cfg.rate - count
            n_new = max(8, math.ceil(deficit / self._new_per_lineage))
            new = self._new_lineages(rng, n_new, t0, t1)
            first_id = L.n
            L.append(new)
            ids = np.arange(first_id, L.n)
            part = self._schedule(rng, ids, t1)
            got = len(part.get("lin", ()))
            if len(ids):
                observed = got / len(ids)
                self._new_per_lineage = max(1.0, 0.5 * self._new_per_lineage + 0.5 * observed)
            if got:
                parts.append(part)
            count += got
        sched = {k: np.concatenate([p[k] for p in parts if p]) for k in parts[0]} if parts else {}
        self.day_index += 1
        return self._run_day(rng, d, day, sched, policy)

    def _run_day(
        self,
        rng: np.random.Generator,
        d: int,
        day: date,
        s: dict[str, np.ndarray[Any, Any]],
        policy: Policy | None,
    ) -> DayResult:
        """One simulated day: its submissions (time-ordered), the true and measured rate of
        every (submission × candidate), where each attempt runs, and its completion."""
        # time order (stable: ties keep lineage order) and millisecond timestamps
        order = np.lexsort((s["lin"], np.round(s["submitted"], 3)))
        s = {k: v[order] for k, v in s.items()}
        s["submitted"] = np.round(s["submitted"], 3)
        ids = self._day_ids(s)
        cand = self._lin["cand"][s["lin"]] & self.available(d)
        subs = self._submissions_frame(s, ids, cand)
        true, measured, truth, pos, sliced = self._truth(rng, d, s, ids, cand)
        subs["planned_samples"] = self._planned_samples(d, s, true, pos)
        probe_rng = np.random.default_rng([self.config.seed, d, PROBE_STREAM])
        self.short_runs = ShortRuns(pos, self.hw.types, probe_rng, sliced)
        chosen, invalid = self._choose(policy, subs, s, cand)
        comp, has_thr, ended = self._completions_frame(s, ids, true, measured, pos, chosen)
        subs["has_prior"] = _has_prior(
            s["lin"], s["submitted"], has_thr, ended, self._lin["min_meas_end"]
        )
        subs.attrs["vendors"] = self._vendors_present
        dataset = _dataset_rows(subs, comp)
        new_events = [e for e in self.drift_events if e.day == d]
        return DayResult(day, subs, comp, dataset, truth, new_events, invalid)

    def _day_ids(self, s: dict[str, np.ndarray[Any, Any]]) -> _DayIds:
        lin = s["lin"]
        seed = self.config.seed
        lin_list = [f"lin-{seed}-{x:07d}" for x in lin.tolist()]
        job_list = [
            f"job-{seed}-{x:07d}-{j:03d}"
            for x, j in zip(lin.tolist(), s["job_seq"].tolist(), strict=True)
        ]
        attempt = s["attempt"].astype(np.int64)
        eid_list = [f"{j}-a{a}" for j, a in zip(job_list, attempt.tolist(), strict=True)]
        return _DayIds(
            job_arr=pa.array(job_list, pa.string()),
            lin_id=_strings(lin_list),
            attempt=attempt,
            eid_list=eid_list,
        )

    def _submissions_frame(
        self, s: dict[str, np.ndarray[Any, Any]], ids: _DayIds, cand: np.ndarray[Any, Any]
    ) -> pd.DataFrame:
        L, m = self._lin, self._m
        lin = s["lin"]
        mi = L["model_idx"][lin]
        job_arr, lin_id, attempt, eid_list = ids.job_arr, ids.lin_id, ids.attempt, ids.eid_list
        cand_str = self._candidate_strings(cand)
        fam_idx = m["family_idx"][mi]
        submitted = pd.to_datetime((s["submitted"] * 1000).astype(np.int64), unit="ms", utc=True)
        return pd.DataFrame(
            {
                "submission_event_id": _strings(["sub-" + e for e in eid_list]),
                "job_id": _strings(job_arr),
                "attempt": attempt,
                "lineage_id": lin_id,
                "submitted_at": submitted,
                "team": _take(self._team_names, L["team_idx"][lin]),
                "family": _take(FAMILIES, fam_idx),
                "model_type": _take(self._model_names, mi),
                "parameters": m["parameters"][mi].astype(np.float64),
                "active_parameters": m["active_parameters"][mi].astype(np.float64),
                "layers": m["layers"][mi].astype(np.int64),
                "hidden_size": m["hidden_size"][mi].astype(np.int64),
                "sequence_length": L["seq"][lin].astype(np.int64),
                "precision": _take(PRECISIONS, L["precision_idx"][lin]),
                "optimizer": _take(OPTIMIZERS, L["optimizer_idx"][lin]),
                "framework": _take(FRAMEWORKS, L["framework_idx"][lin]),
                "framework_version": _strings(L["framework_version"][lin].tolist()),
                "global_batch_size": s["global_batch"].astype(np.int64),
                "micro_batch_size": L["micro_batch"][lin].astype(np.int64),
                "num_devices": s["num_devices"].astype(np.int64),
                "data_parallel": s["dp"].astype(np.int64),
                "tensor_parallel": L["tp"][lin].astype(np.int64),
                "pipeline_parallel": L["pp"][lin].astype(np.int64),
                "activation_checkpointing": L["ckpt"][lin].astype(bool),
                "candidate_hardware": _strings(cand_str.tolist()),
                "default_hardware": _take(self.hw.types, s["default"]),
            }
        )

    def _truth(
        self,
        rng: np.random.Generator,
        d: int,
        s: dict[str, np.ndarray[Any, Any]],
        ids: _DayIds,
        cand: np.ndarray[Any, Any],
    ) -> tuple[F64, F64, pd.DataFrame, I64, Callable[[np.ndarray, np.ndarray], F64]]:
        """(true rate, measured rate, truth frame, position of (submission, hardware) in them)
        of every (submission × candidate), and the true rate of some of them run as slices of
        a few data-parallel replicas; the one draw of the day's noise."""
        L = self._lin
        lin = s["lin"]
        mi = L["model_idx"][lin]
        fam_idx = self._m["family_idx"][mi]
        n = len(lin)
        job_arr, attempt = ids.job_arr, ids.attempt
        sub_i, hw_i = np.nonzero(cand)
        cols = {
            "framework_idx": L["framework_idx"][lin[sub_i]],
            "precision_idx": L["precision_idx"][lin[sub_i]],
            "optimizer_idx": L["optimizer_idx"][lin[sub_i]],
            "seq": L["seq"][lin[sub_i]],
            "global_batch": s["global_batch"][sub_i],
            "micro_batch": L["micro_batch"][lin[sub_i]],
            "num_devices": s["num_devices"][sub_i],
            "dp": s["dp"][sub_i],
            "tp": L["tp"][lin[sub_i]],
            "pp": L["pp"][lin[sub_i]],
            "ckpt": L["ckpt"][lin[sub_i]],
        }
        vend = self.hw.vendor_idx[hw_i]
        drift = self.drift_matrix(d)[fam_idx[sub_i], vend]
        lin_sub = lin[sub_i]

        def rates(rows: np.ndarray, c: dict[str, np.ndarray[Any, Any]]) -> tuple[F64, F64, F64]:
            """(true, known, physics) rates of the truth rows ``rows`` run with the columns
            ``c``: physics is the physics, software stack and drift in force; known adds the
            (model type × hardware) factor."""
            job = self._job_arrays(mi[sub_i[rows]], c)
            h, ls = hw_i[rows], lin_sub[rows]
            physics = base_throughput(job, self.hw, h) * drift[rows]
            # what a fleet's data determines, given enough of it (tools/sim/informed.py)
            known = physics * self._model_hw[mi[sub_i[rows]], h]
            true = known * L["lin_f"][ls] * L["lin_v"][ls, vend[rows]]
            cap = L["cap_dev"][ls] * c["num_devices"]
            true = true / (1.0 + (true / cap) ** 4) ** 0.25  # soft input-pipeline cap
            return true, known, physics

        def sliced(rows: np.ndarray, slice_dp: np.ndarray) -> F64:
            """True rates of the truth rows ``rows`` run as slices of ``slice_dp`` data-parallel
            replicas (`core.probe.slice_shape`)."""
            c = {k: v[rows] for k, v in cols.items()}
            c["num_devices"], c["global_batch"] = slice_shape(
                c["num_devices"], c["dp"], c["global_batch"], slice_dp
            )
            c["dp"] = np.minimum(np.asarray(slice_dp, np.int64), c["dp"])
            return rates(rows, c)[0]

        true, known, physics = rates(np.arange(len(sub_i)), cols)
        noise = np.exp(rng.normal(0.0, self.config.noise_sigma, len(true)))
        measured = true * noise
        truth = pd.DataFrame(
            {
                "job_id": _strings(job_arr.take(pa.array(sub_i))),
                "attempt": attempt[sub_i],
                "hardware_type": _take(self.hw.types, hw_i),
                "true_samples_per_s": true,
                "measured_samples_per_s": measured,
                "known_samples_per_s": known,
                "physics_samples_per_s": physics,
            }
        )
        # position of (submission, hardware) in the truth rows
        pos = np.full((n, len(self.hw.types)), -1, dtype=np.int64)
        pos[sub_i, hw_i] = np.arange(len(sub_i))
        return true, measured, truth, pos, sliced

    def _choose(
        self,
        policy: Policy | None,
        subs: pd.DataFrame,
        s: dict[str, np.ndarray[Any, Any]],
        cand: np.ndarray[Any, Any],
    ) -> tuple[np.ndarray[Any, Any], int]:
        """Where each attempt runs: the policy's pick when it is a candidate, else the default;
        and how many picks were invalid."""
        chosen = s["default"].copy()
        invalid = 0
        if policy is not None and len(subs):
            picked = policy(subs)
            picked = pd.Series(picked).reindex(subs.index)
            index_of = {t: i for i, t in enumerate(self.hw.types)}
            p_idx = picked.map(index_of).fillna(-1).to_numpy(dtype=np.int64)
            ok = p_idx >= 0
            ok[ok] = cand[np.flatnonzero(ok), p_idx[ok]]
            invalid = int((~ok).sum())
            chosen = np.where(ok, p_idx, chosen)
        return chosen, invalid

    def _planned_samples(
        self,
        d: int,
        s: dict[str, np.ndarray[Any, Any]],
        true: np.ndarray[Any, Any],
        pos: np.ndarray[Any, Any],
    ) -> F64:
        """What each attempt's user says it will process: the samples its planned hours take on
        its default type, off by a lognormal factor (σ `PLANNED_SAMPLES_SIGMA`: jobs end early,
        run longer). Drawn from a stream of its own, so the fleet's other draws do not move."""
        rows = np.arange(len(s["lin"]))
        work = s["planned_h"] * 3600.0 * true[pos[rows, s["default"]]]
        own = np.random.default_rng([self.config.seed, d, PLANNED_SAMPLES_STREAM])
        return np.asarray(work * np.exp(own.normal(0.0, PLANNED_SAMPLES_SIGMA, len(rows))))

    def _completions_frame(
        self,
        s: dict[str, np.ndarray[Any, Any]],
        ids: _DayIds,
        true: np.ndarray[Any, Any],
        measured: np.ndarray[Any, Any],
        pos: np.ndarray[Any, Any],
        chosen: np.ndarray[Any, Any],
    ) -> tuple[pd.DataFrame, np.ndarray[Any, Any], np.ndarray[Any, Any]]:
        """The completion of each attempt on its chosen hardware; also which ones measured a
        throughput and when each ended (epoch s)."""
        L = self._lin
        lin = s["lin"]
        mi = L["model_idx"][lin]
        n = len(lin)
        job_arr, lin_id, attempt, eid_list = ids.job_arr, ids.lin_id, ids.attempt, ids.eid_list
        rows = np.arange(n)
        thr_default = true[pos[rows, s["default"]]]
        thr_meas = measured[pos[rows, chosen]]
        work = s["planned_h"] * 3600.0 * thr_default  # samples this attempt has to process
        full_s = np.minimum(work / thr_meas, 30 * 86400.0)
        status = s["status"]
        run_s = np.maximum(full_s * s["frac"], 30.0)
        total_steps = np.maximum(1, np.round(work / s["global_batch"])).astype(np.int64)
        steps = np.where(status == 0, total_steps, np.floor(total_steps * s["frac"])).astype(
            np.int64
        )
        has_thr = (status == 0) | ((status == 2) & (run_s >= 300.0))
        sps = np.where(has_thr, thr_meas, np.nan)
        tps = np.where(self._m_tokens[mi], sps * L["seq"][lin], np.nan)
        started = np.round(s["submitted"] + s["queue_s"], 3)
        ended = np.round(started + run_s, 3)
        dev_h = s["num_devices"] * (ended - started) / 3600.0
        comp = pd.DataFrame(
            {
                "event_id": _strings(["cmp-" + e for e in eid_list]),
                "job_id": _strings(job_arr),
                "attempt": attempt,
                "lineage_id": lin_id,
                "model_type": _take(self._model_names, mi),
                "hardware_type": _take(self.hw.types, chosen),
                "num_devices": s["num_devices"].astype(np.int64),
                "samples_per_s": sps,
                "tokens_per_s": tps,
                "steps": steps,
                "started_at": pd.to_datetime(
                    (started * 1000).astype(np.int64), unit="ms", utc=True
                ),
                "ended_at": pd.to_datetime((ended * 1000).astype(np.int64), unit="ms", utc=True),
                "status": _take(STATUSES, status),
                "device_hours": dev_h,
            }
        )
        return comp, has_thr, ended

    def _candidate_strings(self, cand: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
        cache: dict[bytes, str] = {}
        out = np.empty(len(cand), dtype=object)
        packed = np.packbits(cand, axis=1)
        for i in range(len(cand)):
            key = packed[i].tobytes()
            val = cache.get(key)
            if val is None:
                val = "|".join(self._types[cand[i]].tolist())
                cache[key] = val
            out[i] = val
        return out


def simulate(
    config: SimConfig,
    catalog: HardwareCatalog | None = None,
    policy: Policy | None = None,
) -> SimResult:
    """All days of ``config`` with one policy (default: every job runs on its default type)."""
    sim = FleetSimulator(config, catalog)
    days = [sim.step_day(policy) for _ in range(config.days)]
    return combine(sim, days)


def combine(sim: FleetSimulator, days: list[DayResult]) -> SimResult:
    def cat(name: str) -> pd.DataFrame:
        frames = [getattr(d, name) for d in days]
        out = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()
        return out

    subs = cat("submissions")
    subs.attrs["vendors"] = sim._vendors_present
    return SimResult(
        config=sim.config,
        submissions=subs,
        completions=cat("completions"),
        dataset=cat("dataset"),
        truth=cat("truth"),
        drift_events=list(sim.drift_events),
        invalid_choices=sum(d.invalid_choices for d in days),
        n_types=len(sim.hw.types),
    )


__all__ = [
    "DayResult",
    "DriftEvent",
    "FleetSimulator",
    "Policy",
    "SimConfig",
    "SimResult",
    "combine",
    "simulate",
]
