"""Type-pair effects: a device exponent, then shrunk medians vendor pair → type pair →
family × type pair; pure arrays."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from leap_stream.core.predictor.matrix import _offset
from leap_stream.core.predictor.type_pairs import (
    LEVELS,
    PairCodes,
    TypePairEffects,
    _weighted_medians,
    shrunk_medians,
)

TYPES = ["a", "b", "c"]
VENDORS = ["nvidia", "amd"]
FAMILIES = ["dense_llm", "vision_cnn"]
VENDOR_OF = {0: 0, 1: 0, 2: 1}  # a, b: nvidia; c: amd


def _codes(
    pairs: list[tuple[int, int, int]],
    dev: list[float] | None = None,
    flops: list[float] | None = None,
) -> PairCodes:
    cand = np.asarray([c for c, _p, _f in pairs])
    prior = np.asarray([p for _c, p, _f in pairs])

    def values(x: list[float] | None) -> np.ndarray:
        return np.zeros(len(pairs)) if x is None else np.asarray(x, np.float64)

    return PairCodes(
        cand,
        prior,
        np.asarray([VENDOR_OF.get(int(c), -1) for c in cand]),
        np.asarray([VENDOR_OF.get(int(p), -1) for p in prior]),
        np.asarray([f for _c, _p, f in pairs]),
        values(dev),
        values(flops),
        np.zeros(len(pairs)),
    )


def _empty() -> TypePairEffects:
    return TypePairEffects.levels_of(TYPES, VENDORS, FAMILIES)


def test_shrunk_medians_ignore_nan_and_shrink_by_count() -> None:
    keys = np.asarray([3, 3, 3, 7, 7])
    values = np.asarray([0.1, 0.3, np.nan, -0.2, 0.6])
    uniq, effects = shrunk_medians(keys, values, 2.0)
    assert uniq.tolist() == [3, 7]
    np.testing.assert_allclose(effects, [0.2 * 2 / 4, 0.2 * 2 / 4])


def test_a_pair_measured_often_carries_its_effect_and_an_unseen_one_its_parents() -> None:
    """a → b moves +0.4 beyond physics 200 times: the levels together give ~0.4. b → a (the
    same vendor pair, never measured) gets about the vendor pair's share, and a → c (another
    vendor pair, never measured) nothing."""
    effects = _empty().fit(np.full(200, 0.4), _codes([(1, 0, 0)] * 200))
    got = effects.predict(_codes([(1, 0, 0), (0, 1, 0), (2, 0, 0)]))
    assert got[0] == pytest.approx(0.4, abs=0.01)
    vendor_share = 0.4 * 200 / (200 + LEVELS[0][1])
    assert got[1] == pytest.approx(vendor_share, abs=0.01)
    assert got[2] == pytest.approx(0.0, abs=0.01)


def test_a_pair_never_measured_moves_by_the_types_efficiencies() -> None:
    """Three types of one vendor, each e above physics (a +0.2, b 0, d −0.2), measured only
    as a ↔ b and b ↔ d: a → d, never measured, moves by about e(d) − e(a) = −0.4, where type
    pairs alone would leave it on physics; a type never seen moves from a known one by minus
    that one's efficiency."""
    levels = TypePairEffects.levels_of(["a", "b", "d"], ["nvidia"], ["dense_llm"])
    e = np.array([0.2, 0.0, -0.2])
    pairs = [(0, 1), (1, 0), (1, 2), (2, 1)] * 50
    cand, prior = np.array([c for c, _p in pairs]), np.array([p for _c, p in pairs])

    def codes(c: np.ndarray, p: np.ndarray) -> PairCodes:
        zeros = np.zeros(len(c))
        return PairCodes(
            c, p, zeros.astype(int), zeros.astype(int), zeros.astype(int), zeros, zeros, zeros
        )

    effects = levels.fit(e[cand] - e[prior], codes(cand, prior))
    np.testing.assert_allclose(effects.predict(codes(cand, prior)), e[cand] - e[prior], atol=0.02)
    a_to_d, d_to_a, new_from_a = effects.predict(codes(np.array([2, 0, -1]), np.array([0, 2, 0])))
    assert a_to_d == pytest.approx(-0.4, abs=0.03)
    assert d_to_a == pytest.approx(0.4, abs=0.03)
    assert new_from_a == pytest.approx(-0.2, abs=0.02)


def test_unknown_levels_look_up_the_padding_and_it_stays_zero() -> None:
    """Codes -1 (a type, vendor or family the model never saw) are fitted into nothing and
    predict 0."""
    effects = _empty().fit(np.full(50, 0.3), _codes([(-1, -1, -1)] * 50))
    assert effects.predict(_codes([(-1, -1, -1), (-1, 0, 1)])).tolist() == [0.0, 0.0]


def test_the_device_exponent_is_learned_before_the_levels() -> None:
    """Per-device rate ∝ (devices ratio)^-0.3 on every pair, no type effect: the exponent
    takes it all and the levels stay near 0."""
    rng = np.random.default_rng(0)
    d = rng.choice(np.log([0.25, 0.5, 2.0, 4.0, 8.0]), 300)
    codes = _codes([(1, 0, 0)] * 300, list(d))
    effects = _empty().fit(-0.3 * d, codes)
    assert effects.device_exponent == pytest.approx(-0.3)
    np.testing.assert_allclose(effects.predict(codes), -0.3 * d, atol=1e-9)


def test_a_slope_in_the_flops_ratio_is_learned_where_physics_misses_it() -> None:
    """Jobs gain 0.3 × log(FLOP/s ratio) more than physics says on every type pair: the slope
    takes it, whatever the pair, and a pair never measured gets it too."""
    rng = np.random.default_rng(1)
    d = rng.uniform(-1.0, 1.0, 400)
    pairs = [(int(c), int(p), 0) for c, p in rng.choice([(0, 1), (1, 0), (2, 0)], 400)]
    effects = _empty().fit(0.3 * d, _codes(pairs, flops=list(d)))
    assert effects.flops_slope == pytest.approx(0.3)
    assert effects.predict(_codes([(2, 1, 1)], flops=[0.5]))[0] == pytest.approx(0.15)


def test_reversed_pairs_see_the_inverse_and_json_round_trips() -> None:
    codes = _codes([(1, 0, 0)] * 40, [np.log(2.0)] * 40)
    both = codes.stacked(codes.reversed())
    target = np.concatenate([np.full(40, 0.5), np.full(40, -0.5)])
    effects = _empty().fit(target, both)
    fwd, back = effects.predict(_codes([(1, 0, 0), (0, 1, 0)], [0.0, 0.0]))
    assert fwd == pytest.approx(-back)
    again = TypePairEffects.from_json(effects.to_json())
    np.testing.assert_allclose(again.predict(both), effects.predict(both), atol=1e-5)


def test_without_a_configuration_physics_is_the_datasheets_geometric_mean() -> None:
    """The offset a type-pair effect corrects: the learned (here fixed) roofline where the
    job's work is known, else ½ log peak FLOP/s + ½ log bandwidth, else 0 (no specs)."""
    frame = pd.DataFrame(
        {
            "log_phys_rate": [np.nan, 2.0, np.nan],
            "log_peak_tflops": [np.log(400.0), np.log(400.0), np.nan],
            "log_mem_bw": [np.log(1600.0), np.log(1600.0), np.nan],
        }
    )
    got = _offset(frame, ["config", "specs"], None)
    np.testing.assert_allclose(got, [np.log(800.0), 2.0, 0.0])


def test_the_shrinkage_is_chosen_by_predicting_each_lineage_from_the_others() -> None:
    """Where half the lineages move a → b by +0.5 and half by −0.5, the pair's median over the
    other lineages points the wrong way for each held-out one: predicting each lineage from the
    others, the slopes alone (no levels) win and the fit keeps them. Where every lineage moves
    by the same +0.4, the levels carry it: the first scale stays. Without lineages the scale
    is 1."""
    rng = np.random.default_rng(3)
    n = 400
    pairs = [(1, 0, 0)] * n
    lineages = np.repeat(np.arange(8), n // 8)
    noise = np.where(lineages % 2 == 0, 0.5, -0.5) + rng.normal(0.0, 0.02, n)
    shared = 0.4 + rng.normal(0.0, 0.02, n)
    lineages = lineages.astype(str)

    noisy = _empty().fit(noise, _codes(pairs), lineages)
    assert noisy.shrink_scale > 1.0
    assert abs(float(noisy.predict(_codes([(1, 0, 0)]))[0])) < 0.1

    real = _empty().fit(shared, _codes(pairs), lineages)
    assert real.shrink_scale == 1.0
    assert float(real.predict(_codes([(1, 0, 0)]))[0]) == pytest.approx(0.4, abs=0.05)

    assert _empty().fit(noise, _codes(pairs)).shrink_scale == 1.0
    again = TypePairEffects.from_json(noisy.to_json())
    assert again.shrink_scale == noisy.shrink_scale


def test_weighted_medians_split_evenly_at_the_middle_and_follow_the_weight() -> None:
    got = _weighted_medians(
        np.array([0, 0, 1, 1, 1]),
        np.array([3.0, 1.0, 5.0, 10.0, 6.0]),
        np.array([1.0, 1.0, 1.0, 5.0, 1.0]),
        3,
    )
    assert got.tolist() == [2.0, 10.0, 0.0]


def test_slopes_one_big_lineage_alone_wants_stay_at_zero_for_the_others() -> None:
    """One lineage with 1,500 pairs moves 0.3 × log(FLOP/s ratio) beyond physics; 20 lineages of
    30 pairs each move by physics alone. Pooled, the slope follows the big lineage; predicting
    each fold of lineages from the others, the slopes held at 0 win, and the fit keeps them
    there."""
    rng = np.random.default_rng(3)
    n_big, n_small, k = 1500, 20, 30
    d = rng.uniform(-1.0, 1.0, n_big + n_small * k)
    resid = np.where(np.arange(len(d)) < n_big, 0.3 * d, 0.0) + rng.normal(0.0, 0.01, len(d))
    groups = np.array(["big"] * n_big + [f"l{i // k}" for i in range(n_small * k)], object)
    codes = _codes([(1, 0, 0)] * len(d), flops=list(d))
    assert _empty().fit(resid, codes).flops_slope == pytest.approx(0.3)
    assert _empty().fit(resid, codes, groups).flops_slope == 0.0


def test_the_inner_choice_reads_a_share_of_whole_lineages_past_its_row_cap(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Past `INNER_ROWS` pairs the choice reads a seeded share of the lineages: 40 lineages
    that all move 0.3 × log(FLOP/s ratio) still keep the slope."""
    from leap_stream.core.predictor import type_pairs

    monkeypatch.setattr(type_pairs, "INNER_ROWS", 300)
    rng = np.random.default_rng(4)
    d = rng.uniform(-1.0, 1.0, 40 * 30)
    groups = np.array([f"l{i // 30}" for i in range(len(d))], object)
    effects = _empty().fit(0.3 * d, _codes([(1, 0, 0)] * len(d), flops=list(d)), groups)
    assert effects.flops_slope == pytest.approx(0.3)


def test_effects_saved_before_the_efficiencies_load_with_none() -> None:
    """Metadata without `type_efficiency` (a model fitted before it) loads with zeros: its
    predictions are its levels' alone."""
    codes = _codes([(1, 0, 0), (0, 1, 0), (2, 1, 1)] * 30)
    fitted = _empty().fit(np.tile([0.3, -0.3, 0.1], 30), codes)
    doc = fitted.to_json()
    del doc["type_efficiency"]
    old = TypePairEffects.from_json(doc)
    assert not old.type_efficiency.any() and old.type_efficiency.shape == (len(TYPES) + 1,)
    again = TypePairEffects.from_json(fitted.to_json())
    assert np.abs(again.predict(codes) - fitted.predict(codes)).max() < 1e-5


def _family_pairs(effect_of: dict[int, float], family_of: dict[int, int], per: int = 40):
    """Pairs a → b of model types `effect_of` (each its own move beyond physics), `per` of
    each in 8 lineages, with their families; (residual, codes, lineages, model types)."""
    rng = np.random.default_rng(5)
    mts = np.repeat(list(effect_of), per)
    resid = np.array([effect_of[m] for m in mts]) + rng.normal(0.0, 0.02, len(mts))
    codes = _codes([(1, 0, family_of[int(m)]) for m in mts])
    lineages = np.array([f"m{m}-l{i % 8}" for i, m in enumerate(mts)], object)
    return resid, codes, lineages, mts.astype(str).astype(object)


def test_the_family_level_is_fitted_where_held_out_model_types_gain_from_it() -> None:
    """Three model types of each family move a → b alike (+0.4 and −0.4): a model type held
    out is predicted by its family's others, so a new model type gets the family level."""
    effects = {0: 0.4, 1: 0.4, 2: 0.4, 3: -0.4, 4: -0.4, 5: -0.4}
    resid, codes, lineages, mts = _family_pairs(effects, {m: int(m >= 3) for m in effects})
    fitted = _empty().fit(resid, codes, lineages, mts)
    assert fitted.family_for_new
    new = np.ones(2, bool)
    got = fitted.predict(_codes([(1, 0, 0), (1, 0, 1)]), new)
    assert got[0] == pytest.approx(0.4, abs=0.05) and got[1] == pytest.approx(-0.4, abs=0.05)


def test_a_new_model_type_goes_without_the_family_level_where_its_family_disagrees() -> None:
    """Within each family the model types move a → b their own way (+0.5, −0.3, +0.1 …): the
    family's others say nothing of a model type held out, so a new model type goes without
    the level, a known one keeps it; without model types to judge it, every one keeps it."""
    effects = {0: 0.5, 1: -0.3, 2: 0.1, 3: -0.5, 4: 0.3, 5: -0.1}
    resid, codes, lineages, mts = _family_pairs(effects, {m: int(m >= 3) for m in effects})
    judged = _empty().fit(resid, codes, lineages, mts)
    assert not judged.family_for_new and judged.family_type_pair.any()
    pair = _codes([(1, 0, 0)])
    level = judged.family_type_pair[0, 1, 0]
    known, new = judged.predict(pair, np.zeros(1, bool)), judged.predict(pair, np.ones(1, bool))
    assert known[0] - new[0] == pytest.approx(level)
    assert _empty().fit(resid, codes, lineages).family_for_new
    again = TypePairEffects.from_json(judged.to_json())
    assert not again.family_for_new


def test_a_new_model_type_is_one_the_effects_were_not_fitted_on() -> None:
    """The effects keep the model types of their pairs (through JSON too): a row of another
    model type is new, whatever else the model saw."""
    effects = {0: 0.5, 1: -0.3, 2: 0.1, 3: -0.5, 4: 0.3, 5: -0.1}
    resid, codes, lineages, mts = _family_pairs(effects, {m: int(m >= 3) for m in effects})
    fitted = _empty().fit(resid, codes, lineages, mts)
    assert fitted.model_types == tuple(str(m) for m in range(6))
    frame = pd.DataFrame({"model_type": ["0", "5", "9", "resnet"]})
    for e in (fitted, TypePairEffects.from_json(fitted.to_json())):
        assert e.new_model_types(frame, np.arange(4)).tolist() == [False, False, True, True]
