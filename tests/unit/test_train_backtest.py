"""Backtest: a tiny run end to end on the simulator, and the per-job argmax it ranks with."""

from __future__ import annotations

import numpy as np

from leap_stream.train.backtest import _argmax_per_job, run_backtest


def test_argmax_per_job_ignores_non_finite_and_keeps_ties_first() -> None:
    job = np.asarray([0, 0, 0, 1, 1, 2])
    score = np.asarray([1.0, 3.0, 3.0, -np.inf, -np.inf, 0.5])
    assert _argmax_per_job(job, score, 4).tolist() == [1, -1, 5, -1]


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
    assert "prior" in summary["ablation_delta"]
    assert len(summary["per_night"]) == 1 and len(scored) == 1
