"""ThroughputModel: learns from history, intervals calibrated, text artefact round trip."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from leap_stream.core import features as F
from leap_stream.core.predictor import ThroughputModel
from leap_stream.train import pit
from leap_stream.train import synthetic as S


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
    d = model.save(tmp_path / "m")
    assert sorted(p.name for p in d.iterdir()) == ["metadata.json", "model.txt"]
    assert (d / "model.txt").read_text().startswith("tree")
    again = ThroughputModel.load(d)
    assert again.version == model.version
    assert again.metadata["data_window"] == ["a", "b"]
    a = model.predict(fr.iloc[:500])
    b = again.predict(fr.iloc[:500])
    for x, z in zip(a, b, strict=True):
        np.testing.assert_allclose(x, z)
    assert np.all(a[1] <= a[0]) and np.all(a[0] <= a[2])


def test_unseen_categories_predict_finite(data: tuple[pd.DataFrame, pd.DataFrame]) -> None:
    m, fr = data
    model = ThroughputModel.fit(fr, m["samples_per_s"].to_numpy(), m["lineage_id"], num_rounds=20)
    odd = fr.iloc[:3].copy()
    odd["model_type"] = "never-seen"
    p, lo, hi = model.predict(odd)
    assert np.isfinite(p).all() and (p > 0).all()
    assert (lo <= p).all() and (p <= hi).all()
