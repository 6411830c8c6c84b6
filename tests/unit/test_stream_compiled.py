"""Compiled trees (LEAP_COMPILED_TREES): identical to LightGBM or not used at all."""

from __future__ import annotations

from datetime import UTC, datetime
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from prometheus_client import generate_latest

from leap_stream.catalog import load_catalog
from leap_stream.core.predictor import ThroughputModel
from leap_stream.store.artefact import write_model
from leap_stream.store.registry import Registry
from leap_stream.stream import compiled as C
from leap_stream.stream.metrics import Metrics
from leap_stream.stream.models import RankerHolder
from leap_stream.tools.sim.config import SimConfig, SimResult
from leap_stream.tools.sim.events import submission_events
from leap_stream.tools.sim.fleet import simulate
from leap_stream.train.trainer import TrainingRows, fit, training_rows

pytest.importorskip("lleaves")  # the `compiled` extra is in the dev extras (Python < 3.13)

NOW = datetime(2026, 11, 2, tzinfo=UTC)


@cache
def _sim() -> SimResult:
    # enough days for lineages measured on two types: the model then has a ratio model
    return simulate(SimConfig(seed=4, days=4, rate=2000))


@cache
def _rows() -> TrainingRows:
    return training_rows(_sim().dataset)


@cache
def _model() -> ThroughputModel:
    return fit(_rows(), num_rounds=12)


def test_compiled_trees_give_lightgbm_output_bit_for_bit() -> None:
    model = _model()
    fast = C.compiled_model(model)
    assert fast.scorer_kind == C.KIND and model.scorer_kind == "lightgbm"
    assert model.ratio is not None  # the ratio model is compiled and checked too
    assert fast.ratio_score != fast.ratio_lightgbm
    frame = _rows().frame
    for want, got in zip(model.predict(frame), fast.predict(frame), strict=True):
        assert np.array_equal(want, got, equal_nan=True)


def test_compiled_ratio_model_gives_lightgbm_output_bit_for_bit() -> None:
    model = _model()
    X = C.probe_matrix(model, ratio=True)
    assert X.shape[1] == len(model.ratio_features)
    score = C.compile_scorer(model, ratio=True)
    assert np.array_equal(score(X), model.ratio_lightgbm(X), equal_nan=True)


def test_probe_rows_take_both_sides_of_every_numeric_split() -> None:
    model = _model()
    X = C.probe_matrix(model)
    stack = [t["tree_structure"] for t in model.booster.dump_model()["tree_info"]]
    checked = 0
    while stack:
        node = stack.pop()
        if "split_feature" not in node:
            continue
        stack += [node["left_child"], node["right_child"]]
        if node["decision_type"] != "<=":
            continue
        col = X[:, int(node["split_feature"])]
        assert (col <= node["threshold"]).any() and (col > node["threshold"]).any()
        checked += 1
    assert checked > 50


def test_trees_that_disagree_with_lightgbm_are_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    import lleaves

    original = lleaves.Model.predict

    def off_by_a_little(self: Any, data: np.ndarray, n_jobs: int | None = None) -> np.ndarray:
        return np.asarray(original(self, data, n_jobs=n_jobs)) + 1e-12

    monkeypatch.setattr(lleaves.Model, "predict", off_by_a_little)
    with pytest.raises(C.CompileError, match="differ from LightGBM"):
        C.compile_scorer(_model())


def _holder(tmp_path: Path, compile_trees: bool) -> tuple[RankerHolder, Metrics]:
    reg = Registry(tmp_path / "registry")
    d = write_model(tmp_path / "build", _model())
    reg.promote(reg.publish(d))
    m = Metrics()
    return RankerHolder(load_catalog(), reg, m, compile_trees=compile_trees), m


def _rank(holder: RankerHolder) -> list[dict[str, Any]]:
    subs = submission_events(_sim().submissions)[:40]
    return holder.get().rank_batch(subs, [None] * len(subs), {}, NOW)


def test_holder_swaps_in_compiled_trees_with_the_same_rankings(tmp_path: Path) -> None:
    plain, _ = _holder(tmp_path / "a", compile_trees=False)
    holder, m = _holder(tmp_path / "b", compile_trees=True)
    assert plain.poll() and holder.poll()
    assert holder.wait_compiled(60) is True
    assert plain.wait_compiled(0) is False
    assert "leap_model_compiled 1.0" in generate_latest(m.registry).decode()
    assert _rank(holder) == _rank(plain)


def test_holder_keeps_lightgbm_when_compiling_fails(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(model: ThroughputModel) -> ThroughputModel:
        raise C.CompileError("no LLVM today")

    monkeypatch.setattr(C, "compiled_model", broken)
    holder, m = _holder(tmp_path, compile_trees=True)
    assert holder.poll()
    assert holder.wait_compiled(60) is False
    text = generate_latest(m.registry).decode()
    assert "leap_model_compile_failures_total 1.0" in text
    assert "leap_model_compiled 0.0" in text
    assert {r["source"] for r in _rank(holder)} == {"model"}


def test_the_setting_auto_follows_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    from leap_stream.settings import Settings

    def setting(raw: str | None) -> str:
        return Settings.from_env({} if raw is None else {"LEAP_COMPILED_TREES": raw}).compiled_trees

    assert C.wanted(setting(None))  # auto, and the extra is installed here
    monkeypatch.setattr(C, "available", lambda: False)
    assert not C.wanted(setting(None))  # auto without the extra: LightGBM
    assert C.wanted(setting("1"))  # asked for: a missing extra becomes a counted compile failure
    assert not C.wanted(setting("0"))
    with pytest.raises(ValueError, match="'auto', '1', '0'"):
        setting("yes")


def _digest(model: ThroughputModel) -> tuple[str, str | None, str]:
    """What a fit produced, apart from its version stamp: both boosters and the metadata."""
    import orjson

    meta = {k: v for k, v in model.metadata.items() if k not in ("version", "trained_at")}
    ratio = model.ratio.model_to_string() if model.ratio is not None else None
    opts = orjson.OPT_SORT_KEYS | orjson.OPT_SERIALIZE_NUMPY
    return model.booster.model_to_string(), ratio, orjson.dumps(meta, option=opts).decode()


def test_a_fit_scoring_with_compiled_trees_gives_the_same_model(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`train` on millions of rows scores its own boosters with compiled trees: the model must
    be exactly the one LightGBM's predict gives (boosters, effects, intervals, metrics)."""
    from leap_stream.train import trainer

    monkeypatch.setattr(trainer, "COMPILE_MIN_ROWS", 0)
    scored: list[int] = []

    def counting(booster: Any, categories: Any) -> Any:
        score = C.fit_scorer(booster, categories)
        assert score is not None

        def counted(X: np.ndarray) -> np.ndarray:
            scored.append(len(X))
            return score(X)

        return counted

    with_compiled = fit(_rows(), num_rounds=12, compile_trees=counting)
    assert sum(scored) >= len(_rows().y)  # the lineage effects alone score every row
    assert with_compiled.scorer_kind == "lightgbm"  # what it returns serves as loaded
    assert _digest(with_compiled) == _digest(_model())


def test_a_fit_below_the_row_threshold_does_not_compile() -> None:
    asked: list[Any] = []
    fit(_rows(), num_rounds=12, compile_trees=lambda b, c: asked.append(b))
    assert asked == []  # a few thousand rows: compiling would cost more than it saves


def test_a_compiled_booster_scores_any_matrix_in_chunks(monkeypatch: pytest.MonkeyPatch) -> None:
    """A training matrix (float32, millions of rows) is converted a chunk at a time."""
    model = _model()
    monkeypatch.setattr(C, "SCORE_CHUNK", 1000)
    booster = model.booster
    score = C.compile_booster(booster, booster.feature_name(), model.metadata["categories"])
    X = C.probe_matrix(model, rows=4500, seed=3).astype(np.float32)
    want = booster.predict(X)
    assert np.array_equal(score(X), want, equal_nan=True)


def test_training_scores_with_lightgbm_when_compiling_fails(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def broken(*_a: Any, **_k: Any) -> Any:
        raise C.CompileError("no LLVM here")

    monkeypatch.setattr(C, "compile_booster", broken)
    assert C.fit_scorer(_model().booster, {}) is None
    assert "no LLVM here" in caplog.text
