"""Exploration within the noise (core/explore.py): pure arrays."""

from __future__ import annotations

import numpy as np

from leap_stream.core.explore import explorations, never_measured


def test_the_best_untried_candidate_within_the_noise_and_the_budget_is_explored() -> None:
    """Job 0: the first (tpc 10) was run before; rows 1 and 2 are within the noise and never
    measured, row 3 too but 25 % dearer than the budget allows: row 1 (the best of them) is
    explored at 10 / 9.6 − 1. Job 1: its first is never measured itself: running it explores,
    nothing is marked. Job 2: nothing within the noise but its first."""
    job = np.array([0, 0, 0, 0, 1, 1, 2, 2])
    tpc = np.array([10.0, 9.6, 9.2, 8.0, 5.0, 4.9, 7.0, 6.0])
    near = np.array([True, True, True, True, True, True, True, False])
    untried = np.array([False, True, True, True, True, True, False, True])
    rows, extra = explorations(job, tpc, near, untried, 0.2, 3)
    assert rows.tolist() == [1, -1, -1]
    np.testing.assert_allclose(extra[0], 10.0 / 9.6 - 1.0)
    assert np.isnan(extra[1]) and np.isnan(extra[2])


def test_a_budget_of_zero_or_a_tight_one_explores_nothing() -> None:
    job, tpc = np.array([0, 0]), np.array([10.0, 9.0])
    near, untried = np.array([True, True]), np.array([False, True])
    assert explorations(job, tpc, near, untried, 0.0, 1)[0].tolist() == [-1]
    assert explorations(job, tpc, near, untried, 0.1, 1)[0].tolist() == [-1]  # 11 % dearer
    assert explorations(job, tpc, near, untried, 0.12, 1)[0].tolist() == [1]


def test_never_measured_needs_neither_the_lineage_nor_the_model_type_on_the_type() -> None:
    frame = {
        "self_count": np.array([np.nan, 2.0, np.nan, 0.0]),
        "agg_cand_count": np.array([np.nan, np.nan, 5.0, 0.0]),
    }
    assert never_measured(frame).tolist() == [True, False, False, True]
