"""Who a new lineage is: its model, configuration, parallelism, team, candidate types and
hidden factors, drawn in a fixed order from the day's generator (a seed gives the same fleet).
`FleetSimulator` draws its new lineages through these methods; the tables they read (per-model
arrays, the teams' quotas, the types' popularity) are built in its constructor."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import numpy.typing as npt
import pandas as pd

from leap_stream.catalog import HardwareCatalog
from leap_stream.contracts.vocab import FAMILIES, FRAMEWORKS, OPTIMIZERS, PRECISIONS
from leap_stream.tools.sim.config import (
    FAMILY_WEIGHTS,
    MAX_DEVICES,
    OPT_P,
    PREC_P,
    REFERENCE_MEMORY_GIB,
    SimConfig,
)
from leap_stream.tools.sim.draw import _choice_rows, _choice_rows_u, _pow2_ceil, _pow2_floor
from leap_stream.tools.sim.models import SHARDED_FAMILIES, model_catalog
from leap_stream.tools.sim.throughput import (
    VENDORS,
    HardwareArrays,
    JobArrays,
    base_throughput,
    fits,
    framework_supported,
)

I64 = npt.NDArray[np.int64]


class LineageDraws:
    """The draws of new lineages, a base of `FleetSimulator` (which owns the attributes below)."""

    config: SimConfig
    catalog: HardwareCatalog
    hw: HardwareArrays
    _m: dict[str, np.ndarray[Any, Any]]
    _m_sharded: np.ndarray[Any, Any]
    _m_framework_p: np.ndarray[Any, Any]
    _family_models: list[np.ndarray[Any, Any]]
    _fw_version_count: np.ndarray[Any, Any]
    _fw_version_names: np.ndarray[Any, Any]
    _popularity: np.ndarray[Any, Any]
    _team_quota: np.ndarray[Any, Any]
    _from_day: np.ndarray[Any, Any]
    day_index: int

    def available(self, day: int | None = None) -> np.ndarray[Any, Any]:
        """Per type, whether the fleet has it on `day` (today when None): `hardware_from`."""
        return np.asarray(self._from_day <= (self.day_index if day is None else day))

    def _job_arrays(self, model_idx: I64, cols: dict[str, np.ndarray[Any, Any]]) -> JobArrays:
        m = self._m
        return JobArrays(
            family_idx=m["family_idx"][model_idx].astype(np.int64),
            framework_idx=cols["framework_idx"].astype(np.int64),
            precision_idx=cols["precision_idx"].astype(np.int64),
            optimizer_idx=cols["optimizer_idx"].astype(np.int64),
            parameters=m["parameters"][model_idx].astype(np.float64),
            active_parameters=m["active_parameters"][model_idx].astype(np.float64),
            embedding_params=m["embedding_params"][model_idx].astype(np.float64),
            layers=m["layers"][model_idx].astype(np.float64),
            hidden=m["hidden_size"][model_idx].astype(np.float64),
            seq=cols["seq"].astype(np.float64),
            flops_per_unit=m["flops_per_unit"][model_idx].astype(np.float64),
            attn_flops_per_unit2=m["attn_flops_per_unit2"][model_idx].astype(np.float64),
            traffic_per_unit=m["traffic_per_unit"][model_idx].astype(np.float64),
            fixed_bytes=m["fixed_bytes"][model_idx].astype(np.float64),
            act_mem_per_unit=m["act_mem_per_unit"][model_idx].astype(np.float64),
            a2a_bytes=m["a2a_bytes"][model_idx].astype(np.float64),
            experts=m["experts"][model_idx].astype(np.float64),
            top_k=m["top_k"][model_idx].astype(np.float64),
            global_batch=cols["global_batch"].astype(np.float64),
            micro_batch=cols["micro_batch"].astype(np.float64),
            num_devices=cols["num_devices"].astype(np.float64),
            dp=cols["dp"].astype(np.float64),
            tp=cols["tp"].astype(np.float64),
            pp=cols["pp"].astype(np.float64),
            ckpt=cols["ckpt"].astype(bool),
            sharded=self._m_sharded[model_idx] & (cols["dp"] > 1),
        )

    def _new_lineages(
        self, rng: np.random.Generator, n: int, t0: float, t1: float
    ) -> dict[str, np.ndarray[Any, Any]]:
        """Draw ``n`` new lineages (some may be dropped when nothing in their quota fits).

        The steps draw from ``rng`` in a fixed order (a seed gives the same fleet): the model,
        its configuration, its parallelism, the team, the candidates, then the hidden factors
        and the schedule."""
        model_idx = self._draw_models(rng, n)
        cols = self._draw_config(rng, model_idx)
        cols.update(self._draw_parallelism(rng, model_idx, cols))
        team = rng.integers(0, self.config.teams, n)
        cols["team_idx"] = team.astype(np.int64)
        cand, job, hw_idx = self._draw_candidates(rng, cols, team)
        cols.update(self._draw_hidden(rng, cand, job, hw_idx, cols["num_devices"], t0, t1))
        keep = (cand & self.available()).any(axis=1)
        return {k: v[keep] for k, v in cols.items()}

    def _draw_models(self, rng: np.random.Generator, n: int) -> np.ndarray[Any, Any]:
        """A family by its weight, then a model of it (smaller ones more likely)."""
        m = self._m
        fam = rng.choice(len(FAMILIES), size=n, p=FAMILY_WEIGHTS / FAMILY_WEIGHTS.sum())
        model_idx = np.empty(n, dtype=np.int64)
        for f in range(len(FAMILIES)):
            sel = np.flatnonzero(fam == f)
            pool = self._family_models[f]
            w = m["parameters"][pool].astype(np.float64) ** -0.25
            model_idx[sel] = rng.choice(pool, size=len(sel), p=w / w.sum())
        return model_idx

    def _draw_config(
        self, rng: np.random.Generator, model_idx: np.ndarray[Any, Any]
    ) -> dict[str, np.ndarray[Any, Any]]:
        """Framework and version, precision, optimizer, sequence, tensor and pipeline
        parallelism, activation checkpointing and the micro batch of each lineage."""
        m = self._m
        n = len(model_idx)
        family_idx = m["family_idx"][model_idx].astype(np.int64)
        params = m["parameters"][model_idx].astype(np.float64)
        # framework: from the model's list, the first ones more likely; then a version
        u = rng.random(n)
        framework_idx = _choice_rows_u(self._m_framework_p[model_idx], u)
        vu = rng.random(n)
        n_versions = self._fw_version_count[framework_idx]
        v_idx = np.minimum((vu * n_versions).astype(np.int64), n_versions - 1)
        version = self._fw_version_names[framework_idx, v_idx]
        precision_idx = _choice_rows(rng, PREC_P[family_idx])
        optimizer_idx = _choice_rows(rng, OPT_P[family_idx])
        # sequence length: log-uniform on powers of two within the model's range
        lo = np.log2(m["seq_min"][model_idx].astype(np.float64))
        hi = np.log2(m["seq_max"][model_idx].astype(np.float64))
        seq = np.where(
            lo == hi,
            2.0**lo,
            2.0 ** np.round(lo + (hi - lo) * rng.random(n)),
        )
        seq = np.clip(seq, m["seq_min"][model_idx], m["seq_max"][model_idx]).astype(np.int64)
        # model parallelism for the big sharded families
        sharded = self._m_sharded[model_idx]
        tp = np.where(params < 2e9, 1, np.where(params < 8e9, 2, np.where(params < 20e9, 4, 8)))
        tp = np.where(sharded | ((family_idx == 2) & (params > 2e9)), tp, 1)
        tp = np.where((tp == 2) & (rng.random(n) < 0.5), 1, tp)
        pp = np.where(params < 40e9, 1, np.where(params < 100e9, 2, np.where(params < 200e9, 4, 8)))
        pp = np.where(sharded, pp, 1)
        ckpt = rng.random(n) < np.where(sharded, np.where(params > 30e9, 0.9, 0.6), 0.15)
        # micro batch: log-uniform in the model's range, shrunk to fit the reference part
        blo = np.log2(m["batch_min"][model_idx].astype(np.float64))
        bhi = np.log2(m["batch_max"][model_idx].astype(np.float64))
        mb = 2.0 ** np.round(blo + (bhi - blo) * rng.random(n))
        elem = np.where(precision_idx <= 1, 2.0, 1.0)
        act_sample = seq * m["act_mem_per_unit"][model_idx].astype(np.float64) * elem / tp
        budget = 0.45 * REFERENCE_MEMORY_GIB * 2**30
        ckpt = ckpt | (act_sample * mb > budget * 4)
        act_sample = np.where(ckpt, act_sample * 0.12, act_sample)
        mb = np.maximum(1.0, np.minimum(mb, _pow2_floor(budget / act_sample)))
        return {
            "model_idx": model_idx,
            "framework_idx": framework_idx,
            "framework_version": version,
            "precision_idx": precision_idx,
            "optimizer_idx": optimizer_idx,
            "seq": seq,
            "micro_batch": mb.astype(np.int64),
            "tp": tp.astype(np.int64),
            "pp": pp.astype(np.int64),
            "ckpt": ckpt,
        }

    def _draw_parallelism(
        self,
        rng: np.random.Generator,
        model_idx: np.ndarray[Any, Any],
        cols: dict[str, np.ndarray[Any, Any]],
    ) -> dict[str, np.ndarray[Any, Any]]:
        """Data parallelism (enough replicas for the states to fit, then a heavy tail of
        scale-out), the device count and the global batch."""
        m = self._m
        n = len(model_idx)
        params = m["parameters"][model_idx].astype(np.float64)
        emb = m["embedding_params"][model_idx].astype(np.float64)
        sharded = self._m_sharded[model_idx]
        tp, pp, precision_idx = cols["tp"], cols["pp"], cols["precision_idx"]
        mb = cols["micro_batch"].astype(np.float64)
        # data parallel: enough replicas for the states to fit, then a heavy tail of scale-out
        split = tp * pp
        dense = params - emb
        wg = np.where(precision_idx <= 1, 8.0, 4.0)
        states_budget = 0.55 * REFERENCE_MEMORY_GIB * 2**30
        rem = states_budget - dense * wg / split - emb * 8.0 / np.maximum(split, 1)
        opt = 12.0 * dense / split
        need_dp = np.where(
            sharded,
            np.where(rem > 0, opt / np.maximum(rem, 1.0), 64.0),
            1.0,
        )
        need_dp = np.maximum(need_dp, emb * 8.0 / states_budget / split)
        tail = 2.0 ** np.minimum(rng.geometric(0.42, n) - 1, 10)
        dp = _pow2_ceil(need_dp) * tail
        dp = np.minimum(dp, MAX_DEVICES // split).astype(np.int64)
        dp = np.maximum(dp, 1)
        num_devices = (dp * split).astype(np.int64)
        accum = 2 ** rng.choice(4, size=n, p=[0.5, 0.25, 0.15, 0.10])
        accum = np.where(mb * dp * accum > 2**22, 1, accum)  # keep huge recsys batches sane
        global_batch = (mb * dp * accum).astype(np.int64)
        return {"global_batch": global_batch, "num_devices": num_devices, "dp": dp}

    def _draw_candidates(
        self, rng: np.random.Generator, cols: dict[str, np.ndarray[Any, Any]], team: np.ndarray
    ) -> tuple[np.ndarray[Any, Any], JobArrays, np.ndarray[Any, Any]]:
        """The types each lineage may run on: those that fit and support its framework, within
        the team's quota (or, when none of those fits, up to 4 eligible types granted)."""
        n = len(team)
        model_idx = cols["model_idx"]
        # eligibility: memory fit and framework support on every type
        n_t = len(self.hw.types)
        rows = np.repeat(np.arange(n), n_t)
        hw_idx = np.tile(np.arange(n_t), n)
        job = self._job_arrays(model_idx[rows], {k: v[rows] for k, v in cols.items()})
        ok = fits(job, self.hw, hw_idx) & framework_supported(job.framework_idx, self.hw, hw_idx)
        eligible = ok.reshape(n, n_t)
        cand = eligible & self._team_quota[team]
        # quota exception: nothing in the team's quota fits -> up to 4 eligible types granted
        empty = ~cand.any(axis=1) & eligible.any(axis=1)
        if empty.any():
            keys = np.where(eligible[empty], rng.random((int(empty.sum()), n_t)), 2.0)
            order = np.argsort(keys, axis=1)[:, :4]
            grant = np.zeros_like(cand[empty])
            np.put_along_axis(grant, order, True, axis=1)
            cand[empty] = grant & eligible[empty]
        return cand, job, hw_idx

    def _draw_hidden(
        self,
        rng: np.random.Generator,
        cand: np.ndarray[Any, Any],
        job: JobArrays,
        hw_idx: np.ndarray[Any, Any],
        num_devices: np.ndarray[Any, Any],
        t0: float,
        t1: float,
    ) -> dict[str, np.ndarray[Any, Any]]:
        """The default type, the hidden per-lineage factors the model must learn from data,
        and the schedule state (when it first submits, how many times)."""
        n, n_t = cand.shape
        # default: popular types more likely, among those the fleet has today
        w = np.where(cand & self.available(), self._popularity[None, :], 0.0)
        default = _choice_rows(rng, w / np.maximum(w.sum(axis=1, keepdims=True), 1e-12))
        # per-lineage hidden factors
        lin_f = np.exp(rng.normal(0.0, self.config.lineage_sigma, n))
        lin_v = np.exp(rng.normal(0.0, self.config.lineage_vendor_sigma, (n, len(VENDORS))))
        base = base_throughput(job, self.hw, hw_idx).reshape(n, n_t)
        med = np.nanmedian(np.where(cand, base, np.nan), axis=1)
        capped = rng.random(n) < self.config.input_bound_share
        cap_dev = np.where(
            capped, med * rng.uniform(0.4, 1.2, n) / num_devices, np.inf
        )  # input-pipeline cap per device, independent of the hardware
        # schedule state
        # sweeps and one-off experiments (a submission or two) next to long-running lineages
        short = rng.random(n) < 0.5
        total = np.where(
            short,
            rng.geometric(0.6, n),
            1 + np.floor(np.exp(rng.normal(math.log(8.0), 0.9, n))),
        ).astype(np.int64)
        first = t0 + (t1 - t0) * rng.random(n)
        flaky = np.exp(rng.normal(0.0, 0.6, n))
        return {
            "cand": cand,
            "default": default.astype(np.int64),
            "lin_f": lin_f,
            "lin_v": lin_v,
            "cap_dev": cap_dev,
            "remaining": total,
            "next_submit": first,
            "job_seq": np.zeros(n, dtype=np.int64),
            "attempt": np.zeros(n, dtype=np.int64),
            "retry": np.zeros(n, dtype=bool),
            "flaky": flaky,
            "min_meas_end": np.full(n, np.inf),
        }


def jobs_from_frame(frame: pd.DataFrame) -> JobArrays:
    """Rebuild the throughput function's inputs from submission / dataset rows (for checks and
    for anyone who wants the latent function of a job without running the fleet)."""
    m = model_catalog()
    pos = pd.Index(m["model_type"]).get_indexer(pd.Index(frame["model_type"]))
    if (pos < 0).any():
        raise KeyError("model types not in the simulator's catalog")

    def col(name: str) -> np.ndarray[Any, Any]:
        return m[name].to_numpy()[pos]

    fam = col("family_idx").astype(np.int64)
    dp = frame["data_parallel"].to_numpy(np.float64)
    return JobArrays(
        family_idx=fam,
        framework_idx=pd.Index(FRAMEWORKS)
        .get_indexer(pd.Index(frame["framework"]))
        .astype(np.int64),
        precision_idx=pd.Index(PRECISIONS)
        .get_indexer(pd.Index(frame["precision"]))
        .astype(np.int64),
        optimizer_idx=pd.Index(OPTIMIZERS)
        .get_indexer(pd.Index(frame["optimizer"]))
        .astype(np.int64),
        parameters=col("parameters").astype(np.float64),
        active_parameters=col("active_parameters").astype(np.float64),
        embedding_params=col("embedding_params").astype(np.float64),
        layers=col("layers").astype(np.float64),
        hidden=col("hidden_size").astype(np.float64),
        seq=frame["sequence_length"].to_numpy(np.float64),
        flops_per_unit=col("flops_per_unit").astype(np.float64),
        attn_flops_per_unit2=col("attn_flops_per_unit2").astype(np.float64),
        traffic_per_unit=col("traffic_per_unit").astype(np.float64),
        fixed_bytes=col("fixed_bytes").astype(np.float64),
        act_mem_per_unit=col("act_mem_per_unit").astype(np.float64),
        a2a_bytes=col("a2a_bytes").astype(np.float64),
        experts=col("experts").astype(np.float64),
        top_k=col("top_k").astype(np.float64),
        global_batch=frame["global_batch_size"].to_numpy(np.float64),
        micro_batch=frame["micro_batch_size"].to_numpy(np.float64),
        num_devices=frame["num_devices"].to_numpy(np.float64),
        dp=dp,
        tp=frame["tensor_parallel"].to_numpy(np.float64),
        pp=frame["pipeline_parallel"].to_numpy(np.float64),
        ckpt=frame["activation_checkpointing"].to_numpy(bool),
        sharded=np.isin(m["family"].to_numpy()[pos], list(SHARDED_FAMILIES)) & (dp > 1),
    )


__all__ = ["LineageDraws", "jobs_from_frame"]
