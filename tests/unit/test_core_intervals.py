"""The one interval calibration (core/intervals.py) on residuals whose scale is known."""

from __future__ import annotations

import numpy as np
import pytest

from leap_stream.core.intervals import (
    BINS,
    calibration_bin,
    fit_calibration,
    offsets,
    scale_terms,
    sigma,
)


def _rows(n: int, seed: int = 0) -> dict[str, np.ndarray]:
    """``n`` rows per (family × anchor kind): family "wide" has the scale of "plain" on its own
    prior and twice it off it (a transfer, a blind estimate)."""
    rng = np.random.default_rng(seed)
    family = np.repeat(np.asarray(["plain", "wide"] * 3), n)
    kind = np.repeat(np.asarray([0, 0, 1, 1, 2, 2]), n)
    scale = np.where(kind == 0, 0.1, 0.3) * np.where((family == "wide") & (kind != 0), 2.0, 1.0)
    zeros = np.zeros(len(kind), bool)
    terms = scale_terms(kind, np.zeros(len(kind)), zeros, zeros, zeros, zeros)
    return {
        "resid": rng.normal(0.0, 1.0, len(kind)) * scale,
        "terms": terms,
        "hw": np.full(len(kind), "h100"),
        "family": family,
        "bins": calibration_bin(kind, zeros),
    }


def test_a_family_wider_off_its_own_prior_gets_the_width_there_only() -> None:
    r = _rows(4000)
    cal = fit_calibration(r["resid"], r["terms"], r["hw"], r["family"], r["bins"], set())
    s = sigma(cal, r["terms"], offsets(cal, r["hw"], r["family"], r["terms"]))
    wide, own = r["family"] == "wide", r["bins"] < BINS.index("transfer|known")
    moved = ~own
    # σ's ratio wide / plain: 1 on an own prior, 2 off it (ridge shrinkage costs a little)
    assert np.median(s[wide & own]) / np.median(s[~wide & own]) == pytest.approx(1.0, abs=0.05)
    assert np.median(s[wide & moved]) / np.median(s[~wide & moved]) == pytest.approx(2.0, rel=0.05)
    # so each family holds the level off its own prior, not the two families' average
    lo, hi = np.asarray(cal["quantiles"]["transfer|known"])
    z = r["resid"] / s
    for fam in (wide, ~wide):
        rows = fam & (r["bins"] == BINS.index("transfer|known"))
        assert np.mean((z[rows] >= lo) & (z[rows] <= hi)) == pytest.approx(0.8, abs=0.03)


def test_a_family_the_calibration_never_saw_takes_the_fleets_coefficients() -> None:
    r = _rows(500)
    cal = fit_calibration(r["resid"], r["terms"], r["hw"], r["family"], r["bins"], set())
    fleet = sigma(cal, r["terms"], np.zeros(len(r["resid"])))
    new = offsets(cal, r["hw"], np.full(len(r["resid"]), "unseen"), r["terms"])
    assert (new == 0.0).all() and np.isfinite(fleet).all()
    old = {k: v for k, v in cal.items() if k != "by_family_term"}  # fitted before the shifts
    plain = offsets(old, r["hw"], r["family"], r["terms"])  # type: ignore[arg-type]
    assert np.array_equal(
        plain, offsets({**cal, "by_family_term": {}}, r["hw"], r["family"], r["terms"])
    )
