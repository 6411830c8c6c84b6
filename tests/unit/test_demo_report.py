"""The demo's report builder on frames small enough to work every figure out by hand.

Four submissions, prices a = $2, b = $1 per device-hour:

    job  candidates default ran  measured  device-h  truth (a, b)  ranking
    j1   a|b        a       a    100       10        100, 80       model: b 85 (rank 1), a 105 [90, 110]
    j2   a|b        b       b     44        5        100, 40       model: b 50 [45, 55] (rank 1), a 60
    j3   a          a       a    failed     1         50           none (not eligible: no choice)
    j4   a|b        a       a     90        5        100, 30       none (lookup_miss)
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from leap_stream.tools.demo import report as R

PRICES = {"a": 2.0, "b": 1.0}


def _cand(hw: str, pred: float, rank: int, interval: tuple[float, float] | None = None) -> dict:
    return {
        "hardware_type": hw,
        "predicted_throughput": pred,
        "interval": None
        if interval is None
        else {"low": interval[0], "high": interval[1], "level": 0.8},
        "cost_per_device_hour": PRICES[hw],
        "num_devices": 1,
        "throughput_per_cost": pred * 3600 / PRICES[hw],
        "rank": rank,
    }


def _ranking(job: str, source: str, cands: list[dict], history: bool, reason: str = "ok") -> dict:
    return {
        "job_id": job,
        "attempt": 1,
        "submission_event_id": f"sub-{job}",
        "source": source,
        "reason": reason,
        "model_version": "v1" if source == "model" else None,
        "history_used": history,
        "candidates": cands,
        "excluded": [],
    }


@pytest.fixture
def inputs() -> R.DemoInputs:
    subs = pd.DataFrame(
        {
            "job_id": ["j1", "j2", "j3", "j4"],
            "attempt": [1, 1, 1, 1],
            "candidate_hardware": ["a|b", "a|b", "a", "a|b"],
            "default_hardware": ["a", "b", "a", "a"],
            "has_prior": [True, False, False, False],
        }
    )
    comps = pd.DataFrame(
        {
            "job_id": ["j1", "j2", "j3", "j4"],
            "attempt": [1, 1, 1, 1],
            "hardware_type": ["a", "b", "a", "a"],
            "status": ["succeeded", "succeeded", "failed", "preempted"],
            "samples_per_s": [100.0, 44.0, np.nan, 90.0],
            "device_hours": [10.0, 5.0, 1.0, 5.0],
        }
    )
    truth = pd.DataFrame(
        {
            "job_id": ["j1", "j1", "j2", "j2", "j3", "j4", "j4"],
            "attempt": [1] * 7,
            "hardware_type": ["a", "b", "a", "b", "a", "a", "b"],
            "true_samples_per_s": [100.0, 80.0, 100.0, 40.0, 50.0, 100.0, 30.0],
        }
    )
    lookup = truth[["job_id", "attempt", "hardware_type"]].assign(
        lookup=[150.0, 50.0, 100.0, 40.0, np.nan, 95.0, 30.0]
    )
    rankings = [
        # an earlier delivery of j1 (at least once): the later one must win
        _ranking("j1", "model", [_cand("a", 1.0, 1)], True),
        _ranking("j2", "model", [_cand("b", 50.0, 1, (45.0, 55.0)), _cand("a", 60.0, 2)], False),
        _ranking("j1", "model", [_cand("b", 85.0, 1), _cand("a", 105.0, 2, (90.0, 110.0))], True),
        _ranking("j3", "none", [], False, "lookup_miss"),
        _ranking("j4", "none", [], False, "lookup_miss"),
    ]
    return R.DemoInputs(
        submissions=subs,
        completions=comps,
        truth=truth,
        rankings=rankings,
        lookup=lookup,
        latency_s=[0.1, 0.2, 0.3],
        prices=PRICES,
        run={"lag_end": 0},
    )


def test_latest_ranking_wins(inputs: R.DemoInputs) -> None:
    heads, cands = R.rankings_frames(inputs.rankings)
    assert len(heads) == 4
    assert heads.set_index("job_id").loc["j1", "choice"] == "b"
    assert pd.isna(heads.set_index("job_id").loc["j3", "choice"])
    assert len(cands) == 4  # j1: 2, j2: 2 (the stale j1 ranking is gone)


def test_coverage_counts_eligible_submissions_and_device_hours(inputs: R.DemoInputs) -> None:
    rep, _ = R.build_report(inputs)
    cov = rep["coverage"]
    assert cov["submissions"] == 4 and cov["rankings"] == 4 and cov["missing"] == 0
    assert cov["eligible"] == 3  # j3 has a single candidate
    assert cov["covered"] == 2
    assert cov["coverage"] == pytest.approx(2 / 3)
    assert cov["device_hours_eligible"] == pytest.approx(20.0)
    assert cov["device_hours_coverage"] == pytest.approx(15 / 20)
    assert cov["by_source"] == {"model": 2, "none": 2}


def test_accuracy_where_it_ran_and_on_every_candidate(inputs: R.DemoInputs) -> None:
    rep, frames = R.build_report(inputs)
    ran = rep["accuracy"]["ran"]
    assert ran["service"]["rows"] == 3  # j3 failed: not measured
    assert ran["service"]["accuracy"] == pytest.approx(1 / 3)  # j1 ok, j2 13.6 %, j4 missing
    assert ran["service"]["predicted"] == pytest.approx(2 / 3)
    assert ran["service"]["mape"] == pytest.approx((0.05 + 6 / 44) / 2)
    assert ran["lookup"]["accuracy"] == pytest.approx(2 / 3)  # j2 9.1 %, j4 5.6 %
    assert ran["oracle"]["accuracy"] == pytest.approx(2 / 3)  # j4: truth 100 vs 90 = 11 %
    assert ran["service_with_history"]["accuracy"] == 1.0
    assert ran["service_without_history"]["accuracy"] == 0.0
    assert ran["service"]["exact"] == 0
    allc = rep["accuracy"]["all_candidates"]
    assert allc["service"]["rows"] == 7
    assert allc["service"]["accuracy"] == pytest.approx(2 / 7)  # j1 a and b
    assert allc["lookup"]["accuracy"] == pytest.approx(4 / 7)  # j2 a, b; j4 a, b
    assert set(frames["measured"]["job_id"]) == {"j1", "j2", "j4"}


def test_calibration_interval_and_ratio(inputs: R.DemoInputs) -> None:
    rep, _ = R.build_report(inputs)
    cal = rep["calibration"]
    assert cal["rows"] == 2  # only model predictions carry an interval
    assert cal["interval_coverage"] == pytest.approx(0.5)  # 100 in [90, 110]; 44 not in [45, 55]
    assert cal["median_ratio"] == pytest.approx((100 / 105 + 44 / 50) / 2)
    assert sum(b["rows"] for b in cal["bins"]) == 2


def test_savings_against_the_default_lookup_and_oracle(inputs: R.DemoInputs) -> None:
    rep, frames = R.build_report(inputs)
    sav = rep["savings"]
    assert sav["jobs"] == 3
    assert sav["default_cost_usd"] == pytest.approx(35.0)  # 10·2 + 5·1 + 5·2
    # j1 moves to b: 10 h × 100/80 = 12.5 h × $1; j2 stays; j4 (none) stays on its default
    assert sav["service"]["cost_usd"] == pytest.approx(27.5)
    assert sav["service"]["saving"] == pytest.approx(1 - 27.5 / 35)
    assert sav["service"]["moved"] == 1
    assert sav["service"]["oracle_match"] == pytest.approx(2 / 3)
    assert sav["service"]["device_hours_saving"] == pytest.approx(1 - 22.5 / 20)
    # oracle: j1 → b, j2 → a (5 h × 40/100 = 2 h × $2 = $4)
    assert sav["oracle"]["cost_usd"] == pytest.approx(26.5)
    # lookup: j1 stays on a (150/2 > 50/1), j2 → a ($4), j4 stays
    assert sav["lookup"]["cost_usd"] == pytest.approx(34.0)
    assert sav["service_share_of_oracle"] == pytest.approx((1 - 27.5 / 35) / (1 - 26.5 / 35))
    picks = frames["choices"].set_index("job_id")
    assert picks.loc["j4", "service"] == "a" and picks.loc["j2", "oracle"] == "a"


def test_latency_percentiles_and_leak_detector() -> None:
    lat = R.latency([0.1, 0.2, 0.3, float("nan")])
    assert lat["n"] == 3 and lat["p50_ms"] == pytest.approx(200.0) and lat["max_ms"] == 300.0
    assert R.latency([]) == {"n": 0}
    leak = R._acc(np.array([10.0, 20.0]), np.array([10.0, 25.0]))
    assert leak["exact"] == 1 and leak["accuracy"] == 0.5


def test_text_plots_and_html(inputs: R.DemoInputs, tmp_path: Path) -> None:
    from leap_stream.tools.demo.html import render_html
    from leap_stream.tools.demo.plots import all_plots

    rep, frames = R.build_report(inputs)
    text = R.render_text(rep)
    assert "66.7 % of 3 eligible" in text and "p99" in text and "lag at end    0" in text
    images = all_plots(rep, frames, inputs.latency_s, tmp_path)
    for path in images.values():
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    page = render_html(rep, text, images)
    assert page.count("data:image/png;base64,") == 4 and "src='http" not in page
    assert math.isfinite(rep["savings"]["service"]["saving"])


def test_worker_metrics_summary_from_prometheus_text() -> None:
    text = """# TYPE leap_rankings_out_total counter
leap_rankings_out_total{source="model"} 7.0
leap_rankings_out_total{source="none"} 1.0
# TYPE leap_dead_letter_total counter
leap_dead_letter_total{kind="schema",topic="s"} 2.0
leap_dead_letter_total{kind="schema",topic="c"} 1.0
leap_dead_letter_total{kind="not_json",topic="s"} 1.0
# TYPE leap_batch_seconds histogram
leap_batch_seconds_bucket{agent="submissions",le="+Inf"} 4.0
leap_batch_seconds_sum{agent="submissions"} 0.2
leap_batch_seconds_count{agent="submissions"} 4.0
# TYPE leap_batch_size histogram
leap_batch_size_bucket{agent="submissions",le="+Inf"} 4.0
leap_batch_size_sum{agent="submissions"} 10.0
leap_batch_size_count{agent="submissions"} 4.0
# TYPE leap_completions_duplicate_total counter
leap_completions_duplicate_total 3.0
"""
    wm = R.worker_metrics(text)
    assert wm["rankings_out"] == {"model": 7.0, "none": 1.0}
    assert wm["dead_letters"] == {"schema": 3.0, "not_json": 1.0}
    assert wm["batches"]["submissions"] == {"batches": 4, "mean_ms": 50.0, "mean_size": 2.5}
    assert wm["duplicates"] == 3.0
    assert "submissions 4 × 2.5 ev in 50.0 ms" in R.render_text(
        {**_minimal_report(), "worker_metrics": wm}
    )


def _minimal_report() -> dict:
    rep, _ = R.build_report(
        R.DemoInputs(
            submissions=pd.DataFrame(
                {
                    "job_id": ["j"],
                    "attempt": [1],
                    "candidate_hardware": ["a|b"],
                    "default_hardware": ["a"],
                    "has_prior": [False],
                }
            ),
            completions=pd.DataFrame(
                {
                    "job_id": ["j"],
                    "attempt": [1],
                    "hardware_type": ["a"],
                    "status": ["succeeded"],
                    "samples_per_s": [10.0],
                    "device_hours": [1.0],
                }
            ),
            truth=pd.DataFrame(
                {
                    "job_id": ["j", "j"],
                    "attempt": [1, 1],
                    "hardware_type": ["a", "b"],
                    "true_samples_per_s": [10.0, 9.0],
                }
            ),
            rankings=[_ranking("j", "model", [_cand("b", 9.0, 1), _cand("a", 10.0, 2)], False)],
            lookup=pd.DataFrame(
                {"job_id": ["j"], "attempt": [1], "hardware_type": ["a"], "lookup": [10.0]}
            ),
            latency_s=[0.01],
            prices=PRICES,
        )
    )
    return rep
