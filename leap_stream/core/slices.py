"""What a ranking's probes run: per scored row the slice of the job its probe would take and
what that costs, and for the probes a ranking names, the model's prediction on each slice
(what a scheduler carries the slice's measurement to the job's size with).

A slice is the fewest of the job's data-parallel replicas that fit the type
(`core.probe.slice_data_parallel`); with whole-job probes (`ProbeSettings.size` "job") it is the
job itself. Pure: the model is reached through the scoring function the ranker passes.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np
import pandas as pd

from leap_stream.contracts.events import Probe, ProbeRun
from leap_stream.core.aggregates import AggregatesAsOf
from leap_stream.core.columns import Columns, column_codes
from leap_stream.core.features import SpecArrays
from leap_stream.core.history import LineageHistory, TypeAggregates
from leap_stream.core.physics import memory_parts_gib
from leap_stream.core.probe import ProbeSettings, slice_data_parallel, slice_shape
from leap_stream.core.ranking import SRC_MODEL

Jobs = pd.DataFrame | Columns
Aggregates = Sequence[TypeAggregates | None] | AggregatesAsOf
# `Ranker.score_columns`: (jobs, candidates, histories, aggregates, now) → (scored rows, reasons)
Score = Callable[
    [Jobs, Sequence[Sequence[str]], Sequence[LineageHistory | None], Aggregates, np.ndarray],
    tuple[Columns, np.ndarray],
]


def probe_slices(
    specs: SpecArrays, probe: ProbeSettings | None, jobs: Jobs, frame: Columns | pd.DataFrame
) -> np.ndarray:
    """Per scored row, the data-parallel degree its probe runs with: the smallest slice of the
    job that fits the row's type, or the job's own when probes run the whole job."""
    job = np.asarray(frame["job"], np.int64)
    dp = np.asarray(jobs["data_parallel"], np.int64)[job]
    if probe is None or probe.in_place:
        return dp
    state, acts = memory_parts_gib(jobs)
    mem = specs.mem[column_codes(frame, "hardware_type", specs.code)]
    nd = np.asarray(jobs["num_devices"], np.int64)[job]
    return slice_data_parallel(state[job], acts[job], nd, dp, mem)


def _slice_rows(
    jobs: Jobs, job: np.ndarray, slices: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per row (of job ``job``): its job's data-parallel degree, and the devices and global
    batch of its slice (`core.probe.slice_shape`)."""
    dp = np.asarray(jobs["data_parallel"], np.int64)[job]
    nd, gb = slice_shape(
        np.asarray(jobs["num_devices"], np.int64)[job],
        dp,
        np.asarray(jobs["global_batch_size"], np.int64)[job],
        slices,
    )
    return dp, nd, gb


def probe_rates(jobs: Jobs, frame: Columns | pd.DataFrame, slices: np.ndarray) -> np.ndarray:
    """Per scored row, what its probe costs an hour (its price × the devices of its slice);
    NaN, never probed, where the slice is smaller than the job and the lineage has its own
    measurement on the type (a full run says more than a slice, and a slice's per-device rate
    would join a window of the job's own size)."""
    dp, devices, _batch = _slice_rows(jobs, np.asarray(frame["job"], np.int64), slices)
    own = (np.asarray(frame["self_count"], np.float64) > 0) & (slices < dp)
    return np.where(own, np.nan, np.asarray(frame["cost"], np.float64) * devices)


def predict_slices(
    score: Score,
    jobs: Jobs,
    at: np.ndarray,
    slice_dp: np.ndarray,
    types: Sequence[str],
    histories: Sequence[LineageHistory | None],
    aggregates: Aggregates,
    now: np.ndarray,
) -> np.ndarray:
    """Per entry, the model's samples/s of job ``at[i]`` (a position in ``jobs``) run as a slice
    of ``slice_dp[i]`` data-parallel replicas on ``types[i]``; NaN where it has none (the slice
    does not fit, or no model). ``histories``, ``aggregates``, ``now``: per job of ``jobs``, as
    `Ranker.score_batch` takes them. One model call."""
    at = np.asarray(at, np.int64)
    sub = jobs.take(at) if isinstance(jobs, Columns) else jobs.iloc[at].reset_index(drop=True)
    nd, gb = slice_shape(
        np.asarray(sub["num_devices"], np.int64),
        np.asarray(sub["data_parallel"], np.int64),
        np.asarray(sub["global_batch_size"], np.int64),
        slice_dp,
    )
    sub["num_devices"], sub["global_batch_size"] = nd, gb
    sub["data_parallel"] = np.asarray(slice_dp, np.int64)
    aggs = (
        AggregatesAsOf(aggregates.log, aggregates.model_type[at], aggregates.marks[at])
        if isinstance(aggregates, AggregatesAsOf)
        else [aggregates[i] for i in at.tolist()]
    )
    hist = [histories[i] for i in at.tolist()]
    frame, _ = score(sub, [[t] for t in types], hist, aggs, np.asarray(now)[at])
    out = np.full(len(at), np.nan)
    model = np.asarray(frame["source"], np.int64) == SRC_MODEL
    pred = np.asarray(frame["pred"], np.float64)
    out[np.asarray(frame["job"], np.int64)[model]] = pred[model]
    return out


def slice_predictions(
    score: Score,
    jobs: Jobs,
    frame: Columns | pd.DataFrame,
    rows: np.ndarray,
    slices: np.ndarray,
    histories: Sequence[LineageHistory | None],
    aggregates: Aggregates,
    now: np.ndarray,
) -> np.ndarray:
    """Per scored row of ``rows``, the model's samples/s on its slice: its own prediction where
    the slice is the whole job, else `predict_slices` (one model call for those rows)."""
    job = np.asarray(frame["job"], np.int64)[rows]
    pred = np.asarray(frame["pred"], np.float64)[rows].copy()
    part = slices[rows] < np.asarray(jobs["data_parallel"], np.int64)[job]
    if part.any():
        types = np.asarray(frame["hardware_type"], object)[rows[part]].tolist()
        pred[part] = predict_slices(
            score, jobs, job[part], slices[rows[part]], types, histories, aggregates, now
        )
    return pred


def size_probes(
    score: Score,
    probes: list[Probe | None],
    frame: Columns,
    jobs: Columns,
    slices: np.ndarray,
    histories: Sequence[LineageHistory | None],
    aggregates: Aggregates,
) -> None:
    """Give each probe how to run each of its types (`ProbeRun`: the slice and the model's
    samples/s there); a probe with a type the model cannot predict its slice on is dropped:
    the job keeps its ranking."""
    job = np.asarray(frame["job"], np.int64)
    hw = np.asarray(frame["hardware_type"], object).tolist()
    row_of = {(j, t): r for r, (j, t) in enumerate(zip(job.tolist(), hw, strict=True))}
    entries = [(j, t) for j, p in enumerate(probes) if p is not None for t in p["hardware_types"]]
    rows = np.asarray([row_of[e] for e in entries], np.int64)
    now = np.asarray(jobs["submitted_at_s"], np.float64)
    pred = slice_predictions(score, jobs, frame, rows, slices, histories, aggregates, now)
    _dp, nd, gb = _slice_rows(jobs, job[rows], slices[rows])
    runs: dict[int, list[ProbeRun]] = {}
    for (j, _t), d, b, k, p in zip(
        entries, nd.tolist(), gb.tolist(), slices[rows].tolist(), pred.tolist(), strict=True
    ):
        run: ProbeRun = {
            "num_devices": d,
            "data_parallel": k,
            "global_batch_size": b,
            "predicted_throughput": p,
        }
        runs.setdefault(j, []).append(run)
    for j, got in runs.items():
        probe = probes[j]
        assert probe is not None
        usable = (r["predicted_throughput"] for r in got)
        if all(math.isfinite(p) and p > 0 for p in usable):
            probe["runs"] = got
        else:
            probes[j] = None


__all__ = ["predict_slices", "probe_rates", "probe_slices", "size_probes", "slice_predictions"]
