"""Probes (core/probe.py): which jobs a short measured run pays for, on which candidates, and
the choice once the probes are in."""

from __future__ import annotations

import numpy as np
import pytest

from leap_stream.core.probe import (
    Z80,
    ProbeSettings,
    carry,
    choose_after_probes,
    log_sd,
    plan_probes,
    probe_cost_as_run,
    slice_data_parallel,
    slice_shape,
)

DAY = 24 * 3600.0


def _job(spread: float, hours: float, devices: int = 128, n: int = 3) -> dict[str, np.ndarray]:
    """One job with `n` candidates a few % apart, each predicted within ×`spread` (80 %), that
    plans `hours` on the first at $3 per device-hour."""
    pred = 100.0 * 0.97 ** np.arange(n)
    return {
        "job": np.zeros(n, np.int64),
        "pred": pred,
        "low": pred / spread,
        "high": pred * spread,
        "usd_per_hour": np.full(n, 3.0 * devices),
        "planned_samples": np.asarray([pred[0] * hours * 3600.0]),
    }


WHOLE = ProbeSettings(size="job")


def test_a_long_wide_job_is_probed_within_its_budget() -> None:
    job = _job(spread=1.4, hours=24)
    plan = plan_probes(**job, settings=WHOLE)
    first_cost = 24 * 3.0 * 128
    assert plan.rows.sum() >= 1 and plan.saving[0] > 0
    # every probe but the first's (the job's own start, lost only if it moves) is paid
    others = plan.rows[1:].sum() * 5 / 60 * 3.0 * 128
    assert others <= plan.cost[0] <= others + plan.rows[0] * 5 / 60 * 3.0 * 128
    assert plan.cost[0] <= 0.01 * first_cost


@pytest.mark.parametrize(
    ("spread", "hours", "planned_known", "why"),
    [
        (1.4, 24.0, False, "no planned samples: a small job"),
        (1.4, 0.5, True, "short: a probe costs more than its share"),
        (1.01, 24.0, True, "the predictions are sure: nothing to learn"),
    ],
)
def test_no_probe_where_it_cannot_pay(
    spread: float, hours: float, planned_known: bool, why: str
) -> None:
    job = _job(spread, hours)
    if not planned_known:
        job["planned_samples"] = np.asarray([np.nan])
    plan = plan_probes(**job, settings=ProbeSettings())
    assert not plan.rows.any(), why
    assert np.isnan(plan.saving[0]) and np.isnan(plan.cost[0])


def test_a_zero_budget_or_length_turns_probes_off() -> None:
    job = _job(spread=1.4, hours=240)
    assert not plan_probes(**job, settings=ProbeSettings(budget=0.0)).rows.any()
    assert not plan_probes(**job, settings=ProbeSettings(minutes=0.0)).rows.any()


def test_jobs_are_planned_apart_and_a_plan_does_not_depend_on_the_batch() -> None:
    """A job with two candidates (fewer than `top`) is planned as alone, also behind a job
    without predictions and beside one that cannot pay."""
    blind = _job(spread=1.4, hours=24, n=2)
    blind["pred"] = np.full(2, np.nan)
    a, b = _job(spread=1.4, hours=24, n=2), _job(spread=1.01, hours=24, n=2)
    parts = [blind, a, b]
    both = {
        k: np.concatenate([p[k] + (i if k == "job" else 0) for i, p in enumerate(parts)]) for k in a
    }
    plan = plan_probes(**both, settings=ProbeSettings())
    alone = plan_probes(**a, settings=ProbeSettings())
    assert alone.rows.any()
    assert plan.rows[2:4].tolist() == alone.rows.tolist()
    assert not plan.rows[:2].any() and not plan.rows[4:].any()
    assert plan.saving[1] == alone.saving[0] and np.isnan(plan.saving[[0, 2]]).all()


def test_the_expected_saving_is_what_probing_then_choosing_saves() -> None:
    """Draw truths from the predictive distributions, probe as planned with a short run's
    noise, choose with `choose_after_probes`: the saving realised on average is the plan's."""
    job = _job(spread=1.5, hours=48)
    settings = ProbeSettings(budget=0.02)
    plan = plan_probes(**job, settings=settings)
    assert plan.rows.any()
    rng = np.random.default_rng(5)
    sd = log_sd(job["low"], job["high"])
    n = 4000
    truth = job["pred"] * np.exp(sd * rng.standard_normal((n, 3)))
    cost = job["planned_samples"][0] / truth * job["usd_per_hour"] / 3600.0
    saved = np.empty(n)
    types = ["a", "b", "c"]
    rates = {types[i]: float(job["usd_per_hour"][i]) for i in np.flatnonzero(plan.rows)}
    for i in range(n):
        measured = np.where(
            plan.rows, truth[i] * np.exp(settings.noise * rng.standard_normal(3)), np.nan
        )
        pick = choose_after_probes(
            job["job"],
            job["pred"],
            job["low"],
            job["high"],
            job["usd_per_hour"],
            measured,
            settings,
            1,
        )[0]
        paid = probe_cost_as_run(rates, "a", types[pick], settings)
        saved[i] = cost[i, 0] - cost[i, pick] - paid
    realised = saved.mean()
    assert realised == pytest.approx(plan.saving[0], rel=0.15)


def test_the_choice_weighs_a_probe_against_the_prediction() -> None:
    job = _job(spread=1.3, hours=24)
    args = (job["job"], job["pred"], job["low"], job["high"], job["usd_per_hour"])
    nothing = np.full(3, np.nan)
    assert choose_after_probes(*args, nothing, ProbeSettings(), 1).tolist() == [0]
    # the first measures 30 % slower than predicted, the second as predicted: the second runs
    slow_first = np.asarray([70.0, 97.0, np.nan])
    assert choose_after_probes(*args, slow_first, ProbeSettings(), 1).tolist() == [1]
    # a probe far noisier than the prediction (a few seconds long) barely moves it
    assert choose_after_probes(*args, slow_first, ProbeSettings(minutes=0.01), 1).tolist() == [0]


def test_log_sd_is_the_80_percent_interval_spread() -> None:
    assert log_sd(np.asarray([np.exp(-Z80)]), np.asarray([np.exp(Z80)]))[0] == pytest.approx(1.0)
    assert np.isnan(log_sd(np.asarray([np.nan]), np.asarray([1.0]))[0])


def test_the_first_candidates_probe_is_paid_only_when_the_job_moves() -> None:
    rates = {"a": 120.0, "b": 60.0}
    settings = ProbeSettings(minutes=6.0, size="job")
    assert probe_cost_as_run(rates, "a", "a", settings) == pytest.approx(6.0)  # b's only
    assert probe_cost_as_run(rates, "a", "b", settings) == pytest.approx(18.0)  # both
    assert probe_cost_as_run({"b": 60.0}, "a", "a", settings) == pytest.approx(6.0)
    # a slice is never the job's own start: every probe is paid
    sliced = ProbeSettings(minutes=6.0, size="slice")
    assert probe_cost_as_run(rates, "a", "a", sliced) == pytest.approx(18.0)


def test_a_slice_is_one_replica_unless_the_state_needs_more_devices() -> None:
    # 64 replicas of tensor 4 × pipeline 2 (512 devices), 80 GiB devices, 1 GiB of activations
    nd, dp, mem, acts = np.asarray([512] * 4), np.asarray([64] * 4), np.full(4, 80.0), np.ones(4)
    # model state of 100 GiB fits one replica's 8 devices; 1,000 GiB needs 2 (1,000 / 8 / 79:
    # 1.6, a power of two up); 20,000 GiB needs 32; 100,000 GiB more than the job has: all of it
    state = np.asarray([100.0, 1_000.0, 20_000.0, 100_000.0])
    k = slice_data_parallel(state, acts, nd, dp, mem)
    assert k.tolist() == [1, 2, 32, 64]
    devices, batch = slice_shape(nd, dp, np.full(4, 1024), k)
    assert devices.tolist() == [8, 16, 256, 512]
    assert batch.tolist() == [16, 32, 512, 1024]
    # activations alone past the device's memory: no slice smaller than the job
    assert slice_data_parallel(state[:1], np.asarray([90.0]), nd[:1], dp[:1], mem[:1]).tolist() == [
        64
    ]
    # a job of one replica is its own slice
    assert slice_data_parallel(
        state[:1], acts[:1], np.asarray([8]), np.asarray([1]), mem[:1]
    ).tolist() == [1]


def test_carry_moves_a_slices_measurement_by_the_models_ratio() -> None:
    got = carry(
        np.asarray([10.0, 10.0, 10.0]),
        np.asarray([400.0, np.nan, 400.0]),
        np.asarray([8.0, 8.0, 0.0]),
    )
    assert got[0] == pytest.approx(500.0)
    assert np.isnan(got[1:]).all()


def test_a_slice_probe_pays_where_a_whole_job_probe_cannot() -> None:
    """A 6-hour job on 512 devices: five minutes of the whole job on a second type is past 1 %
    of it, five minutes of one replica (8 devices) is not; the slice's noisier measurement is
    still worth it, and every probe is paid (none is the job's own start)."""
    job = _job(spread=1.4, hours=6, devices=512)
    assert not plan_probes(**job, settings=WHOLE).rows[1:].any()
    sliced = ProbeSettings(size="slice")
    plan = plan_probes(**job, settings=sliced, probe_usd_per_hour=np.full(3, 3.0 * 8))
    assert plan.rows.sum() >= 1 and plan.saving[0] > 0
    assert plan.cost[0] == pytest.approx(plan.rows.sum() * 5 / 60 * 3.0 * 8)
    assert sliced.noise > ProbeSettings(size="job").noise
