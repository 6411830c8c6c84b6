"""The informed oracle: the posterior of a lineage's hidden factors from its own runs."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from leap_stream.tools.sim.informed import InformedOracle

SIGMA_F, SIGMA_V, SIGMA_N = 0.25, 0.08, 0.035
VENDOR = {"h100-sxm": "nvidia", "a100-80g": "nvidia", "mi300x": "amd"}


def _runs(rows: list[tuple[str, str, float, str]]) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(completions, truth) of measured runs (lineage, type, measured ÷ known, ended)."""
    comp = pd.DataFrame(
        {
            "job_id": [f"j{i}" for i in range(len(rows))],
            "attempt": 0,
            "hardware_type": [r[1] for r in rows],
            "lineage_id": [r[0] for r in rows],
            "samples_per_s": [10.0 * r[2] for r in rows],
            "ended_at": pd.to_datetime([r[3] for r in rows], utc=True),
        }
    )
    truth = comp[["job_id", "attempt", "hardware_type"]].assign(known_samples_per_s=10.0)
    return comp, truth


def _brute_force(residuals: list[tuple[str, float]], target_vendor: str) -> float:
    """E[u + v_target | r] by the Gaussian conditioning formula over (u, v per vendor)."""
    vendors = sorted({v for v, _ in residuals} | {target_vendor})
    k = 1 + len(vendors)
    prior = np.diag([SIGMA_F**2] + [SIGMA_V**2] * len(vendors))
    design = np.zeros((len(residuals), k))
    for i, (v, _r) in enumerate(residuals):
        design[i, 0] = 1.0
        design[i, 1 + vendors.index(v)] = 1.0
    r = np.array([x for _v, x in residuals])
    cov_r = design @ prior @ design.T + SIGMA_N**2 * np.eye(len(r))
    mean = prior @ design.T @ np.linalg.solve(cov_r, r)
    return float(mean[0] + mean[1 + vendors.index(target_vendor)])


def test_the_posterior_is_gaussian_conditioning_on_the_lineages_own_runs() -> None:
    runs = [("l1", "h100-sxm", 1.3, "2026-01-01"), ("l1", "a100-80g", 1.25, "2026-01-02"),
            ("l1", "mi300x", 0.9, "2026-01-03")]  # fmt: skip
    oracle = InformedOracle(SIGMA_F, SIGMA_V, SIGMA_N)
    oracle.add(*_runs(runs), VENDOR)
    subs = pd.DataFrame({"lineage_id": ["l1", "l1"], "submitted_at": ["2026-01-05"] * 2})
    subs["submitted_at"] = pd.to_datetime(subs["submitted_at"], utc=True)
    pred = oracle.predict(subs, np.array([0, 1]), np.array(["nvidia", "google"]), np.ones(2))
    residuals = [(VENDOR[t], float(np.log(f))) for _l, t, f, _e in runs]
    assert np.log(pred[0]) == pytest.approx(_brute_force(residuals, "nvidia"), abs=1e-9)
    # a vendor the lineage never ran on: its factor stays at its prior mean, 0
    assert np.log(pred[1]) == pytest.approx(_brute_force(residuals, "google"), abs=1e-9)


def test_only_runs_that_ended_before_the_submission_count() -> None:
    oracle = InformedOracle(SIGMA_F, SIGMA_V, SIGMA_N)
    oracle.add(*_runs([("l1", "h100-sxm", 2.0, "2026-01-10")]), VENDOR)
    subs = pd.DataFrame(
        {
            "lineage_id": ["l1", "l1", "l2"],
            "submitted_at": pd.to_datetime(["2026-01-09", "2026-01-11", "2026-01-11"], utc=True),
        }
    )
    known = np.array([5.0, 5.0, 7.0])
    pred = oracle.predict(subs, np.arange(3), np.array(["nvidia"] * 3), known)
    assert pred[0] == 5.0  # its run had not ended: the known rate alone
    assert 5.0 * 1.8 < pred[1] < 5.0 * 2.0  # shrunk a little toward the prior
    assert pred[2] == 7.0  # another lineage learns nothing from it
