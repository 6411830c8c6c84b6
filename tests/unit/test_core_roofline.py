"""The learned roofline (core/roofline.py): its fit finds efficiencies that generated the data,
its Jacobian is the derivative of its rate, it travels as JSON, and a type it never measured
takes its parents' value."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from leap_stream.core.roofline import (
    SCALARS,
    TERMS,
    LearnedRoofline,
    _effects,
    _SparseJacobian,
)

TYPES = {"h100": "nvidia", "a100": "nvidia", "mi300x": "amd", "tpu": "google"}
PEAK = {"h100": 989.0, "a100": 312.0, "mi300x": 1307.0, "tpu": 459.0}  # TFLOP/s
FAMILIES = ("dense_llm", "vision_cnn", "recsys")


def _frame(n: int, seed: int) -> pd.DataFrame:
    """Jobs on types: physics times spread over decades, a few model types per family."""
    rng = np.random.default_rng(seed)
    hw = rng.choice(list(TYPES), n)
    family = rng.choice(FAMILIES, n)
    model_type = np.char.add(family.astype(str), rng.integers(0, 4, n).astype(str))
    base = rng.normal(-3.0, 1.0, n)  # log seconds per sample
    frame = pd.DataFrame(
        {
            "hardware_type": hw,
            "vendor": [TYPES[h] for h in hw],
            "family": family,
            "model_type": model_type,
            "precision": rng.choice(["bf16", "fp32"], n),
            "framework": rng.choice(["pytorch", "jax"], n),
            "log_t_compute": base + rng.normal(0.0, 0.5, n),
            "log_t_activations": base + rng.normal(-0.7, 0.5, n),
            "log_t_weights": base + rng.normal(-1.5, 0.7, n),
            "log_t_comm": base + rng.normal(-2.0, 1.0, n),
            "log_t_a2a": base + rng.normal(-1.0, 1.0, n),
            "log_ideal_micro_s": base + rng.normal(-1.0, 0.8, n),
            "log_peak_tflops": np.log([PEAK[h] for h in hw]),
            "pp_bubble": rng.choice([0.0, 0.25], n),
        }
    )
    return frame


def _truth(frame: pd.DataFrame, seed: int) -> LearnedRoofline:
    """A roofline with random efficiencies: what generated the data."""
    model = LearnedRoofline.start(_effects(frame))
    rng = np.random.default_rng(seed)
    theta = model.theta.copy()
    theta[: model._n_effects] = rng.normal(0.0, 0.3, model._n_effects)
    return LearnedRoofline(model.effects, theta)


def test_the_fit_finds_the_efficiencies_that_made_the_data() -> None:
    frame = _frame(6000, seed=1)
    truth = _truth(frame, seed=2)
    noise = np.random.default_rng(3).normal(0.0, 0.03, len(frame))
    y = truth.predict(frame) + noise
    start = LearnedRoofline.start(truth.effects).predict(frame)
    fitted = LearnedRoofline.fit(frame, y)
    test = _frame(2000, seed=4)
    err = fitted.predict(test) - truth.predict(test)
    assert np.median(np.abs(err)) < 0.05
    # and it learned something: the unfitted start is far off
    assert np.median(np.abs(start - y)) > 0.2


def test_the_jacobian_is_the_derivative_of_the_rate() -> None:
    frame = _frame(200, seed=5)
    model = _truth(frame, seed=6)
    rows = model._rows(frame, "")
    theta = model.theta + np.random.default_rng(7).normal(0.0, 0.05, len(model.theta))
    jac = _SparseJacobian(model, rows, np.zeros(0))(theta).toarray()
    numeric = np.zeros_like(jac)
    for j in range(len(theta)):
        step = np.zeros_like(theta)
        step[j] = 1e-6
        numeric[:, j] = (
            model._log_rate(rows, theta + step) - model._log_rate(rows, theta - step)
        ) / 2e-6
    assert np.max(np.abs(jac - numeric)) < 1e-6


def test_it_travels_as_json_and_rejects_a_table_of_the_wrong_size() -> None:
    frame = _frame(300, seed=8)
    model = _truth(frame, seed=9)
    doc = model.to_json()
    again = LearnedRoofline.from_json(doc)
    np.testing.assert_allclose(again.predict(frame), model.predict(frame), atol=1e-4)
    assert set(doc["constants"]) == {t.name for t in TERMS}
    assert set(doc["scalars"]) == set(SCALARS)
    key = next(iter(doc["effects"]))
    doc["effects"][key]["values"] = doc["effects"][key]["values"][:-1]
    with pytest.raises(ValueError, match="values expected"):
        LearnedRoofline.from_json(doc)


def test_a_type_never_measured_takes_its_parents_value() -> None:
    frame = _frame(400, seed=10)
    model = _truth(frame, seed=11)
    renamed = frame.assign(hardware_type=frame["hardware_type"].replace({"h100": "h200"}))
    as_new = model.predict(renamed)
    forgotten = model.without_types(["h100"]).predict(frame)
    np.testing.assert_allclose(as_new, forgotten)
    is_h100 = frame["hardware_type"].to_numpy() == "h100"
    assert not np.allclose(as_new[is_h100], model.predict(frame)[is_h100])
    np.testing.assert_allclose(as_new[~is_h100], model.predict(frame)[~is_h100])


def test_a_prior_type_reads_the_prior_side_columns() -> None:
    frame = _frame(300, seed=12)
    model = _truth(frame, seed=13)
    hw_side = [c for c in frame if c.startswith("log_") or c in ("hardware_type", "vendor")]
    swapped = frame.rename(columns={c: "o_" + c for c in hw_side})
    np.testing.assert_allclose(model.predict(swapped, "o_"), model.predict(frame))


def test_rows_without_physics_are_nan_and_not_fitted() -> None:
    frame = _frame(3000, seed=14)
    truth = _truth(frame, seed=15)
    y = truth.predict(frame)
    missing = np.zeros(len(frame), bool)
    missing[::3] = True
    holed = frame.assign(log_t_compute=np.where(missing, np.nan, frame["log_t_compute"]))
    y_bad = np.where(missing, y + 5.0, y)  # were they fitted, these would pull every rate up
    fitted = LearnedRoofline.fit(holed, y_bad)
    out = fitted.predict(holed)
    assert np.isnan(out[missing]).all()
    assert np.median(np.abs(out[~missing] - y[~missing])) < 0.05
    # no physics at all: the starting model, nothing fitted
    none = LearnedRoofline.fit(frame.assign(log_t_compute=np.nan), y)
    np.testing.assert_array_equal(none.theta, LearnedRoofline.start(none.effects).theta)


def test_a_large_frame_is_predicted_by_slices_to_the_same_rates(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import leap_stream.core.roofline as R

    frame = _frame(1000, seed=16)
    frame["hardware_type"] = frame["hardware_type"].astype("category")
    model = _truth(frame, seed=17)
    whole = model.predict(frame)
    monkeypatch.setattr(R, "PREDICT_ROWS", 128)
    np.testing.assert_array_equal(model.predict(frame), whole)
