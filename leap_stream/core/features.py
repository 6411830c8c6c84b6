"""The (job × candidate hardware) feature frame, one builder for training and serving.

Training and serving call the same `build`, so a model never sees a feature computed one way
offline and another way online. Everything is vectorised with numpy over flattened arrays; the
only Python loops flatten the per-job history dicts (a handful of entries each).

Throughput features are in log space and *per device* (samples/s ÷ num_devices): per-device
throughput transfers across device counts far better than whole-job throughput, and the model's
target is the same quantity (see `core/predictor`).
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import repeat

import numpy as np
import pandas as pd

from leap_stream.contracts.vocab import FAMILIES, FRAMEWORKS, OPTIMIZERS, PRECISIONS, VENDORS
from leap_stream.core.aggregates import AggregatesAsOf
from leap_stream.core.columns import Coded, Columns, f64
from leap_stream.core.columns import Frame as Jobs
from leap_stream.core.history import LineageHistory, TypeAggregates
from leap_stream.core.physics import (
    _PREC_PEAK,
    COMPUTE_SHARE,
    DP_EXPOSED,
    MEMORY_SHARE,
    OVERLAP_RESIDUE,
    QUIET_LOGS,
    ROOFLINE_SHARE,
    _active_params,
    _elem_bytes,
    _JobPhysics,
    _log,
    min_memory_per_device_gib,
)
from leap_stream.core.specs import SpecArrays

# Columns of a job frame (the dataset's column names; `ranker.jobs_frame` builds it from events).
CATEGORIES: dict[str, tuple[str, ...]] = {
    "precision": PRECISIONS,
    "family": FAMILIES,
    "framework": FRAMEWORKS,
    "optimizer": OPTIMIZERS,
    "vendor": VENDORS,
}
# The job frame's columns `build_columns` reads (the dataset's names).
JOB_COLUMNS: tuple[str, ...] = (
    "family",
    "model_type",
    "parameters",
    "active_parameters",
    "layers",
    "hidden_size",
    "sequence_length",
    "precision",
    "optimizer",
    "framework",
    "global_batch_size",
    "micro_batch_size",
    "num_devices",
    "data_parallel",
    "tensor_parallel",
    "pipeline_parallel",
    "activation_checkpointing",
)
# Categoricals whose levels come from the training data (stored in the model's metadata).
OPEN_CATEGORIES = ("model_type", "hardware_type")

GROUPS: dict[str, tuple[str, ...]] = {
    "config": (
        "log_params",
        "log_active_params",
        "log_layers",
        "log_hidden",
        "log_seq",
        "log_global_batch",
        "log_micro_batch",
        "log_devices",
        "log_dp",
        "log_tp",
        "log_pp",
        "act_ckpt",
        "log_flops_per_sample",
        "log_bytes_per_sample",
        "log_mem_per_device_gib",
        "mem_ratio",
        "log_accum",
        "pp_bubble",
        "log_micro_flops",
        "precision",
        "family",
        "framework",
        "optimizer",
        "model_type",
    ),
    "specs": (
        "hardware_type",
        "vendor",
        "log_peak_tflops",
        "log_mem_bw",
        "log_device_mem",
        "log_interconnect",
        "log_cost",
        "log_roofline",
        "log_t_compute",
        "log_t_memory",
        "log_t_comm",
        "log_t_a2a",
        "log_t_activations",
        "log_t_weights",
        "log_phys_rate",
        "log_ideal_micro_s",
        "log_domains",
        "log_network",
    ),
    # Per (model_type × hardware) EWMA aggregates of the candidate.
    "agg": ("agg_cand", "agg_cand_count"),
    # The lineage's own prior throughput (the published lesson: the feature that matters most).
    # Not booster inputs: the predictor anchors on them (see core/predictor).
    "prior": (
        "self_log_pd",
        "self_log_dev_ratio",
        "self_count",
        "self_age_days",
        "other_log_pd",
        "other_log_flops_ratio",
        "other_log_bw_ratio",
        "other_count",
        "other_age_days",
        "other_log_dev_ratio",
        "hist_types",
        "est_transfer",
        "agg_prior",
        "agg_ratio",
    ),
}
BOOSTER_GROUPS = ("config", "specs", "agg")
# Hardware-dependent booster inputs, and their copies for the lineage's prior hardware
# ("o_" + name): the predictor evaluates the booster on both to move the prior across types.
HW_COLUMNS: tuple[str, ...] = (*GROUPS["specs"], "mem_ratio", *GROUPS["agg"])
ALL_FEATURES: tuple[str, ...] = tuple(f for g in GROUPS.values() for f in g)

# Usable share of device memory (allocator, buffers, framework overhead).
FIT_HEADROOM = 1.0
VENDOR_PENALTY = 1.0  # in log-spec distance units when choosing the most similar prior type
DAY_S = 86400.0
# |self_log_dev_ratio| past which a lineage's run was on another device count than asked now
DEVICES_CHANGED = 1e-9


def _unique_objects(items: Sequence[object]) -> tuple[np.ndarray, list[int]]:
    """Per item, the index of its first occurrence by identity, and those first positions.

    Snapshots share one dict between rows while nothing changed (`pit.replay`, the worker's
    per-model-type aggregates), so flattening each distinct dict once instead of once per job
    turns a per-row Python loop into a per-distinct-object one."""
    seen: dict[int, int] = {}
    uid = np.empty(len(items), np.int64)
    firsts: list[int] = []
    for j, x in enumerate(items):
        u = seen.get(id(x))
        if u is None:
            u = seen[id(x)] = len(firsts)
            firsts.append(j)
        uid[j] = u
    return uid, firsts


def _flatten_lineage(
    histories: Sequence[LineageHistory | None], code: dict[str, int]
) -> tuple[np.ndarray, ...]:
    """(owner, hw, samples/s, devices, measured_at, count); owner = distinct history index,
    plus the per-job owner index (first array)."""
    uid, firsts = _unique_objects(histories)
    job: list[int] = []
    hw: list[int] = []
    vals: list[tuple[float, float, float, float]] = []
    for u, j in enumerate(firsts):
        h = histories[j]
        if not h:
            continue
        for t, m in h.items():
            c = code.get(t)
            if c is None:
                continue  # a type the catalog no longer has: no specs to relate it to
            job.append(u)
            hw.append(c)
            vals.append((m.samples_per_s, m.num_devices, m.measured_at, m.count))
    v = np.asarray(vals, np.float64).reshape(-1, 4)
    return (
        uid,
        np.asarray(job, np.int64),
        np.asarray(hw, np.int64),
        v[:, 0].copy(),
        v[:, 1].copy(),
        v[:, 2].copy(),
        v[:, 3].copy(),
    )


def _flatten_aggregates(
    aggregates: Sequence[TypeAggregates | None], code: dict[str, int]
) -> tuple[np.ndarray, ...]:
    """(per-job owner index, owner, hw, ewma, count) over the distinct aggregate dicts."""
    uid, firsts = _unique_objects(aggregates)
    ents = [
        (u, code.get(t, -1), g.ewma_log_per_device, g.count)
        for u, j in enumerate(firsts)
        if (a := aggregates[j])
        for t, g in a.items()
    ]
    v = np.asarray(ents, np.float64).reshape(-1, 4)
    v = v[v[:, 1] >= 0]  # a type the catalog no longer has
    return (
        uid,
        v[:, 0].astype(np.int64),
        v[:, 1].astype(np.int64),
        v[:, 2].copy(),
        v[:, 3].copy(),
    )


def _lookup(keys: np.ndarray, table_keys: np.ndarray, values: np.ndarray) -> np.ndarray:
    """values[table_keys == key] for each key, NaN when absent (table_keys unique)."""
    out = np.full(len(keys), np.nan)
    if len(table_keys) == 0 or len(keys) == 0:
        return out
    order = np.argsort(table_keys, kind="stable")
    sk = table_keys[order]
    pos = np.searchsorted(sk, keys)
    pos_c = np.minimum(pos, len(sk) - 1)
    hit = sk[pos_c] == keys
    out[hit] = values[order[pos_c[hit]]]
    return out


def build(
    jobs: Jobs,
    candidates: Sequence[Sequence[str]],
    histories: Sequence[LineageHistory | None],
    aggregates: Sequence[TypeAggregates | None] | AggregatesAsOf,
    specs: pd.DataFrame | SpecArrays,
    now: np.ndarray,
) -> pd.DataFrame:
    """`build_columns` as a DataFrame (training and the backtest)."""
    return build_columns(jobs, candidates, histories, aggregates, specs, now).to_pandas()


@QUIET_LOGS
def build_columns(
    jobs: Jobs,
    candidates: Sequence[Sequence[str]],
    histories: Sequence[LineageHistory | None],
    aggregates: Sequence[TypeAggregates | None] | AggregatesAsOf,
    specs: pd.DataFrame | SpecArrays,
    now: np.ndarray,
) -> Columns:
    """One row per (job, candidate): columns `job` (row of `jobs`), `hardware_type`, `known`
    (the candidate is in `specs`), `fits` (a lower bound of memory fits the device),
    `ALL_FEATURES`, `other_hw` inputs as ``"o_" + name`` for `HW_COLUMNS`.

    `histories[j]` / `aggregates[j]` are job j's lineage history and its model type's
    aggregates *as of its submission* (point in time); `now[j]` is that time in epoch seconds.
    """
    n_jobs = len(jobs)
    lens = np.fromiter((len(c) for c in candidates), np.int64, count=n_jobs)
    job = np.repeat(np.arange(n_jobs, dtype=np.int64), lens)
    hw_names = np.asarray([t for c in candidates for t in c], dtype=object).reshape(-1)
    sa = SpecArrays.of(specs)
    k = len(sa.types) + 1  # last code: unknown
    hw = np.fromiter(map(sa.code.get, hw_names.tolist(), repeat(k - 1)), np.int64, len(job))
    elem = _elem_bytes(jobs)
    phys = _JobPhysics.of(jobs, elem)
    known = hw < k - 1
    # strings as codes into the catalog's (or the jobs') values: the predictor turns them into
    # its level codes per level, not per row (`Coded`); an unknown type keeps its own name
    names: object = Coded(hw, sa.names) if known.all() else hw_names
    f: dict[str, object] = {"job": job, "hardware_type": names, "known": known}
    _config_columns(f, jobs, job, elem, phys)
    # unknown specs: not excluded here (the ranker reports unknown_hardware)
    fits = ~(min_memory_per_device_gib(jobs, elem)[job] > sa.mem[hw] * FIT_HEADROOM)
    _categorical_columns(f, jobs, job)
    _hw_columns(f, "", sa, hw, job, phys)
    other_hw, other_lpd = _history_columns(f, jobs, job, hw, histories, sa, np.asarray(now))
    # a type the lineage has run on, on no more devices than now (no more memory per device),
    # fits whatever the estimate says (NaN without such a run: no evidence)
    ran_there = np.asarray(f["self_log_dev_ratio"], np.float64) >= -DEVICES_CHANGED
    f["fits"] = fits | ran_there
    o_agg, o_agg_count = _aggregate_columns(f, job, hw, other_hw, other_lpd, aggregates, sa)
    # the prior hardware's side of the booster inputs (NaN / unknown without a prior)
    f["o_hardware_type"] = Coded(other_hw, sa.names)
    _hw_columns(f, "o_", sa, other_hw, job, phys)
    f["o_agg_cand"], f["o_agg_cand_count"] = o_agg, o_agg_count
    return Columns(f, len(job))


def _config_columns(
    f: dict[str, object], jobs: Jobs, job: np.ndarray, elem: np.ndarray, phys: _JobPhysics
) -> None:
    """The job's numeric configuration, broadcast to its candidate rows."""
    for name, col in (
        ("log_params", "parameters"),
        ("log_layers", "layers"),
        ("log_hidden", "hidden_size"),
        ("log_seq", "sequence_length"),
        ("log_global_batch", "global_batch_size"),
        ("log_micro_batch", "micro_batch_size"),
        ("log_devices", "num_devices"),
        ("log_dp", "data_parallel"),
        ("log_tp", "tensor_parallel"),
        ("log_pp", "pipeline_parallel"),
    ):
        f[name] = _log(f64(jobs, col))[job]
    f["log_active_params"] = _log(_active_params(jobs))[job]
    f["act_ckpt"] = np.asarray(jobs["activation_checkpointing"], np.float64)[job]
    f["log_flops_per_sample"] = _log(phys.fps)[job]
    bps = f64(jobs, "sequence_length") * f64(jobs, "hidden_size") * f64(jobs, "layers") * elem
    f["log_bytes_per_sample"] = _log(bps)[job]
    f["log_mem_per_device_gib"] = _log(phys.mem)[job]
    # gradient accumulation steps and the pipeline bubble they amortise; FLOPs of one
    # micro-batch per device (small kernels cannot fill a big chip)
    mbs, dp = f64(jobs, "micro_batch_size"), f64(jobs, "data_parallel")
    accum = np.maximum(1.0, f64(jobs, "global_batch_size") / (mbs * dp))
    f["log_accum"] = _log(accum)[job]
    f["pp_bubble"] = ((f64(jobs, "pipeline_parallel") - 1.0) / accum)[job]
    f["log_micro_flops"] = _log(phys.micro_flops)[job]


def _categorical_columns(f: dict[str, object], jobs: Jobs, job: np.ndarray) -> None:
    for col in ("precision", "family", "framework", "optimizer"):
        f[col] = Coded(job, np.asarray(jobs[col], object))
    f["model_type"] = Coded(job, np.asarray(jobs["model_type"], object))  # levels: the model's


def _hw_columns(
    f: dict[str, object],
    prefix: str,
    sa: SpecArrays,
    codes: np.ndarray,
    job: np.ndarray,
    phys: _JobPhysics,
) -> None:
    """The hardware ``codes`` of each row: its specs and the physics estimate on it."""
    f[prefix + "vendor"] = Coded(codes, sa.vendor)
    f[prefix + "log_peak_tflops"] = sa.log_flops[codes]
    f[prefix + "log_mem_bw"] = sa.log_bw[codes]
    f[prefix + "log_device_mem"] = sa.log_mem[codes]
    f[prefix + "log_interconnect"] = sa.log_ic[codes]
    f[prefix + "log_cost"] = sa.log_cost[codes]
    f[prefix + "log_roofline"] = _log(ROOFLINE_SHARE * sa.flops[codes] * 1e12) - _log(phys.fps)[job]
    f[prefix + "mem_ratio"] = phys.mem[job] / sa.mem[codes]
    # seconds per sample per device: compute, memory traffic, gradient and TP all-reduces
    t_c = phys.fps[job] / (_peak_tflops(sa, codes, job, phys) * 1e12 * COMPUTE_SHARE)
    bw = sa.bw[codes] * 1e9 * MEMORY_SHARE
    t_m = phys.traffic[job] / bw
    # all-reduces that span more devices than a scale-up domain cross the slower network
    domain, ic = sa.domain[codes], sa.ic[codes]
    across = np.fmin(ic, sa.network[codes])  # the scale-up link where the catalog says nothing
    n = phys.devices[job]
    all_devices = np.where(n <= domain, ic, across) * 1e9  # the link between every device
    t_dp = phys.grad[job] / all_devices
    t_tp = phys.tp_bytes[job] / (np.where(phys.tp[job] <= domain, ic, across) * 1e9)
    t = np.maximum(t_c, t_m) + OVERLAP_RESIDUE * np.minimum(t_c, t_m) + DP_EXPOSED * t_dp + t_tp
    f[prefix + "log_t_compute"] = _log(t_c)
    f[prefix + "log_t_memory"] = _log(t_m)
    f[prefix + "log_t_activations"] = _log(phys.act_traffic[job] / bw)
    f[prefix + "log_t_weights"] = _log(phys.weight_traffic[job] / bw)
    f[prefix + "log_t_comm"] = _log(t_dp + t_tp + 1e-12)
    # an all-to-all between every device: which families need one, and how much of it, the
    # learned roofline finds (core.roofline); on one device, none
    t_a2a = phys.a2a_bytes[job] * (n - 1.0) / n / all_devices
    f[prefix + "log_t_a2a"] = _log(t_a2a + 1e-12)
    f[prefix + "log_phys_rate"] = -_log(t)
    f[prefix + "log_ideal_micro_s"] = _log(phys.micro_flops[job] / (sa.flops[codes] * 1e12))
    # scale-up domains the job spans (0: one; NaN: the catalog does not say), and the network
    # between them
    f[prefix + "log_domains"] = _log(np.maximum(1.0, phys.devices[job] / domain))
    f[prefix + "log_network"] = sa.log_network[codes]


def _peak_tflops(
    sa: SpecArrays, codes: np.ndarray, job: np.ndarray, phys: _JobPhysics
) -> np.ndarray:
    """The matrix peak a row's precision can use on its hardware: the fp8 peak where the part
    has one, the fp32 share where bf16 has no matrix units, else the bf16 peak × the precision's
    multiplier."""
    peak = sa.flops[codes] * phys.prec_peak[job]
    fp8 = sa.fp8[codes]
    peak = np.where(phys.is_fp8[job] & np.isfinite(fp8), fp8, peak)
    slow = phys.is_bf16[job] & ~sa.bf16_native[codes]
    return np.asarray(np.where(slow, sa.flops[codes] * _PREC_PEAK["fp32"], peak))


@QUIET_LOGS
def log_rate_ceiling(jobs: Jobs, hardware: Sequence[str], specs: SpecArrays) -> np.ndarray:
    """Per job (row of `jobs`) and the hardware type it ran on: log samples/s per device at the
    full matrix peak its precision can use, the physics reference of the history's plausibility
    guard (core.history.judge). NaN for a type without specs."""
    k = len(specs.types) + 1
    codes = np.fromiter((specs.code.get(t, k - 1) for t in hardware), np.int64, count=len(jobs))
    phys = _JobPhysics.of(jobs, _elem_bytes(jobs))
    job = np.arange(len(jobs), dtype=np.int64)
    peak = _peak_tflops(specs, codes, job, phys)
    return np.asarray(_log(peak * 1e12) - _log(phys.fps))


def _history_columns(
    f: dict[str, object],
    jobs: Jobs,
    job: np.ndarray,
    hw: np.ndarray,
    histories: Sequence[LineageHistory | None],
    sa: SpecArrays,
    now: np.ndarray,
) -> tuple[np.ndarray, np.ndarray]:
    """The lineage's own measurement on the candidate, and on its most similar *other* type.
    Returns (that other type's code per row, its log per-device rate)."""
    n, k = len(job), len(sa.types) + 1
    now_j = np.asarray(now, np.float64)
    nd_j = f64(jobs, "num_devices")
    l_uid, h_job, h_hw, h_sps, h_nd, h_at, h_cnt = _flatten_lineage(histories, sa.code)
    row_owner = l_uid[job]  # distinct history of the row's job
    row_key = row_owner * k + hw
    h_key = h_job * k + h_hw
    n_owners = int(l_uid.max()) + 1 if len(jobs) else 0
    h_lpd = _log(h_sps / h_nd) if len(h_sps) else np.empty(0)
    f["self_log_pd"] = _lookup(row_key, h_key, h_lpd)
    f["self_log_dev_ratio"] = _log(nd_j[job]) - _log(_lookup(row_key, h_key, h_nd))
    f["self_count"] = _lookup(row_key, h_key, h_cnt)
    f["self_age_days"] = (now_j[job] - _lookup(row_key, h_key, h_at)) / DAY_S
    hist_types = np.bincount(h_job, minlength=n_owners).astype(np.float64)
    f["hist_types"] = hist_types[row_owner]
    other_idx = _most_similar_other(sa, hw, row_owner, hist_types, h_job, h_hw, h_at)
    has_other = other_idx >= 0
    oi = np.where(has_other, other_idx, 0)

    def other(v: np.ndarray) -> np.ndarray:
        if len(v) == 0:
            return np.full(n, np.nan)
        return np.where(has_other, v[oi], np.nan)

    other_lpd = other(h_lpd)
    other_hw = np.where(has_other, other(h_hw.astype(np.float64)), k - 1).astype(np.int64)
    log_flops, log_bw = sa.log_flops, sa.log_bw
    f["other_log_pd"] = other_lpd
    f["other_log_flops_ratio"] = np.where(has_other, log_flops[hw] - log_flops[other_hw], np.nan)
    f["other_log_bw_ratio"] = np.where(has_other, log_bw[hw] - log_bw[other_hw], np.nan)
    f["other_count"] = other(h_cnt)
    f["other_age_days"] = (now_j[job] - other(h_at)) / DAY_S
    # the job's devices now ÷ the prior's: per-device rates fall as one job spreads wider
    f["other_log_dev_ratio"] = _log(nd_j[job]) - _log(other(h_nd))
    return other_hw, other_lpd


def _most_similar_other(
    sa: SpecArrays,
    hw: np.ndarray,
    row_owner: np.ndarray,
    hist_types: np.ndarray,
    h_job: np.ndarray,
    h_hw: np.ndarray,
    h_at: np.ndarray,
) -> np.ndarray:
    """Per row, the history entry of the most similar *other* type the lineage ran on (spec
    distance; -1 when none), found through (row × entry) pairs."""
    n = len(hw)
    other_idx = np.full(n, -1, np.int64)
    if not (len(h_job) and n):
        return other_idx
    log_flops, log_bw = sa.log_flops, sa.log_bw
    order = np.argsort(h_job, kind="stable")
    h_start = np.searchsorted(h_job[order], np.arange(len(hist_types)))
    per_row = hist_types.astype(np.int64)[row_owner]
    pair_row = np.repeat(np.arange(n), per_row)
    offs = np.arange(len(pair_row)) - np.repeat(np.cumsum(per_row) - per_row, per_row)
    pair_entry = order[h_start[row_owner[pair_row]] + offs]
    ph = h_hw[pair_entry]
    rh = hw[pair_row]
    # same vendor first (software stack and kernels carry over), then FLOP/s and bandwidth
    dist = (
        np.abs(log_flops[rh] - log_flops[ph])
        + np.abs(log_bw[rh] - log_bw[ph])
        + np.where(sa.vendor[rh] == sa.vendor[ph], 0.0, VENDOR_PENALTY)
    )
    dist = np.where((ph == rh) | ~np.isfinite(dist), np.inf, dist)
    # ties: most recent measurement
    sel = np.lexsort((-h_at[pair_entry], dist, pair_row))
    first = np.ones(len(sel), bool)
    first[1:] = pair_row[sel][1:] != pair_row[sel][:-1]
    best = sel[first]
    ok = np.isfinite(dist[best])
    other_idx[pair_row[best][ok]] = pair_entry[best][ok]
    return other_idx


def _aggregate_columns(
    f: dict[str, object],
    job: np.ndarray,
    hw: np.ndarray,
    other_hw: np.ndarray,
    other_lpd: np.ndarray,
    aggregates: Sequence[TypeAggregates | None] | AggregatesAsOf,
    sa: SpecArrays,
) -> tuple[np.ndarray, np.ndarray]:
    """The model type's aggregates on the candidate and on the prior's type, and the prior
    moved to the candidate by the spec ratios. Returns the aggregate on the prior's type and
    its count (the prior side's `agg` inputs)."""
    if isinstance(aggregates, AggregatesAsOf):
        mt, marks = aggregates.model_type[job], aggregates.marks[job]
        agg_cand, cand_count = aggregates.log.at(mt, hw, marks, sa.code)
        agg_prior, prior_count = aggregates.log.at(mt, other_hw, marks, sa.code)
    else:
        k = len(sa.types) + 1
        a_uid, a_job, a_hw, a_ewma, a_cnt = _flatten_aggregates(aggregates, sa.code)
        a_key = a_job * k + a_hw
        a_row = a_uid[job] * k
        agg_cand = _lookup(a_row + hw, a_key, a_ewma)
        cand_count = _lookup(a_row + hw, a_key, a_cnt)
        agg_prior = _lookup(a_row + other_hw, a_key, a_ewma)
        prior_count = _lookup(a_row + other_hw, a_key, a_cnt)
    f["agg_cand"] = agg_cand
    f["agg_cand_count"] = cand_count
    f["agg_prior"] = agg_prior
    f["agg_ratio"] = agg_cand - agg_prior
    # The other-hardware prior moved to the candidate by a blend of the FLOP/s and bandwidth
    # ratios (the aggregate ratio is a separate feature so the `agg` ablation stays clean).
    log_flops, log_bw = sa.log_flops, sa.log_bw
    spec_ratio = 0.5 * ((log_flops[hw] - log_flops[other_hw]) + (log_bw[hw] - log_bw[other_hw]))
    f["est_transfer"] = other_lpd + spec_ratio
    return agg_prior, prior_count


def booster_features(groups: Sequence[str]) -> list[str]:
    """Booster inputs of the enabled groups (the prior group anchors, it is not an input)."""
    return [f for g in BOOSTER_GROUPS if g in groups for f in GROUPS[g]]
