"""Pair levels: a (model type × hardware) level apart from the lineages that ran on the pair,
and the weight its move gets."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import pandas as pd
import pytest

from leap_stream.core.predictor.pair_levels import (
    BLEND_LINEAGES,
    blended_move,
    fit_pair_levels,
)
from leap_stream.core.predictor.pairs import without_types

TYPES = {"h0": "nvidia", "h1": "nvidia", "h2": "amd"}


def _fleet(seed: int = 0) -> tuple[pd.DataFrame, np.ndarray, np.ndarray, dict[str, float]]:
    """Rows of 600 lineages of 4 model types; the faster a lineage (its own level u), the
    likelier it ran on h0, so a pair's plain mean carries its lineages' levels."""
    rng = np.random.default_rng(seed)
    truth = {f"m{m}|{h}": float(rng.normal(0, 0.3)) for m in range(4) for h in TYPES}
    rows = []
    for lin in range(600):
        mt, u = f"m{lin % 4}", rng.normal(0, 0.5)
        first = "h0" if u > 0 else "h1"
        for h in (first, str(rng.choice(["h1", "h2"] if first == "h0" else ["h0", "h2"]))):
            for _ in range(3):
                r = truth[f"{mt}|{h}"] + u + rng.normal(0, 0.05)
                rows.append((mt, h, TYPES[h], f"l{lin}", r))
    df = pd.DataFrame(rows, columns=["model_type", "hardware_type", "vendor", "lineage", "r"])
    return df, df["lineage"].to_numpy(object), df["r"].to_numpy(), truth


def _moves(levels: Mapping[Any, float]) -> np.ndarray:
    return np.asarray([levels[f"m{m}|h0"] - levels[f"m{m}|h1"] for m in range(4)])


def test_levels_separate_a_pair_from_the_lineages_that_ran_on_it() -> None:
    df, lineages, r, truth = _fleet()
    got = fit_pair_levels(df, lineages, r, np.ones(len(df), bool))
    assert set(got) == set(truth)
    plain = df.groupby(df["model_type"] + "|" + df["hardware_type"])["r"].mean().to_dict()
    err_levels = np.abs(_moves({k: v[0] for k, v in got.items()}) - _moves(truth))
    err_plain = np.abs(_moves(plain) - _moves(truth))
    assert err_plain.min() > 0.2, err_plain  # the plain means carry the selection
    # what is left is the shrinkage: a lineage's 6 rows, 3 pseudo-rows, a third of u stays
    assert np.all(err_levels < 0.4 * err_plain), (err_levels, err_plain)
    seen = df.groupby(df["model_type"] + "|" + df["hardware_type"])["lineage"].nunique()
    assert {k: int(v[1]) for k, v in got.items()} == seen.to_dict()


def test_levels_are_fitted_on_the_rows_given_only() -> None:
    df, lineages, r, _truth = _fleet()
    rows = (df["hardware_type"] != "h2").to_numpy()
    got = fit_pair_levels(df, lineages, r, rows)
    assert {k.split("|")[1] for k in got} == {"h0", "h1"}
    assert without_types(got, ["h1"]) == {k: v for k, v in got.items() if k.endswith("|h0")}


def test_the_levels_move_weighs_by_the_lineages_behind_it() -> None:
    model, roof, level = np.full(5, 0.2), np.full(5, 0.5), np.full(5, 0.1)
    lineages = np.asarray([0.0, BLEND_LINEAGES, BLEND_LINEAGES, 1e9, 1e9])
    same = np.asarray([True, True, False, True, False])
    got = blended_move(model, roof, level, lineages, same)
    # unseen pair and another device count: the model's; half-way at BLEND_LINEAGES
    assert got == pytest.approx([0.2, 0.4, 0.2, 0.6, 0.2])
