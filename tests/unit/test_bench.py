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
    mixed_summary,
    overhead,
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


def test_overhead_is_the_pipeline_over_the_trees_per_job() -> None:
    o = overhead(cpu_s=2.5, trees_cpu_s=0.25, jobs=10_000)
    assert o["pipeline_cpu_us_per_job"] == pytest.approx(250.0)
    assert o["trees_cpu_us_per_job"] == pytest.approx(25.0)
    assert o["overhead_ratio"] == pytest.approx(10.0)
    assert math.isnan(overhead(1.0, 0.0, 10)["overhead_ratio"])
    assert math.isnan(overhead(1.0, 1.0, 0)["pipeline_cpu_us_per_job"])


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


def test_mixed_summary_is_the_run_nine_in_ten_stay_under() -> None:
    runs = [{"p99_ms": v} for v in (30.0, 41.0, 38.0, 90.0, 35.0, 36.0, 37.0, 39.0, 40.0, 44.0)]
    m = mixed_summary(runs)
    assert m["p99_ms"] == 44.0 and m["runs_under_50ms"] == 9 and m["runs"] == 10
    assert mixed_summary([{"p99_ms": 12.5}])["p99_ms"] == 12.5
    assert math.isnan(mixed_summary([])["p99_ms"])


def test_the_pipeline_stage_runs_under_the_workers_collector_policy() -> None:
    """`worker_gc` applies the worker's `tune_gc` (freeze, young-generation threshold) for the
    stage and puts the bench's own policy back afterwards."""
    import gc

    from leap_stream.settings import Settings
    from leap_stream.tools.bench.loops import worker_gc

    before = gc.get_threshold()
    cfg = Settings.from_env({"LEAP_GC_THRESHOLD": "12345", "LEAP_GC_FREEZE": "1"})
    kept = [{"a": [1]} for _ in range(100)]  # container objects alive before the stage
    with worker_gc(cfg):
        assert gc.get_threshold()[0] == 12345
        assert gc.get_freeze_count() >= len(kept)
    assert gc.get_threshold() == before
    assert gc.get_freeze_count() == 0
    with worker_gc(Settings.from_env({"LEAP_GC_FREEZE": "0"})):
        assert gc.get_threshold()[0] == 50_000
        assert gc.get_freeze_count() == 0


def test_profile_without_pyinstrument_is_a_clear_error_before_any_service(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The profiler is a developer's dependency, not the service's: without it `--profile` says
    so (exit 2) instead of failing with a traceback after the broker has started."""
    import argparse
    import importlib.util

    import leap_stream.tools.dev as dev
    from leap_stream.settings import Settings
    from leap_stream.tools.bench import cli

    parser = argparse.ArgumentParser()
    cli.register(parser)
    args = parser.parse_args(["--profile", "profile.html"])
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *a: None if name == "pyinstrument" else real(name, *a),
    )

    def started(**_kw: object) -> None:
        pytest.fail("services started before the missing profiler was reported")

    monkeypatch.setattr(dev, "ensure_services", started)
    assert cli.run(args, Settings.from_env({})) == 2
    assert "--profile needs pyinstrument" in capsys.readouterr().err
