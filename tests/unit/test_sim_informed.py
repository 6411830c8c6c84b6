"""The informed oracle: the posterior of a lineage's hidden factors from its own runs."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from leap_stream.tools.sim.informed import AttainableOracle, FleetRuns, InformedOracle, Priors

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
            "model_type": "llama",
            "samples_per_s": [10.0 * r[2] for r in rows],
            "ended_at": pd.to_datetime([r[3] for r in rows], utc=True),
        }
    )
    truth = comp[["job_id", "attempt", "hardware_type"]].assign(
        known_samples_per_s=10.0, physics_samples_per_s=10.0
    )
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
    fleet = FleetRuns()
    fleet.add(*_runs(runs), VENDOR)
    oracle = InformedOracle(Priors(SIGMA_F, SIGMA_V, SIGMA_N), fleet)
    subs = pd.DataFrame({"lineage_id": ["l1", "l1"], "submitted_at": ["2026-01-05"] * 2})
    subs["submitted_at"] = pd.to_datetime(subs["submitted_at"], utc=True)
    pred = oracle.predict(subs, np.array([0, 1]), np.array(["nvidia", "google"]), np.ones(2))
    residuals = [(VENDOR[t], float(np.log(f))) for _l, t, f, _e in runs]
    assert np.log(pred[0]) == pytest.approx(_brute_force(residuals, "nvidia"), abs=1e-9)
    # a vendor the lineage never ran on: its factor stays at its prior mean, 0
    assert np.log(pred[1]) == pytest.approx(_brute_force(residuals, "google"), abs=1e-9)


def test_only_runs_that_ended_before_the_submission_count() -> None:
    fleet = FleetRuns()
    fleet.add(*_runs([("l1", "h100-sxm", 2.0, "2026-01-10")]), VENDOR)
    oracle = InformedOracle(Priors(SIGMA_F, SIGMA_V, SIGMA_N), fleet)
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


def _pair_runs(rows: list[tuple[str, str, str, float]]) -> pd.DataFrame:
    """`measured_runs`-shaped runs (lineage, model type, type, residual), all long ended."""
    return pd.DataFrame(
        {
            "lineage_id": [r[0] for r in rows],
            "vendor": [VENDOR[r[2]] for r in rows],
            "pair": [f"{r[1]}|{r[2]}" for r in rows],
            "log_physics": [r[3] for r in rows],
            "ended": pd.to_datetime(["2026-01-01"] * len(rows), utc=True).to_numpy(
                "datetime64[ns]"
            ),
        }
    )


def test_the_pair_factors_are_the_joint_gaussian_posterior_mean() -> None:
    rows = [("l1", "llama", "h100-sxm", 0.30), ("l1", "llama", "mi300x", 0.05),
            ("l2", "llama", "h100-sxm", 0.12), ("l2", "llama", "a100-80g", -0.02),
            ("l3", "llama", "a100-80g", 0.20), ("l3", "llama", "a100-80g", 0.22),
            ("l4", "bert", "mi300x", -0.15)]  # fmt: skip
    runs = _pair_runs(rows)
    oracle = AttainableOracle(Priors(SIGMA_F, SIGMA_V, SIGMA_N), 0.10, FleetRuns())
    got = oracle.pair_factors(runs)
    # brute force: every factor a column (pairs, lineages, (lineage, vendor)), one Gaussian
    pairs = sorted(set(runs["pair"]))
    lineages = sorted(set(runs["lineage_id"]))
    blocks = sorted(set(zip(runs["lineage_id"], runs["vendor"], strict=True)))
    cols = len(pairs) + len(lineages) + len(blocks)
    design = np.zeros((len(rows), cols))
    for i, (lin, v, pair) in enumerate(zip(runs["lineage_id"], runs["vendor"], runs["pair"],
                                           strict=True)):  # fmt: skip
        design[i, pairs.index(pair)] = 1.0
        design[i, len(pairs) + lineages.index(lin)] = 1.0
        design[i, len(pairs) + len(lineages) + blocks.index((lin, v))] = 1.0
    prior = np.diag([0.10**2] * len(pairs) + [SIGMA_F**2] * len(lineages)
                    + [SIGMA_V**2] * len(blocks))  # fmt: skip
    r = runs["log_physics"].to_numpy()
    cov_r = design @ prior @ design.T + SIGMA_N**2 * np.eye(len(r))
    mean = prior @ design.T @ np.linalg.solve(cov_r, r)
    for i, pair in enumerate(pairs):
        assert got[pair] == pytest.approx(mean[i], abs=1e-4)


def test_a_pair_nobody_measured_predicts_from_the_physics_and_the_lineage() -> None:
    comp, truth = _runs(
        [("l1", "h100-sxm", 1.3, "2026-01-01"), ("l2", "a100-80g", 0.8, "2026-01-01")]
    )
    fleet = FleetRuns()
    fleet.add(comp, truth, VENDOR)
    oracle = AttainableOracle(Priors(SIGMA_F, SIGMA_V, SIGMA_N), 0.10, fleet)
    subs = pd.DataFrame(
        {
            "lineage_id": ["l1", "l3"],
            "model_type": ["llama", "llama"],
            "submitted_at": pd.to_datetime(["2026-01-05"] * 2, utc=True),
        }
    )
    pred = oracle.predict(
        subs, np.array([0, 1]), np.array(["amd", "amd"]), np.array(["mi300x", "mi300x"]),
        np.array([4.0, 4.0]),
    )  # fmt: skip
    # (llama, mi300x) never ran: no factor; l1's own factor (part of its +0.26) moves it up
    assert 4.0 < pred[0] < 4.0 * 1.3
    assert pred[1] == 4.0  # a new lineage on an unmeasured pair: the physics alone
