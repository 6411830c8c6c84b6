"""ThroughputModel: learns from history, intervals calibrated, text artefact round trip."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from leap_stream.core import features as F
from leap_stream.core.predictor import KINDS, ThroughputModel, anchor_kind, holdout_mask
from leap_stream.core.predictor import ratio as ratio_module
from leap_stream.core.predictor.type_pairs import TypePairEffects
from leap_stream.store.artefact import read_model, write_model
from leap_stream.tools import synthetic_rows as S
from leap_stream.train import pit


@pytest.fixture(autouse=True)
def trees_on_few_model_types(monkeypatch: pytest.MonkeyPatch) -> None:
    """The fixture's six model types stand for a fleet's hundreds: the ratio model's trees
    form (the effects form on few model types has its own test)."""
    monkeypatch.setattr(ratio_module, "RATIO_MIN_MODEL_TYPES", 2)


@pytest.fixture(scope="module")
def data() -> tuple[pd.DataFrame, pd.DataFrame]:
    d = S.dataset(8000, seed=11)
    m = pit.measured(d)
    snap = pit.replay(d, m)
    fr = F.build(
        m, [[h] for h in m["hardware_type"]], snap.histories, snap.aggregates, S.SPECS, snap.now
    )
    return m, fr


def _split(m: pd.DataFrame) -> np.ndarray:
    return np.asarray(m["submitted_at"] < m["submitted_at"].quantile(0.8))


def test_model_learns_and_history_helps(data: tuple[pd.DataFrame, pd.DataFrame]) -> None:
    m, fr = data
    tr = _split(m)
    y = m["samples_per_s"].to_numpy()
    full = ThroughputModel.fit(fr[tr], y[tr], m["lineage_id"][tr], num_rounds=150)
    blind = ThroughputModel.fit(
        fr[tr], y[tr], m["lineage_id"][tr], groups=["config", "specs"], num_rounds=150
    )
    p_full, lo, hi = full.predict(fr[~tr])
    p_blind, _, _ = blind.predict(fr[~tr])
    ape_full = np.abs(p_full / y[~tr] - 1)
    ape_blind = np.abs(p_blind / y[~tr] - 1)
    assert np.median(ape_full) < 0.10
    assert np.median(ape_full) < 0.5 * np.median(ape_blind)  # the lineage prior is what matters
    assert "self_log_pd" not in blind.feature_names
    cover = np.mean((y[~tr] >= lo) & (y[~tr] <= hi))
    assert 0.6 < cover < 0.95  # nominal 0.8; held out in time, so roughly


def test_save_load_round_trip_is_text_and_identical(
    data: tuple[pd.DataFrame, pd.DataFrame], tmp_path: Path
) -> None:
    m, fr = data
    model = ThroughputModel.fit(
        fr, m["samples_per_s"].to_numpy(), m["lineage_id"], num_rounds=30, data_window=("a", "b")
    )
    assert model.ratio is not None  # the fixture has lineages measured on two types
    d = write_model(tmp_path / "m", model)
    assert sorted(p.name for p in d.iterdir()) == ["metadata.json", "model.txt", "ratio_model.txt"]
    assert (d / "model.txt").read_text().startswith("tree")
    again = read_model(d)
    assert again.ratio is not None
    assert again.version == model.version
    assert again.metadata["data_window"] == ["a", "b"]
    assert again.metadata["pair_levels"] == model.metadata["pair_levels"] != {}
    a = model.predict(fr.iloc[:500])
    b = again.predict(fr.iloc[:500])
    for x, z in zip(a, b, strict=True):
        np.testing.assert_allclose(x, z)
    assert np.all(a[1] <= a[0]) and np.all(a[0] <= a[2])


def test_each_held_out_row_calibrates_only_the_anchor_kind_it_had(
    data: tuple[pd.DataFrame, pd.DataFrame],
) -> None:
    """A row with its own prior was chosen on what a transfer from elsewhere did not know: it
    calibrates the self anchor alone, never the transfer or model ones (decision 0017)."""
    m, fr = data
    y = m["samples_per_s"].to_numpy()
    model = ThroughputModel.fit(fr, y, m["lineage_id"], num_rounds=30)
    held = fr.loc[holdout_mask(m["lineage_id"], 0.15, 0)]
    kind = anchor_kind(held, model.groups)
    metrics = model.metadata["metrics"]
    by_kind = metrics["calib_rows_by_kind"]
    assert sum(by_kind.values()) == metrics["calib_rows"] == len(held)
    assert [by_kind[k] for k in KINDS] == [int((kind == i).sum()) for i in range(len(KINDS))]
    assert min(by_kind.values()) > 0  # the fixture has every kind


def test_unseen_categories_predict_finite(data: tuple[pd.DataFrame, pd.DataFrame]) -> None:
    m, fr = data
    model = ThroughputModel.fit(fr, m["samples_per_s"].to_numpy(), m["lineage_id"], num_rounds=20)
    odd = fr.iloc[:3].copy()
    odd["model_type"] = "never-seen"
    p, lo, hi = model.predict(odd)
    assert np.isfinite(p).all() and (p > 0).all()
    assert (lo <= p).all() and (p <= hi).all()


def test_self_rows_skip_the_booster_and_keep_their_estimates(
    data: tuple[pd.DataFrame, pd.DataFrame], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Serving scores only the rows that need the booster; the answers are the same as
    scoring every row (the calibration path) and a batch of self rows makes no call at all."""
    m, fr = data
    y = m["samples_per_s"].to_numpy()
    model = ThroughputModel.fit(fr, y, m["lineage_id"], num_rounds=30)
    is_self = np.isfinite(fr["self_log_pd"].to_numpy())
    assert 0.05 < is_self.mean() < 0.95
    full_blind, full_moved = model._log_pd_parts(fr)
    blind, moved = model._log_pd_parts(fr, skip_self=True)
    np.testing.assert_allclose(blind[~is_self], full_blind[~is_self])
    other_only = ~is_self & np.isfinite(full_moved)
    np.testing.assert_allclose(moved[other_only], full_moved[other_only])
    assert np.isnan(blind[is_self]).all()
    calls: list[int] = []
    real = model.booster.predict

    def counting(X: np.ndarray, **kw: object) -> np.ndarray:
        calls.append(len(X))
        return np.asarray(real(X, **kw))

    monkeypatch.setattr(model.booster, "predict", counting)
    p50, _lo, _hi = model.predict(fr[is_self])
    assert calls == []
    np.testing.assert_allclose(
        p50, np.exp(fr["self_log_pd"].to_numpy()[is_self] + fr["log_devices"].to_numpy()[is_self])
    )
    model.predict(fr)
    # one call: the non-self candidate rows plus one prior-hardware row per (job, type)
    assert len(calls) == 1 and int((~is_self).sum()) <= calls[0] <= 2 * int((~is_self).sum())


def test_matrix_encodes_categoricals_per_row_on_concatenated_frames() -> None:
    """Frames from several builds repeat the `job` numbers (the backtest concatenates a day's
    rows per night): categorical codes must still follow each row, not its job number."""
    from leap_stream.core.predictor.matrix import _matrix

    d = S.dataset(400, seed=5)
    m = pit.measured(d)
    a, b = m.iloc[:100].reset_index(drop=True), m.iloc[100:200].reset_index(drop=True)
    parts = [
        F.build(
            x,
            [[h] for h in x["hardware_type"]],
            [None] * len(x),
            [None] * len(x),
            S.SPECS,
            np.full(len(x), 1.8e9),
        )
        for x in (a, b)
    ]
    cat = pd.concat(parts, ignore_index=True)
    assert (cat["job"].to_numpy()[:100] == cat["job"].to_numpy()[100:]).all()
    names = ["family", "model_type", "log_params"]
    levels = {
        "family": list(F.CATEGORIES["family"]),
        "model_type": sorted(set(cat["model_type"])),
    }
    X = _matrix(cat, names, levels)
    for i, c in enumerate(names[:2]):
        want = [levels[c].index(v) for v in cat[c]]
        np.testing.assert_array_equal(X[:, i], want)
    assert (cat["model_type"].to_numpy()[:100] != cat["model_type"].to_numpy()[100:]).any()


def test_lineage_effects_are_shrunk_means_per_lineage() -> None:
    from leap_stream.core.predictor.fit import _lineage_effects
    from leap_stream.core.predictor.params import LINEAGE_SHRINK

    ids = np.asarray(["a", "a", "b", "c", "c", "c"], object)
    resid = np.asarray([0.3, 0.1, -0.6, 0.2, 0.2, np.nan])
    u = _lineage_effects(ids, resid)
    np.testing.assert_allclose(u[:2], 0.4 / (2 + LINEAGE_SHRINK))
    np.testing.assert_allclose(u[2], -0.6 / (1 + LINEAGE_SHRINK))
    # a row without a residual (the booster did not score it: a year's sample) does not count
    np.testing.assert_allclose(u[3:], 0.4 / (2 + LINEAGE_SHRINK))


def test_ratio_model_moves_priors_better_than_the_booster_difference(
    data: tuple[pd.DataFrame, pd.DataFrame],
) -> None:
    """Held out in time, on rows whose lineage ran on another type before: the ratio model's
    transfer estimate beats f(candidate) − f(prior type) of the same main booster."""
    from leap_stream.core.predictor import KIND_TRANSFER, anchor_kind

    m, fr = data
    tr = _split(m)
    y = m["samples_per_s"].to_numpy()
    model = ThroughputModel.fit(fr[tr], y[tr], m["lineage_id"][tr])
    assert model.ratio is not None
    meta = {k: v for k, v in model.metadata.items() if not k.startswith("ratio_")}
    difference_only = ThroughputModel(model.booster, meta)  # type: ignore[arg-type]
    test = fr[~tr].reset_index(drop=True)
    rows = anchor_kind(test, model.groups) == KIND_TRANSFER
    assert rows.sum() > 100
    truth = np.log(y[~tr][rows]) - test["log_devices"].to_numpy()[rows]
    err = {}
    for name, mdl in (("ratio", model), ("difference", difference_only)):
        _blind, moved = mdl._log_pd_parts(test)
        err[name] = np.median(np.abs(moved[rows] - truth))
    assert err["ratio"] < err["difference"], err


def test_a_ratio_model_named_in_the_metadata_must_come_with_its_text(
    data: tuple[pd.DataFrame, pd.DataFrame],
) -> None:
    m, fr = data
    model = ThroughputModel.fit(fr, m["samples_per_s"].to_numpy(), m["lineage_id"], num_rounds=20)
    assert model.metadata.get("ratio_features")
    with pytest.raises(ValueError, match="ratio model"):
        ThroughputModel.from_text(model.model_text().encode(), model.metadata)
    with pytest.raises(ValueError, match="not a LightGBM text model"):
        ThroughputModel.from_text(model.model_text().encode(), model.metadata, b"garbage")


def test_ratio_features_see_both_types_and_the_booster_ratio() -> None:
    from leap_stream.core.predictor.params import BOOSTER_RATIO
    from leap_stream.core.predictor.ratio import ratio_features

    names = ratio_features(F.booster_features(list(F.GROUPS)))
    assert names[-1] == BOOSTER_RATIO
    for c in (
        "log_peak_tflops",
        "o_log_peak_tflops",
        "d_log_phys_rate",
        "model_type",
        "prior_residual",
    ):
        assert c in names
    assert len(names) == len(set(names))


def test_a_reversed_pair_is_the_pair_built_from_the_other_side(
    data: tuple[pd.DataFrame, pd.DataFrame],
) -> None:
    """The ratio model's reversed rows equal the rows built from a frame whose candidate and
    prior hardware columns are swapped: same job inputs, each side's hardware on the other,
    the differences and the booster's ratio negated, the candidate's residual as the prior's."""
    from leap_stream.core.predictor.params import BOOSTER_RATIO, PRIOR_RESIDUAL
    from leap_stream.core.predictor.ratio import _ratio_matrix, _reversed_pairs, ratio_features

    m, fr = data
    model = ThroughputModel.fit(fr, m["samples_per_s"].to_numpy(), m["lineage_id"], num_rounds=20)
    pf = fr[np.isfinite(fr["other_log_pd"].to_numpy())].reset_index(drop=True)
    assert len(pf) > 100
    names = ratio_features(model.feature_names)
    booster_ratio = np.linspace(-1.0, 1.0, len(pf))
    prior_residual = np.linspace(0.5, -0.5, len(pf))
    own_residual = np.linspace(-0.2, 0.3, len(pf))
    levels, luts = model._levels, model._luts
    derived = {BOOSTER_RATIO: booster_ratio, PRIOR_RESIDUAL: prior_residual}
    X = _ratio_matrix(pf, names, derived, levels, luts)
    swapped = pf.copy()
    for c in F.HW_COLUMNS:
        if "o_" + c in pf.columns:
            swapped[c], swapped["o_" + c] = pf["o_" + c], pf[c]
    derived_back = {BOOSTER_RATIO: -booster_ratio, PRIOR_RESIDUAL: own_residual}
    want = _ratio_matrix(swapped, names, derived_back, levels, luts)
    np.testing.assert_array_equal(_reversed_pairs(X, names, own_residual), want)
    hw = names.index("hardware_type")
    assert not np.array_equal(X[:, hw], want[:, hw], equal_nan=True)  # the swap did something


def test_the_ratio_model_fits_every_pair_up_to_a_cap() -> None:
    from leap_stream.core.predictor.params import RATIO_PAIRS
    from leap_stream.core.predictor.ratio import _at_most

    rows = np.arange(0, 3 * (RATIO_PAIRS + 10), 3)
    np.testing.assert_array_equal(_at_most(rows[:5], RATIO_PAIRS, seed=0), rows[:5])
    many = _at_most(rows, RATIO_PAIRS, seed=0)
    assert len(many) == RATIO_PAIRS == len(np.unique(many))
    assert np.isin(many, rows).all() and (np.diff(many) > 0).all()


def test_the_learned_roofline_is_the_offset_and_travels_in_the_metadata(
    data: tuple[pd.DataFrame, pd.DataFrame],
) -> None:
    """The booster corrects the learned roofline's rate; a model without one (trained before
    it) corrects the fixed-efficiency physics rate."""
    from leap_stream.core.predictor.matrix import _offset
    from leap_stream.core.roofline import LearnedRoofline

    m, fr = data
    model = ThroughputModel.fit(fr, m["samples_per_s"].to_numpy(), m["lineage_id"], num_rounds=20)
    assert model.roofline is not None and "roofline" in model.metadata
    again = LearnedRoofline.from_json(model.metadata["roofline"])
    np.testing.assert_allclose(
        _offset(fr, model.groups, model.roofline), np.nan_to_num(again.predict(fr))
    )
    fixed = _offset(fr, model.groups, None)
    np.testing.assert_allclose(fixed, np.nan_to_num(fr["log_phys_rate"].to_numpy()))
    # the learned rate is closer to the measurements than the textbook one
    y = np.log(m["samples_per_s"].to_numpy()) - fr["log_devices"].to_numpy()
    learned = _offset(fr, model.groups, model.roofline)
    assert np.median(np.abs(y - learned)) < np.median(np.abs(y - fixed - np.median(y - fixed)))


def test_the_ratio_model_corrects_the_physics_ratio(
    data: tuple[pd.DataFrame, pd.DataFrame],
) -> None:
    """A transfer estimate is the prior + the physics ratio (roofline and pair effects, the
    candidate's less the prior type's) + the ratio model's correction; a model whose ratio
    model learned the whole ratio (no `ratio_base`) adds none."""
    m, fr = data
    model = ThroughputModel.fit(fr, m["samples_per_s"].to_numpy(), m["lineage_id"], num_rounds=20)
    assert model.ratio is not None and model.metadata.get("ratio_base") == "physics"
    _blind, rows, _prior_f, physics = model._booster_parts(fr)
    assert len(rows) > 100 and np.abs(physics).max() > 0.1
    # without the pair levels, which move both toward the same levels' move
    own = {k: v for k, v in model.metadata.items() if k != "pair_levels"}
    _blind, moved = ThroughputModel(model.booster, own, ratio=model.ratio)._log_pd_parts(fr)  # type: ignore[arg-type]
    whole = {k: v for k, v in own.items() if k != "ratio_base"}
    _blind, moved_whole = ThroughputModel(model.booster, whole, ratio=model.ratio)._log_pd_parts(  # type: ignore[arg-type]
        fr
    )
    np.testing.assert_allclose(moved[rows] - moved_whole[rows], physics)


def test_on_few_model_types_the_type_pair_effects_move_priors(
    data: tuple[pd.DataFrame, pd.DataFrame], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Fewer model types than `RATIO_MIN_MODEL_TYPES` among the pairs: no trees; a transfer
    estimate is the prior + the physics ratio + the type-pair effects, better than the booster
    difference held out in time, and it survives a save and load."""
    from leap_stream.core.predictor import KIND_TRANSFER, anchor_kind

    monkeypatch.setattr(ratio_module, "RATIO_MIN_MODEL_TYPES", 7)  # the fixture has 6
    m, fr = data
    tr = _split(m)
    y = m["samples_per_s"].to_numpy()
    fitted = ThroughputModel.fit(fr[tr], y[tr], m["lineage_id"][tr], num_rounds=30)
    assert fitted.ratio is None and "type_pair_effects" in fitted.metadata
    # without the pair levels, which move a transfer estimate toward their own move
    own = {k: v for k, v in fitted.metadata.items() if k != "pair_levels"}
    model = ThroughputModel(fitted.booster, own)  # type: ignore[arg-type]
    test = fr[~tr].reset_index(drop=True)
    _blind, rows, _prior_f, physics = model._booster_parts(test)
    effects = TypePairEffects.from_json(model.metadata["type_pair_effects"])
    _blind, moved = model._log_pd_parts(test)
    other = test["other_log_pd"].to_numpy()[rows]
    shift = effects.predict(effects.codes(test, rows))
    np.testing.assert_allclose(moved[rows], other + physics + shift)
    meta = {k: v for k, v in model.metadata.items() if k != "type_pair_effects"}
    difference_only = ThroughputModel(model.booster, meta)  # type: ignore[arg-type]
    kind = anchor_kind(test, model.groups) == KIND_TRANSFER
    truth = np.log(y[~tr][kind]) - test["log_devices"].to_numpy()[kind]
    err = {
        name: np.median(np.abs(mdl._log_pd_parts(test)[1][kind] - truth))
        for name, mdl in (("effects", model), ("difference", difference_only))
    }
    assert err["effects"] < err["difference"], err
    again = read_model(write_model(tmp_path / "m", model))
    np.testing.assert_allclose(again.predict(test)[0], model.predict(test)[0])


def test_without_the_jobs_work_the_type_pair_effects_move_priors(
    data: tuple[pd.DataFrame, pd.DataFrame],
) -> None:
    """Model types enough for trees (the fixture's six, here), but the pairs do not carry the
    job's work per sample (a benchmark table without its configuration): the effects form;
    with it, the trees."""
    m, fr = data
    tr = _split(m)
    y = m["samples_per_s"].to_numpy()
    with_work = ThroughputModel.fit(fr[tr], y[tr], m["lineage_id"][tr], num_rounds=30)
    assert with_work.ratio is not None and "type_pair_effects" not in with_work.metadata
    blank = fr[tr].assign(log_flops_per_sample=np.nan)
    without = ThroughputModel.fit(blank, y[tr], m["lineage_id"][tr], num_rounds=30)
    assert without.ratio is None and "type_pair_effects" in without.metadata


def test_every_lightgbm_predict_holds_the_process_lock(
    data: tuple[pd.DataFrame, pd.DataFrame],
) -> None:
    """LightGBM's predict races on one booster from two threads (the worker's batches and the
    compile thread's check); the model's LightGBM scorers and the compile check go through one
    lock."""
    from leap_stream.core.predictor import params

    m, fr = data
    model = ThroughputModel.fit(fr, m["samples_per_s"].to_numpy(), m["lineage_id"], num_rounds=5)
    seen: list[bool] = []
    for booster in filter(None, (model.booster, model.ratio)):
        inner = booster.predict

        def spy(*args: object, _inner: object = inner, **kwargs: object) -> object:
            seen.append(params._LIGHTGBM_PREDICT.locked())
            return _inner(*args, **kwargs)  # type: ignore[operator]

        booster.predict = spy  # type: ignore[method-assign]
    X = np.zeros((3, model.booster.num_feature()))
    model.score_lightgbm(X)
    if model.ratio is not None:
        model.ratio_lightgbm(np.zeros((3, model.ratio.num_feature())))
    assert seen and all(seen)


def test_pair_levels_move_only_transfer_rows_their_lineages_can_speak_for(
    data: tuple[pd.DataFrame, pd.DataFrame],
) -> None:
    """A transfer estimate moves toward the pair levels' move where both pairs had training
    lineages and the prior had the job's device count; every other row is the model's own."""
    m, fr = data
    tr = _split(m)
    model = ThroughputModel.fit(
        fr[tr], m["samples_per_s"].to_numpy()[tr], m["lineage_id"][tr], num_rounds=30
    )
    own = {k: v for k, v in model.metadata.items() if k != "pair_levels"}
    test = fr[~tr].reset_index(drop=True)
    blind, moved = model._log_pd_parts(test)
    without = ThroughputModel(model.booster, own, ratio=model.ratio)  # type: ignore[arg-type]
    blind_own, moved_own = without._log_pd_parts(test)
    np.testing.assert_array_equal(blind, blind_own)
    levels = model.metadata["pair_levels"]

    def lineages(hw_col: str) -> np.ndarray:
        keys = test["model_type"].astype(str) + "|" + test[hw_col].astype(str)
        return np.asarray([levels.get(k, [0.0, 0])[1] for k in keys], np.float64)

    prior = np.isfinite(test["other_log_pd"].to_numpy())
    spoken = (
        prior
        & (np.minimum(lineages("hardware_type"), lineages("o_hardware_type")) > 0)
        & (test["other_log_dev_ratio"].to_numpy() == 0)
    )
    assert spoken.sum() > 50
    changed = ~np.isclose(moved, moved_own, equal_nan=True)
    assert not changed[~spoken].any()
    assert changed[spoken].mean() > 0.9
