"""Ranker: schema-valid rankings, ordering by throughput per cost, fallbacks, exclusions."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import jsonschema
import numpy as np
import pytest

from leap_stream.catalog import load_catalog
from leap_stream.core import features as F
from leap_stream.core.history import Measurement
from leap_stream.core.lookup import LookupTable
from leap_stream.core.predictor import ThroughputModel
from leap_stream.core.ranker import Ranker
from leap_stream.core.ranking import ranking_event_id
from leap_stream.tools import synthetic_rows as S
from leap_stream.train import pit

SCHEMA = json.loads(
    (Path(__file__).parents[2] / "schemas" / "hardware-ranking.schema.json").read_text()
)
VALIDATOR = jsonschema.Draft202012Validator(
    SCHEMA, format_checker=jsonschema.Draft202012Validator.FORMAT_CHECKER
)
NOW = datetime(2026, 12, 1, tzinfo=UTC)


def _fitted(rows: int) -> tuple[Any, ThroughputModel]:
    """A synthetic dataset of `rows` and a small model fitted on its measured rows."""
    d = S.dataset(rows, seed=21)
    m = pit.measured(d)
    snap = pit.replay(d, m)
    fr = F.build(
        m, [[h] for h in m["hardware_type"]], snap.histories, snap.aggregates, S.SPECS, snap.now
    )
    model = ThroughputModel.fit(fr, m["samples_per_s"].to_numpy(), m["lineage_id"], num_rounds=40)
    return d, model


@pytest.fixture(scope="module")
def trained() -> tuple[Any, ThroughputModel, LookupTable]:
    d, model = _fitted(3000)
    return d, model, LookupTable.fit(d)


def _subs(d: Any, n: int, cands: list[str] | None = None) -> list[dict[str, Any]]:
    small = d[d["parameters"] < 2e9]  # fits on every synthetic type
    return [S.submission_event(small.iloc[i], cands) for i in range(n)]


def _valid(r: dict[str, Any]) -> None:
    errors = list(VALIDATOR.iter_errors(r))
    assert not errors, errors[0].message


def test_model_rankings_are_valid_and_sorted(
    trained: tuple[Any, ThroughputModel, LookupTable],
) -> None:
    d, model, lookup = trained
    ranker = Ranker(load_catalog(), model, lookup)
    subs = _subs(d, 20)
    hist = {"l4": Measurement(100.0, 1, 1.7e9, 1)}
    out = ranker.rank_batch(subs, [hist] + [None] * 19, {}, NOW)
    assert len(out) == 20
    for s, r in zip(subs, out, strict=True):
        _valid(r)
        assert r["source"] == "model" and r["reason"] == "ok"
        assert r["model_version"] == model.version
        assert r["event_id"] == ranking_event_id(s["event_id"])
        tpc = [c["throughput_per_cost"] for c in r["candidates"]]
        assert tpc == sorted(tpc, reverse=True)
        assert [c["rank"] for c in r["candidates"]] == list(range(1, len(tpc) + 1))
        for c in r["candidates"]:
            expect = (
                c["predicted_throughput"] * 3600 / (c["cost_per_device_hour"] * c["num_devices"])
            )
            assert np.isclose(c["throughput_per_cost"], expect)
            assert c["interval"]["low"] <= c["predicted_throughput"] <= c["interval"]["high"]
    assert out[0]["history_used"] is True and out[1]["history_used"] is False
    flagged = [_within_noise_as_ruled(r) for r in out]
    assert any(any(f) for f in flagged) and not all(all(f) for f in flagged)
    again = ranker.rank_batch(subs[:1], [hist], {}, NOW)
    assert again[0]["event_id"] == out[0]["event_id"]


def _width(c: dict[str, Any]) -> float:
    """A ranked candidate's interval width in log units."""
    return float(np.log(c["interval"]["high"] / c["interval"]["low"]))


def _within_noise_as_ruled(r: dict[str, Any]) -> list[bool]:
    """Each candidate after the first is flagged exactly when its interval's high end, as
    throughput per cost, reaches the first candidate's; returns the flags."""
    first, *rest = r["candidates"]
    assert "within_noise_of_best" not in first
    flags = []
    for c in rest:
        high_tpc = c["interval"]["high"] * 3600 / (c["cost_per_device_hour"] * c["num_devices"])
        reaches = bool(high_tpc >= first["throughput_per_cost"])
        assert c.get("within_noise_of_best", False) is reaches, (c, first)
        flags.append(reaches)
    return flags


def test_within_noise_of_best_is_usable_rows_reaching_their_jobs_best_point() -> None:
    from leap_stream.core.ranking import within_noise_of_best

    job = np.asarray([0, 0, 0, 0, 0, 1, 1, 3, 3])
    tpc = np.asarray([10.0, 8.0, 8.0, 3.0, 50.0, 1.0, np.nan, 5.0, 4.0])
    high = np.asarray([12.0, 10.0, 9.99, np.nan, 99.0, 1.5, 9.0, np.nan, np.nan])
    usable = np.asarray([True, True, True, True, False, True, True, True, True])
    got = within_noise_of_best(job, tpc, high, usable, 4)
    # row 4 is not usable (its tpc is not the job's best either); job 1's NaN row is out and
    # does not make its best NaN; job 2 has no rows; job 3 has no intervals (a lookup): its
    # best alone
    assert got.tolist() == [True, True, False, False, False, True, False, True, False]


def test_fallback_chain_and_exclusions(trained: tuple[Any, ThroughputModel, LookupTable]) -> None:
    d, model, lookup = trained
    cat = load_catalog()
    subs = _subs(d, 3, ["l4", "h100-sxm", "no-such-gpu"])
    lk = Ranker(cat, None, lookup).rank_batch(subs, [None] * 3, {}, NOW)
    for r in lk:
        _valid(r)
        assert r["source"] == "lookup" and r["reason"] == "no_model"
        assert r["model_version"] is None
        assert {"hardware_type": "no-such-gpu", "reason": "unknown_hardware"} in r["excluded"]
        assert all(c["interval"] is None for c in r["candidates"])
    none = Ranker(cat, None, None).rank_batch(subs, [None] * 3, {}, NOW)
    for r in none:
        _valid(r)
        assert r["source"] == "none" and r["reason"] == "lookup_miss" and r["candidates"] == []

    class Broken:
        version = "broken"

        def predict(self, frame: Any) -> Any:
            raise RuntimeError("boom")

    broken = Ranker(cat, Broken(), lookup).rank_batch(subs, [None] * 3, {}, NOW)  # type: ignore[arg-type]
    assert all(r["source"] == "lookup" and r["reason"] == "model_error" for r in broken)

    big = dict(subs[0])
    big["model"] = {**big["model"], "parameters": 5e12, "active_parameters": 5e12}
    out = Ranker(cat, model, lookup).rank_batch([big], [None], {}, NOW)[0]
    _valid(out)
    assert out["source"] == "none" and out["reason"] == "no_candidate_fits"
    assert {"hardware_type": "l4", "reason": "does_not_fit"} in out["excluded"]


def test_long_submission_id_still_gives_valid_event_id() -> None:
    eid = ranking_event_id("x" * 128)
    assert len(eid) <= 128 and eid == ranking_event_id("x" * 128)


def test_one_booster_call_per_batch(trained: tuple[Any, ThroughputModel, LookupTable]) -> None:
    d, model, lookup = trained
    calls: list[int] = []
    real = model.booster

    class Counting:
        def predict(self, X: Any, **kw: Any) -> Any:
            calls.append(len(X))
            return real.predict(X, **kw)

    model.booster = Counting()  # type: ignore[assignment]
    try:
        subs = _subs(d, 50)
        hist = [{"l4": Measurement(100.0, 1, 1.7e9, 1)}] * 50  # every job has a prior elsewhere
        out = Ranker(load_catalog(), model, lookup).rank_batch(subs, hist, {}, NOW)
    finally:
        model.booster = real
    assert len(calls) == 1
    assert all(r["source"] == "model" for r in out)
    # candidate rows + one prior-hardware row per job (deduplicated), in that one call; a
    # candidate the lineage ran on (l4 here) is anchored on its own prior, not scored
    n_cands = sum(sum(t != "l4" for t in s["candidate_hardware"]) for s in subs)
    assert n_cands < calls[0] <= n_cands + 50


def test_a_job_far_outside_the_training_data_is_flagged_with_wider_intervals(
    trained: tuple[Any, ThroughputModel, LookupTable],
) -> None:
    """The model extrapolates for a configuration it never saw: the ranking says so and every
    interval widens by how far outside the training support the job is (docs/model.md)."""
    from leap_stream.core.predictor import OOD_MARGIN

    d, model, lookup = trained
    support = model.metadata["support"]
    assert set(support) >= {"log_params", "log_global_batch", "log_devices"}
    inside = _subs(d, 1)[0]
    far = dict(inside, event_id=inside["event_id"] + "-far", job_id=inside["job_id"] + "-far")
    batch = inside["training"]["global_batch_size"] * 1000
    far["training"] = {**inside["training"], "global_batch_size": batch}
    a, b = Ranker(load_catalog(), model, lookup).rank_batch([inside, far], [None, None], {}, NOW)
    _valid(a)
    _valid(b)
    assert "out_of_distribution" not in a and b["out_of_distribution"] is True
    assert b["source"] == "model"
    excess = np.log(batch) - support["log_global_batch"][1]
    assert excess > OOD_MARGIN

    def widths(r: dict[str, Any]) -> dict[str, float]:
        return {
            c["hardware_type"]: np.log(c["interval"]["high"] / c["interval"]["low"])
            for c in r["candidates"]
            if c["interval"]["low"] > 0
        }

    wa, wb = widths(a), widths(b)
    for hw in set(wa) & set(wb):
        assert wb[hw] == pytest.approx(wa[hw] + 2 * excess, rel=1e-6)


def test_a_type_with_few_measurements_gets_the_widest_interval_and_says_so(
    trained: tuple[Any, ThroughputModel, LookupTable],
) -> None:
    """A new or rare type has no interval scale of its own: its candidates borrow the widest
    known type's scale and carry `few_measurements` (docs/model.md, Intervals)."""
    d, model, lookup = trained
    sub = _subs(d, 1)[0]
    known, rare = sub["candidate_hardware"][:2]

    def with_scale(by_type: dict[str, float], sparse: float) -> ThroughputModel:
        meta = {**model.metadata, "interval_scale": {"by_type": by_type, "sparse": sparse}}
        return ThroughputModel(model.booster, meta, ratio=model.ratio)  # type: ignore[arg-type]

    every = dict.fromkeys(sub["candidate_hardware"], 1.0)
    (r,) = Ranker(load_catalog(), with_scale({known: 1.0}, 2.5), lookup).rank_batch(
        [sub], [None], {}, NOW
    )
    (plain,) = Ranker(load_catalog(), with_scale(every, 1.0), lookup).rank_batch(
        [sub], [None], {}, NOW
    )
    _valid(r)
    by_hw = {c["hardware_type"]: c for c in r["candidates"]}
    base = {c["hardware_type"]: c for c in plain["candidates"]}
    assert by_hw[rare]["few_measurements"] is True
    assert "few_measurements" not in by_hw[known]
    assert not any(c.get("few_measurements") for c in plain["candidates"])

    assert _width(by_hw[rare]) == pytest.approx(2.5 * _width(base[rare]), rel=1e-6)
    assert _width(by_hw[known]) == pytest.approx(_width(base[known]), rel=1e-6)
    assert by_hw[rare]["predicted_throughput"] == base[rare]["predicted_throughput"]


def test_a_type_with_few_measurements_gets_at_least_the_unseen_type_scale(
    trained: tuple[Any, ThroughputModel, LookupTable],
) -> None:
    """The unseen-type scale (measured by refitting without known types) is the least scale
    of a type without one of its own; it does not touch known types or `self` rows."""
    d, model, lookup = trained
    sub = _subs(d, 1)[0]
    known, rare = sub["candidate_hardware"][:2]

    def ranked(unseen_type: float | None, hist: Any = None) -> dict[str, Any]:
        scale: dict[str, Any] = {"by_type": {known: 1.0}, "sparse": 1.5}
        if unseen_type is not None:
            scale["unseen_type"] = unseen_type
        meta = {**model.metadata, "interval_scale": scale}
        m = ThroughputModel(model.booster, meta, ratio=model.ratio)  # type: ignore[arg-type]
        (r,) = Ranker(load_catalog(), m, lookup).rank_batch([sub], [hist], {}, NOW)
        _valid(r)
        return {c["hardware_type"]: c for c in r["candidates"]}

    before, wider, narrower = ranked(None), ranked(3.0), ranked(1.2)
    assert _width(wider[rare]) == pytest.approx(2.0 * _width(before[rare]), rel=1e-6)
    assert _width(narrower[rare]) == pytest.approx(_width(before[rare]), rel=1e-6)  # 1.5 wins
    assert _width(wider[known]) == pytest.approx(_width(before[known]), rel=1e-6)
    # a lineage that ran on the rare type is anchored on its own prior there: not widened
    hist = {rare: Measurement(100.0, sub["training"]["num_devices"], 1.7e9, 1)}
    own_before, own_wider = ranked(None, hist), ranked(3.0, hist)
    assert _width(own_wider[rare]) == pytest.approx(_width(own_before[rare]), rel=1e-6)


def test_the_types_left_out_are_the_fastest_with_enough_held_out_rows() -> None:
    import pandas as pd

    from leap_stream.core.intervals import MIN_TYPE_ROWS
    from leap_stream.core.predictor.fit import _types_to_leave_out

    n = MIN_TYPE_ROWS
    peaks = {"slow": 1.0, "fast": 3.0, "fastest_but_rare": 9.0, "mid": 2.0, "faster": 4.0}
    rows = {"slow": n, "fast": n, "fastest_but_rare": n - 1, "mid": n, "faster": n}
    hw = np.asarray([t for t, k in rows.items() for _ in range(k)], object)
    frame = pd.DataFrame({"log_peak_tflops": [peaks[t] for t in hw]})
    got = _types_to_leave_out(frame, hw.astype(str), np.ones(len(hw), bool))
    assert got == ["faster", "fast", "mid"]


def test_a_fitted_model_measures_the_unseen_type_scale() -> None:
    _d, model = _fitted(6000)  # enough held-out rows per type to leave types out
    scale = model.metadata["interval_scale"]
    assert scale["unseen_type"] >= 1.0
    assert 1 <= len(scale["unseen_type_from"]) <= 3
    assert set(scale["unseen_type_from"]) <= set(scale["by_type"])


def test_type_scales_follow_each_types_residuals() -> None:
    from leap_stream.core.intervals import MIN_TYPE_ROWS, type_scales

    rng = np.random.default_rng(3)
    n = 4000
    hw = np.asarray(["wide"] * n + ["narrow"] * n + ["rare"] * (MIN_TYPE_ROWS - 1), object)
    resid = np.concatenate(
        [rng.normal(0, 2.0, n), rng.normal(0, 0.5, n), rng.normal(0, 9.0, MIN_TYPE_ROWS - 1)]
    )
    q = 1.2816  # the 10 / 90 % points of a standard normal
    lo, hi = np.full(len(hw), -q), np.full(len(hw), q)
    s = type_scales(hw, resid, lo, hi)
    assert set(s["by_type"]) == {"wide", "narrow"}
    assert s["by_type"]["wide"] == pytest.approx(2.0, rel=0.08)
    assert s["by_type"]["narrow"] == pytest.approx(0.5, rel=0.08)
    assert s["sparse"] == s["by_type"]["wide"]


def test_a_fitted_model_has_scales_only_for_types_with_enough_held_out_rows(
    trained: tuple[Any, ThroughputModel, LookupTable],
) -> None:
    from leap_stream.core.intervals import MIN_TYPE_ROWS

    _d, model, _lookup = trained
    scale = model.metadata["interval_scale"]
    held_out = model.metadata["metrics"]["calib_rows"]
    assert len(scale["by_type"]) <= held_out // MIN_TYPE_ROWS
    assert scale["sparse"] >= max([1.0, *scale["by_type"].values()])


def test_an_unseen_model_type_and_hardware_pair_widens_only_moved_and_blind_intervals(
    trained: tuple[Any, ThroughputModel, LookupTable],
) -> None:
    """Candidates on a (model type × hardware) pair no training row had get the calibrated
    unseen-pair factor on top of their type's scale; pairs the training rows had do not."""
    d, model, lookup = trained
    sub = _subs(d, 1)[0]
    mt = sub["model"]["model_type"]
    pairs = model.metadata["pair_effects"]
    seen = {h for h in sub["candidate_hardware"] if f"{mt}|{h}" in pairs}
    assert seen, "the fixture's first job has no pair the training rows had"
    kept = {k: v for k, v in pairs.items() if not k.startswith(f"{mt}|") or k.split("|")[1] in seen}
    every = dict.fromkeys(sub["candidate_hardware"], 1.0)

    def ranked(unseen: float, pair_effects: dict[str, float]) -> dict[str, Any]:
        scale = {"by_type": every, "sparse": 1.0, "unseen_pair": unseen}
        meta = {**model.metadata, "interval_scale": scale, "pair_effects": pair_effects}
        m = ThroughputModel(model.booster, meta, ratio=model.ratio)  # type: ignore[arg-type]
        (r,) = Ranker(load_catalog(), m, lookup).rank_batch([sub], [None], {}, NOW)
        _valid(r)
        return {c["hardware_type"]: c for c in r["candidates"]}

    # drop one seen pair from the table: that candidate is now on an unseen pair
    gone = sorted(seen)[0]
    fewer = {k: v for k, v in kept.items() if k != f"{mt}|{gone}"}
    base, wide = ranked(1.0, fewer), ranked(2.0, fewer)
    for hw in base:
        factor = 1.0 if f"{mt}|{hw}" in fewer else 2.0
        assert _width(wide[hw]) == pytest.approx(factor * _width(base[hw]), rel=1e-6), hw
    assert _width(wide[gone]) == pytest.approx(2.0 * _width(base[gone]), rel=1e-6)


def test_a_pair_with_few_training_rows_gets_the_unseen_pair_factor(
    trained: tuple[Any, ThroughputModel, LookupTable],
) -> None:
    """With ``rare_pair_rows``, a pair the training rows had fewer times than that is widened
    like an unseen one; a model without it (older artefacts) widens unseen pairs only."""
    from leap_stream.core.predictor import RARE_PAIR_ROWS

    d, model, lookup = trained
    sub = _subs(d, 1)[0]
    mt = sub["model"]["model_type"]
    pairs = model.metadata["pair_effects"]
    assert "pair_rows" in model.metadata and set(model.metadata["pair_rows"]) == set(pairs)
    seen = sorted(h for h in sub["candidate_hardware"] if f"{mt}|{h}" in pairs)
    assert seen, "the fixture's first job has no pair the training rows had"
    rare = seen[0]
    rows = {k: RARE_PAIR_ROWS for k in pairs} | {f"{mt}|{rare}": RARE_PAIR_ROWS - 1}
    every = dict.fromkeys(sub["candidate_hardware"], 1.0)

    def widths(unseen: float, least: int | None) -> dict[str, float]:
        scale: dict[str, Any] = {"by_type": every, "sparse": 1.0, "unseen_pair": unseen}
        if least is not None:
            scale["rare_pair_rows"] = least
        meta = {**model.metadata, "interval_scale": scale, "pair_rows": rows}
        m = ThroughputModel(model.booster, meta, ratio=model.ratio)  # type: ignore[arg-type]
        (r,) = Ranker(load_catalog(), m, lookup).rank_batch([sub], [None], {}, NOW)
        _valid(r)
        return {
            c["hardware_type"]: float(np.log(c["interval"]["high"] / c["interval"]["low"]))
            for c in r["candidates"]
        }

    base, wide = widths(1.0, RARE_PAIR_ROWS), widths(2.0, RARE_PAIR_ROWS)
    for hw in base:
        factor = 2.0 if hw == rare or f"{mt}|{hw}" not in pairs else 1.0
        assert wide[hw] == pytest.approx(factor * base[hw], rel=1e-6), hw
    old = widths(2.0, None)  # no threshold stored: the rare pair counts as seen
    assert old[rare] == pytest.approx(base[rare], rel=1e-6)


def test_the_unseen_pair_factor_comes_from_moved_and_blind_residuals() -> None:
    from leap_stream.core.intervals import MIN_TYPE_ROWS, unseen_pair_scale

    rng = np.random.default_rng(5)
    n = 4 * MIN_TYPE_ROWS
    unseen = np.arange(n) < n // 2
    q = 1.2816
    # residuals twice as wide on the unseen pairs, as wide as the quantiles elsewhere
    transfer = rng.normal(0, 1.0, n) * np.where(unseen, 2.0, 1.0)
    blind = rng.normal(0, 1.0, n) * np.where(unseen, 2.0, 1.0)
    one = np.ones(n)
    f = unseen_pair_scale(one, unseen, [(transfer, -q, q), (blind, -q, q)])
    assert f == pytest.approx(2.0, rel=0.1)
    assert unseen_pair_scale(one, np.zeros(n, bool), [(transfer, -q, q)]) is None
    # a type already twice as wide explains it: no further factor
    assert unseen_pair_scale(2 * one, unseen, [(transfer, -q, q), (blind, -q, q)]) == 1.0


def test_the_devices_changed_factor_widens_only_an_own_prior_on_other_devices(
    trained: tuple[Any, ThroughputModel, LookupTable],
) -> None:
    """A lineage's own prior measured on another device count gets the factor; the same prior
    on the job's device count, and every other candidate, do not."""
    d, model, lookup = trained
    sub = _subs(d, 1)[0]
    own = sub["candidate_hardware"][0]
    n = sub["training"]["num_devices"]
    every = dict.fromkeys(sub["candidate_hardware"], 1.0)

    def widths(devices: int, factor: float | None) -> dict[str, float]:
        scale: dict[str, Any] = {"by_type": every, "sparse": 1.0}
        if factor is not None:
            scale["devices_changed"] = factor
        meta = {**model.metadata, "interval_scale": scale}
        m = ThroughputModel(model.booster, meta, ratio=model.ratio)  # type: ignore[arg-type]
        hist = {own: Measurement(100.0, devices, 1.7e9, 1)}
        (r,) = Ranker(load_catalog(), m, lookup).rank_batch([sub], [hist], {}, NOW)
        _valid(r)
        return {c["hardware_type"]: _width(c) for c in r["candidates"]}

    base, wide = widths(2 * n, None), widths(2 * n, 1.6)
    for hw, w in base.items():
        assert wide[hw] == pytest.approx((1.6 if hw == own else 1.0) * w, rel=1e-6), hw
    assert widths(n, 1.6) == pytest.approx(widths(n, None), rel=1e-6)


def test_a_fitted_model_measures_the_devices_changed_factor() -> None:
    """A third of the rows anchored on their own prior are marked as measured on another
    device count, and their throughput moved by ~30 % in log: the fitted factor says their
    intervals must be wider. The synthetic lineages never change device counts: unmarked, the
    model records no factor."""
    d = S.dataset(6000, seed=21)
    m = pit.measured(d)
    snap = pit.replay(d, m)
    fr = F.build(
        m, [[h] for h in m["hardware_type"]], snap.histories, snap.aggregates, S.SPECS, snap.now
    )
    y = m["samples_per_s"].to_numpy().copy()
    # half the lineages held out: enough marked rows among them for a factor
    plain = ThroughputModel.fit(fr, y, m["lineage_id"], num_rounds=20, calib_fraction=0.5)
    assert "devices_changed" not in plain.metadata["interval_scale"]
    moved = np.flatnonzero(np.isfinite(fr["self_log_pd"].to_numpy()))[::3]
    ratio = fr["self_log_dev_ratio"].to_numpy().copy()
    ratio[moved] = np.log(2.0)
    fr["self_log_dev_ratio"] = ratio
    y[moved] *= np.exp(np.random.default_rng(2).normal(0, 0.3, len(moved)))
    model = ThroughputModel.fit(fr, y, m["lineage_id"], num_rounds=20, calib_fraction=0.5)
    assert model.metadata["interval_scale"]["devices_changed"] > 1.5


def test_rank_order_puts_a_jobs_first_rows_first_then_the_best_score() -> None:
    from leap_stream.core.ranking import rank_order

    job = np.asarray([1, 0, 0, 0, 0, 1])
    score = np.asarray([2.0, np.nan, 5.0, -np.inf, 7.0, 2.0])
    usable = np.asarray([True, True, True, False, True, True])
    assert rank_order(job, score, first=usable).tolist() == [4, 2, 1, 3, 0, 5]
    # without it a NaN score sorts after -inf: the unusable row comes before it
    assert rank_order(job, score).tolist() == [4, 2, 3, 1, 0, 5]
