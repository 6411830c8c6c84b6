"""Backtest: a tiny run end to end on the simulator, and the per-job argmax it ranks with."""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd
import pytest

from leap_stream.core.ranking import best_per_job
from leap_stream.tools.backtest import LineageResamples, Night, run_backtest, savings_replicates
from leap_stream.tools.backtest.loop import whole_job_runs


def test_best_per_job_ignores_non_finite_and_keeps_ties_first() -> None:
    job = np.asarray([0, 0, 0, 1, 1, 2])
    score = np.asarray([1.0, 3.0, 3.0, -np.inf, -np.inf, 0.5])
    assert best_per_job(job, score, 4).tolist() == [1, -1, 5, -1]


def test_tiny_backtest_reports_every_predictor() -> None:
    summary, scored = run_backtest(
        seed=3, nights=1, warmup_days=3, rate=400, ablate=["prior"], progress=False
    )
    for name in ("model", "lookup", "oracle"):
        m = summary[name]
        for k in ("accuracy", "mape", "top1", "regret", "savings", "coverage"):
            assert np.isfinite(m[k]), (name, k)
        assert 0.0 <= m["accuracy"] <= 1.0 and 0.0 <= m["coverage"] <= 1.0
    # the oracle knows the truth: measured noise only, and it picks (almost) the best
    assert summary["oracle"]["accuracy"] > 0.95
    assert summary["oracle"]["regret"] < 0.05
    assert summary["oracle"]["top1"] >= summary["model"]["top1"]
    assert summary["model"]["coverage"] > 0.95
    # closed loop by default: the jobs ran on the ranking's first choice
    assert summary["policy"] == "ranked"
    assert summary["model"]["regret_top1pct"] >= summary["oracle"]["regret_top1pct"] >= 0.0
    night = summary["per_night"][0]
    assert 0.0 <= night["transfer_accuracy"] <= 1.0
    assert night["transfer_accuracy"] == round(
        night["by_anchor"]["all"]["transfer"][1] / night["by_anchor"]["all"]["transfer"][0], 4
    )
    # the first candidate and those within the noise of it: at least the first, and holding the
    # measured best at least as often as the first alone
    assert summary["model"]["noise_set_size"] >= 1.0
    assert summary["model"]["best_in_noise_set"] >= summary["model"]["top1"]
    assert "prior" in summary["ablation_delta"]
    assert len(summary["per_night"]) == 1 and len(scored) == 1
    # the savings share and its interval over resampled lineages; the resamples stay out of the
    # reported nights
    m = summary["model"]
    assert m["savings_share_of_oracle"] == round(m["savings"] / summary["oracle"]["savings"], 4)
    low, high = m["savings_share_of_oracle_95"]
    assert low <= m["savings_share_of_oracle"] <= high and low < high
    assert "savings_replicates" not in summary["per_night"][0]
    # the informed oracle: the ceiling of what enough of a fleet's data allows, between model
    # and oracle; the attainable one, with the (model type × type) factors only as the runs so
    # far tell them, below it
    informed, attainable = summary["informed"], summary["attainable"]
    assert summary["oracle"]["accuracy"] > informed["accuracy"] > summary["model"]["accuracy"]
    assert informed["accuracy"] > attainable["accuracy"]
    ceiling = summary["ceiling"]
    assert ceiling["accuracy"] == {
        "model": m["accuracy"],
        "informed": informed["accuracy"],
        "attainable": attainable["accuracy"],
        "share": round(m["accuracy"] / informed["accuracy"], 4),
        "share_attainable": round(m["accuracy"] / attainable["accuracy"], 4),
    }
    assert {"top1", "savings", "transfer", "transfer_same_vendor"} <= set(ceiling)


def test_a_closed_loop_with_a_budget_runs_explorations_and_counts_their_cost() -> None:
    """With an exploration budget the jobs a ranking marks `explore` run there: the summary
    counts them, their measured extra cost as a share of the fleet's, and the savings net of
    it; without one, none run and the savings as run are the first choice's."""
    summary, _ = run_backtest(
        seed=3, nights=2, warmup_days=3, rate=400, progress=False, explore_budget=0.5
    )
    e, m = summary["explore"], summary["model"]
    nights = [n["as_run"] for n in summary["per_night"]]
    assert summary["explore_budget"] == 0.5
    assert e["count"] > 0 and e["count"] == sum(n["explore_count"] for n in nights)
    assert e["cost_share_fleet"] == round(
        sum(n["explore_extra_cost"] for n in nights) / sum(n["fleet_cost"] for n in nights), 5
    )
    net = np.mean([1.0 - n["as_run_cost"] / n["default_cost"] for n in nights])
    assert m["savings_net"] == round(float(net), 4)
    assert m["savings_share_of_oracle_net"] == round(float(net) / summary["oracle"]["savings"], 4)
    assert summary["probes"]["count"] == 0  # no probes without a budget
    off, _ = run_backtest(seed=3, nights=1, warmup_days=3, rate=400, progress=False)
    assert off["explore"]["count"] == 0 and off["probes"]["count"] == 0
    assert off["model"]["savings_net"] == off["model"]["savings"]
    assert off["model"]["top1_as_run"] == pytest.approx(off["model"]["top1"], abs=1e-4)
    assert off["model"]["regret_top1pct"] == pytest.approx(
        off["model"]["regret_top1pct_first_choice"], abs=0.01
    )


def test_probes_run_where_the_ranking_marks_them_and_are_paid_for() -> None:
    """With a probe budget, long jobs whose first candidates the model cannot tell apart are
    probed: the probes' cost is within the budget of the jobs probed, it is taken off the
    savings, and their measurements become training rows marked as probes."""
    from leap_stream.core.probe import ProbeSettings

    seen: list[Night] = []
    summary, _ = run_backtest(
        seed=3,
        nights=2,
        warmup_days=3,
        rate=1000,
        progress=False,
        probe=ProbeSettings(budget=0.05),
        on_night=seen.append,
    )
    p, m = summary["probes"], summary["model"]
    nights = [n["as_run"] for n in summary["per_night"]]
    assert summary["probe_budget"] == 0.05
    assert p["count"] > 0 and p["count"] == sum(n["probe_count"] for n in nights)
    assert 0 < p["cost_share_probed"] <= 0.05
    assert p["cost_usd"] == pytest.approx(sum(n["probe_cost"] for n in nights), abs=0.01)
    net = np.mean([1.0 - n["as_run_cost"] / n["default_cost"] for n in nights])
    assert m["savings_net"] == round(float(net), 4)
    # each probed type measured, and the measurement went to the history and training rows
    assert p["measurements"] >= p["count"]
    assert seen[1].train_frame.shape[0] > 0


def test_savings_replicates_weigh_jobs_alike_for_every_predictor() -> None:
    default = np.asarray([1.0, 2.0, 3.0, 100.0])
    weights = np.random.default_rng(0).poisson(1.0, (500, 4))
    out = savings_replicates(
        default,
        {"same": default, "half": default / 2, "big_miss": np.asarray([0.5, 1.0, 1.5, 100.0])},
        weights,
    )
    assert out["same"].shape == (500,)
    np.testing.assert_allclose(out["same"][np.isfinite(out["same"])], 0.0)
    np.testing.assert_allclose(out["half"][np.isfinite(out["half"])], 0.5)
    # the large job decides: where it is drawn the savings are small, where it is not, half
    big = out["big_miss"]
    assert np.nanmin(big) < 0.05 and np.nanmax(big) == pytest.approx(0.5)
    drawn = np.isfinite(big)  # a resample without any job has no savings
    np.testing.assert_array_equal((big > 0.4)[drawn], (weights[:, 3] == 0)[drawn])


def test_a_lineage_weighs_the_same_in_every_night() -> None:
    resamples = LineageResamples(np.random.default_rng(0), replicates=50)
    night1 = resamples.weights(["a", "b", "a"])
    night2 = resamples.weights(["c", "a", "b", "b"])
    assert night1.shape == (50, 3) and night2.shape == (50, 4)
    np.testing.assert_array_equal(night1[:, 0], night1[:, 2])  # one lineage, two jobs
    np.testing.assert_array_equal(night1[:, 0], night2[:, 1])  # and on the next night
    np.testing.assert_array_equal(night1[:, 1], night2[:, 3])
    assert not np.array_equal(night1[:, 0], night1[:, 1])  # two lineages drawn apart
    assert night2[:, 0].mean() == pytest.approx(1.0, abs=0.35)


def test_backtest_breaks_accuracy_down_by_anchor() -> None:
    summary, _ = run_backtest(seed=4, nights=1, warmup_days=4, rate=600, progress=False)
    by = summary["by_anchor"]
    for scope in ("all", "ran"):
        kinds = {k: v for k, v in by[scope].items() if k in ("self", "transfer", "model")}
        assert kinds and abs(sum(v["share"] for v in kinds.values()) - 1.0) < 1e-3
        fam = sum(v["rows"] for k, v in by[scope].items() if k.startswith("family="))
        assert fam == sum(v["rows"] for v in kinds.values())
    # a lineage re-running where it ran before is predicted far better than a new one
    assert by["ran"]["self"]["accuracy"] > by["ran"]["model"]["accuracy"] + 0.3
    # transfer rows split by the vendor of the prior, and the informed oracle on the same rows
    split = [by["all"][k]["rows"] for k in ("transfer_same_vendor", "transfer_cross_vendor")]
    assert sum(split) == by["all"]["transfer"]["rows"] and min(split) > 0
    # rare pairs: a subset of the rows not anchored on their own prior
    assert (
        0
        < by["all"]["rare_pair"]["rows"]
        < by["all"]["transfer"]["rows"] + by["all"]["model"]["rows"]
    )
    informed = summary["by_anchor_informed"]["all"]
    attainable = summary["by_anchor_attainable"]["all"]
    assert informed["transfer"]["rows"] == attainable["transfer"]["rows"]
    assert informed["transfer"]["rows"] == by["all"]["transfer"]["rows"]
    same = "transfer_same_vendor"
    assert informed[same]["accuracy"] > attainable[same]["accuracy"] > by["all"][same]["accuracy"]
    # pooled counts agree with the mean of the per-night accuracy (one night)
    n = summary["per_night"][0]["by_anchor"]["all"]
    rows = sum(v[0] for k, v in n.items() if k in ("self", "transfer", "model"))
    hits = sum(v[1] for k, v in n.items() if k in ("self", "transfer", "model"))
    assert abs(hits / rows - summary["model"]["accuracy"]) < 1e-3
    # interval coverage per anchor kind over the intervals given, as the overall figure (a
    # candidate excluded as not fitting has none): pooled, the kinds make the overall figure
    kinds = [n[k] for k in ("self", "transfer", "model")]
    inside, with_interval = sum(v[2] for v in kinds), sum(v[3] for v in kinds)
    assert inside / with_interval == pytest.approx(summary["model"]["interval_coverage_80"], 1e-3)
    for kind in ("self", "transfer", "model"):
        rows_k, _hits, inside_k, with_width, width_sum = n[kind]
        assert by["all"][kind]["interval_coverage_80"] == pytest.approx(inside_k / with_width, 1e-3)
        assert 0 < with_width <= rows_k
        assert by["all"][kind]["interval_width_log"] == pytest.approx(width_sum / with_width, 1e-3)
    # an interval around the lineage's own measurement is far narrower than a blind one's
    assert by["all"]["self"]["interval_width_log"] < 0.5 * by["all"]["model"]["interval_width_log"]


def test_on_night_hands_each_night_the_rows_the_summary_counts() -> None:
    from leap_stream.core.ranker import SRC_NONE

    seen: list[Night] = []
    summary, _ = run_backtest(
        seed=5, nights=2, warmup_days=3, rate=400, progress=False, on_night=seen.append
    )
    assert [n.index for n in seen] == [0, 1]
    for night, per in zip(seen, summary["per_night"], strict=True):
        assert len(night.train_frame) == len(night.train_samples_per_s) == per["train_rows"]
        assert len(night.train_lineages) == per["train_rows"]
        base, tr = night.scored, night.truth
        assert len(tr.meas) == len(base)
        pred = base["pred"].to_numpy(np.float64)
        usable = (base["source"].to_numpy() != SRC_NONE) & np.isfinite(pred) & base["fits"]
        with np.errstate(invalid="ignore", divide="ignore"):
            hit = usable & tr.in_truth & (np.abs(pred / tr.meas - 1.0) <= 0.10)
        counts = per["by_anchor"]["all"]
        assert int(hit.sum()) == sum(counts[k][1] for k in ("self", "transfer", "model"))
        assert int(tr.in_truth.sum()) == per["rows"]


def test_lookup_scores_match_a_lookup_only_ranker() -> None:
    from leap_stream.catalog import load_catalog
    from leap_stream.core.lookup import LookupTable
    from leap_stream.core.ranker import Ranker
    from leap_stream.tools.backtest.scoring import _lookup_only
    from leap_stream.tools.backtest.truth import _candidates
    from leap_stream.tools.sim.config import SimConfig
    from leap_stream.tools.sim.fleet import simulate
    from leap_stream.train import pit

    res = simulate(SimConfig(seed=5, days=2, rate=500))
    subs = res.submissions.tail(300).reset_index(drop=True)
    snap = pit.replay(res.dataset, subs)
    lk = LookupTable.fit(res.dataset)
    cat = load_catalog()
    args = (subs, _candidates(subs), snap.histories, snap.aggregates, snap.now)
    ref, _ = Ranker(cat, None, lk).score_batch(*args)
    base, _ = Ranker(cat, None, None).score_batch(*args)
    got = _lookup_only(base, subs, lk)
    np.testing.assert_array_equal(got["source"].to_numpy(), ref["source"].to_numpy())
    np.testing.assert_allclose(got["pred"].to_numpy(), ref["pred"].to_numpy(), equal_nan=True)
    assert (got["source"] == 1).mean() > 0.3


def test_drift_recovery_follows_the_changed_family_and_vendor() -> None:
    from leap_stream.tools.backtest import drift_recovery
    from leap_stream.tools.sim.config import DriftEvent

    key = "fv=dense_llm|nvidia"

    def night(ran: tuple[int, int]) -> dict[str, Any]:
        return {"by_anchor": {"ran": {key: [ran[0], ran[1], 0]}, "all": {key: [10, 2, 0]}}}

    per_night = [night((10, 8)), night((10, 5)), night((10, 7)), night((10, 8))]
    events = [
        DriftEvent(15, "nvidia", "dense_llm", 1.3),  # night index 1 with a 14-day warm-up
        DriftEvent(3, "nvidia", "dense_llm", 1.3),  # in the warm-up: not scored
        DriftEvent(15, "amd", "dense_llm", 1.3),  # no rows of that key: empty figures
    ]
    out = drift_recovery(per_night, events, warmup_days=14)
    assert [e["vendor"] for e in out] == ["nvidia", "amd"]
    assert out[0]["night"] == 2
    assert out[0]["accuracy_ran_by_offset"] == {"-1": 0.8, "0": 0.5, "1": 0.7, "2": 0.8}
    assert out[0]["accuracy_all_by_offset"]["0"] == 0.2
    assert out[1]["accuracy_ran_by_offset"] == {}


def test_parse_drift_builds_the_event_or_names_the_fault() -> None:
    from leap_stream.tools.backtest import parse_drift

    e = parse_drift("moe_llm:amd:20:0.9")
    assert (e.family, e.vendor, e.day, e.factor) == ("moe_llm", "amd", 20, 0.9)
    for bad in ("moe_llm:amd:20", "moe:amd:20:0.9", "moe_llm:amd:x:0.9", "moe_llm:amd:3:-1"):
        with pytest.raises(ValueError, match="--drift"):
            parse_drift(bad)


def test_new_hardware_summary_finds_the_night_it_is_routed() -> None:
    from leap_stream.tools.backtest import new_hardware_summary

    def night(model_top: int, oracle_top: int, savings: float) -> dict[str, Any]:
        return {
            "new_hardware": {"model_top": model_top, "oracle_top": oracle_top},
            "model": {"savings": savings},
            "oracle": {"savings": 0.4},
        }

    per_night = [night(0, 0, 0.2)] * 3 + [night(1, 10, 0.2), night(4, 10, 0.3), night(6, 10, 0.3)]
    out = new_hardware_summary(per_night, "mi355x", from_day=17, warmup_days=14)
    assert out["per_night"][0]["night"] == 4  # the type's first day is the fourth scored night
    assert out["nights_until_routed"] == 2  # 6 ≥ half of 10 on its third night
    assert out["savings_share_of_oracle"] == round((0.2 + 0.3 + 0.3) / 3 / 0.4, 4)
    never = new_hardware_summary([night(0, 5, 0.1)] * 2, "x", from_day=0, warmup_days=14)
    assert never["nights_until_routed"] is None


def test_the_regret_of_the_worst_jobs_sums_the_largest_share() -> None:
    from leap_stream.tools.backtest.scoring import regret_of_the_worst

    regret = np.asarray([5.0, 0.0, 100.0, 1.0] + [0.5] * 196)  # 200 jobs: the top 1 % is 2
    assert regret_of_the_worst(regret) == 105.0
    assert regret_of_the_worst(regret, share=0.5) == 5.0 + 100.0 + 1.0 + 0.5 * 97
    assert regret_of_the_worst(np.asarray([3.0])) == 3.0  # at least one job
    assert regret_of_the_worst(np.asarray([])) == 0.0


def test_the_ceilings_learn_from_probes_that_ran_the_whole_job_only() -> None:
    subs = pd.DataFrame({"job_id": ["a", "b"], "attempt": [0, 0], "num_devices": [8, 64]})
    probes = pd.DataFrame(
        {
            "job_id": ["a", "b", "c"],
            "attempt": [0, 0, 0],
            "hardware_type": ["h100-sxm", "mi300x", "h100-sxm"],
            "num_devices": [8, 8, 8],  # b ran a slice of its 64; c is no submission of the day
            "samples_per_s": [1.0, 2.0, 3.0],
        }
    )
    kept = whole_job_runs(probes, subs)
    assert kept["job_id"].tolist() == ["a"]
    assert list(kept.columns) == list(probes.columns)
