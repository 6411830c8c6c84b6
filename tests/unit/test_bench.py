"""The bench's pure helpers: figures, ratios, pacing, candidate widening."""

from __future__ import annotations

import math

import orjson
import pytest

from leap_stream.catalog import load_catalog
from leap_stream.tools.bench.stats import (
    FINAL_KEYS,
    due,
    final_figures,
    percentile_ms,
    rate,
    widen_candidates,
)


def test_rate_and_percentiles() -> None:
    assert rate(1000, 2.0) == 500.0
    assert rate(0, 1.0) == 0.0 and rate(10, 0.0) == 0.0
    lat = [i / 1000 for i in range(1, 101)]  # 1..100 ms
    assert percentile_ms(lat, 50) == pytest.approx(50.5)
    assert percentile_ms(lat, 99) == pytest.approx(99.01)
    assert math.isnan(percentile_ms([], 50))


def test_final_figures_has_every_key_and_the_ratios() -> None:
    figs = {
        "passthrough_eps": 40000.0,
        "pipeline_eps": 10000.0,
        "worker_eps": 8000.0,
        "naive_eps": 2.5,
        "p50_ms_at_1000": 12.3456,
        "p99_ms_at_1000": float("nan"),
        "hardware_types": 27,
        "candidates_per_job": 20,
    }
    out = final_figures(figs)
    assert list(out) == [k for k in FINAL_KEYS if not k.startswith("pipeline_vs")] + [
        "pipeline_vs_passthrough",
        "pipeline_vs_naive",
    ]
    assert out["pipeline_vs_passthrough"] == 0.25
    assert out["pipeline_vs_naive"] == 4000.0
    assert out["p99_ms_at_1000"] is None  # NaN is not JSON
    assert out["p50_ms_at_1000"] == 12.346
    orjson.dumps(out)  # serialisable as the last stdout line


def test_due_paces_an_open_loop() -> None:
    assert due(0.0, 1000, 20000) == 0
    assert due(0.0005, 1000, 20000) == 1
    assert due(1.0, 1000, 20000) == 1001
    assert due(100.0, 1000, 20000) == 20000  # never past the total


def test_widen_candidates_keeps_the_default_and_the_width() -> None:
    types = load_catalog().types
    sub = {"candidate_hardware": ["h100-sxm"], "default_hardware": "h100-sxm", "job_id": "j"}
    seen = set()
    for salt in range(30):
        out = widen_candidates(sub, types, 20, salt=salt)
        cands = out["candidate_hardware"]
        assert len(cands) == 20 == len(set(cands))
        assert cands[0] == "h100-sxm" and set(cands) <= set(types)
        seen.add(tuple(cands))
    assert len(seen) > 1  # the salt rotates the others
    assert sub["candidate_hardware"] == ["h100-sxm"]  # the input is not modified
    with pytest.raises(ValueError):
        widen_candidates(sub, types, len(types) + 1)
