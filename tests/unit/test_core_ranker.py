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


def _ran_on_first(rankings: list[Any]) -> list[dict[str, Measurement] | None]:
    """A history per ranking: its lineage ran once on the ranking's first candidate."""
    return [
        {r["candidates"][0]["hardware_type"]: Measurement(50.0, 1, 1.7e9, 1)}
        if r["candidates"]
        else None
        for r in rankings
    ]


def test_a_ranking_marks_the_untried_candidate_within_the_noise_it_would_explore(
    trained: tuple[Any, ThroughputModel, LookupTable],
) -> None:
    """With a budget, a ranking whose first candidate the lineage ran on names one candidate
    within the noise that neither it nor its model type ran on, with the extra cost it
    expects; the event stays valid (schema and the codec's checks). Without one, none."""
    from leap_stream.contracts import validate_event

    d, model, lookup = trained
    subs = _subs(d, 40)
    out0 = Ranker(load_catalog(), model, lookup).rank_batch(subs, [None] * 40, {}, NOW)
    # each lineage ran on its first choice: its first is tried, the rest are not
    hist = _ran_on_first(out0)
    off = Ranker(load_catalog(), model, lookup).rank_batch(subs, hist, {}, NOW)
    assert not any("explore" in r for r in off)
    on = Ranker(load_catalog(), model, lookup, explore_budget=1.0).rank_batch(subs, hist, {}, NOW)
    marked = [r for r in on if "explore" in r]
    assert marked
    for r in on:
        _valid(r)
        assert validate_event(r, "hardware-ranking") is None
        if "explore" not in r:
            continue
        e = r["explore"]
        first = r["candidates"][0]
        chosen = next(c for c in r["candidates"] if c["hardware_type"] == e["hardware_type"])
        assert chosen.get("within_noise_of_best") and e["reason"] == "never_measured"
        assert e["hardware_type"] not in hist[on.index(r)]
        expect = first["throughput_per_cost"] / chosen["throughput_per_cost"] - 1.0
        assert e["expected_extra_cost"] == pytest.approx(expect, abs=1e-4)
        # the best of the untried ones within the noise
        others = [
            c["throughput_per_cost"]
            for c in r["candidates"][1:]
            if c.get("within_noise_of_best") and c["hardware_type"] not in hist[on.index(r)]
        ]
        assert chosen["throughput_per_cost"] == max(others)
    tight = Ranker(load_catalog(), model, lookup, explore_budget=1e-9).rank_batch(
        subs, hist, {}, NOW
    )
    assert sum("explore" in r for r in tight) < len(marked)


def test_a_ranking_names_the_probes_a_long_job_pays_for(
    trained: tuple[Any, ThroughputModel, LookupTable],
) -> None:
    """With `planned_samples` of a month on the first candidate, a ranking names the probes
    (types among its first candidates, in ranking order), their cost within the budget of the
    job's expected cost and a positive expected saving; the event stays valid. Without planned
    samples, or without a probe budget, none."""
    import copy

    from leap_stream.contracts import validate_event
    from leap_stream.core.probe import ProbeSettings

    d, model, lookup = trained
    subs = _subs(d, 40)
    settings = ProbeSettings(budget=0.01, size="slice")
    plain = Ranker(load_catalog(), model, lookup, probe=settings).rank_batch(
        subs, [None] * 40, {}, NOW
    )
    assert not any("probe" in r for r in plain)
    long = copy.deepcopy(subs)
    for s, r in zip(long, plain, strict=True):
        if r["candidates"]:
            month = r["candidates"][0]["predicted_throughput"] * 30 * 86400.0
            s["training"]["planned_samples"] = month
    # each lineage ran on its first choice: the others are explorations' candidates
    hist = _ran_on_first(plain)
    on = Ranker(load_catalog(), model, lookup, explore_budget=1.0, probe=settings).rank_batch(
        long, hist, {}, NOW
    )
    explored = Ranker(load_catalog(), model, lookup, explore_budget=1.0).rank_batch(
        long, hist, {}, NOW
    )
    # a probed job explores nothing; without probes some of them would have
    assert any("explore" in e and "probe" in r for e, r in zip(explored, on, strict=True))
    marked = [r for r in on if "probe" in r]
    assert marked
    for r in on:
        _valid(r)
        assert validate_event(r, "hardware-ranking") is None
        if "probe" not in r:
            continue
        assert "explore" not in r  # a probed job explores nothing
        p, cands = r["probe"], r["candidates"]
        first_three = [c["hardware_type"] for c in cands[: settings.top]]
        assert set(p["hardware_types"]) <= set(first_three)
        assert p["hardware_types"] == [t for t in first_three if t in p["hardware_types"]]
        first = cands[0]
        job_cost = 30 * 24 * first["cost_per_device_hour"] * first["num_devices"]
        assert 0 < p["cost"] <= 0.01 * job_cost + 0.01 and p["expected_saving"] > 0
        assert p["minutes"] == settings.minutes
    # each probe runs a slice of its job (`runs`, one per type): a whole number of its
    # replicas, its cost that slice's, and the model's prediction there
    sliced = 0
    for s, r, before in zip(long, on, plain, strict=True):
        if "probe" not in r:
            continue
        p, t = r["probe"], s["training"]
        price = {c["hardware_type"]: c["cost_per_device_hour"] for c in r["candidates"]}
        assert len(p["runs"]) == len(p["hardware_types"])
        per_replica = t["num_devices"] // t["data_parallel"]
        for run in p["runs"]:
            assert run["num_devices"] == per_replica * run["data_parallel"]
            assert 1 <= run["data_parallel"] <= t["data_parallel"]
            assert run["predicted_throughput"] > 0
        sliced += any(run["data_parallel"] < t["data_parallel"] for run in p["runs"])
        # the type the lineage ran on is probed only as the whole job: its own run says more
        # than a slice, and a slice's rate would join a window of the job's own size
        ran = before["candidates"][0]["hardware_type"]  # `hist`: where the lineage ran
        for h, run in zip(p["hardware_types"], p["runs"], strict=True):
            assert h != ran or run["data_parallel"] == t["data_parallel"]
        paid = sum(
            settings.minutes / 60 * price[h] * run["num_devices"]
            for h, run in zip(p["hardware_types"], p["runs"], strict=True)
        )
        assert p["cost"] == pytest.approx(paid, abs=0.01)
    assert sliced
    # whole-job probes (the default) carry no runs: each is the job itself
    whole = Ranker(load_catalog(), model, lookup, probe=ProbeSettings()).rank_batch(
        long, hist, {}, NOW
    )
    assert any("probe" in r for r in whole)
    assert not any("runs" in r.get("probe", {}) for r in whole)
    off = Ranker(load_catalog(), model, lookup).rank_batch(long, hist, {}, NOW)
    assert not any("probe" in r for r in off)


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


def test_a_type_with_few_measurements_is_calibrated_as_few_and_says_so(
    trained: tuple[Any, ThroughputModel, LookupTable],
) -> None:
    """A new or rare type has no offset of its own: its moved and blind candidates are scaled
    by the few-rows term and take their bin's "few" quantiles (from the types a refit left
    out), and they carry `few_measurements` (docs/model.md, Intervals)."""
    d, model, lookup = trained
    sub = _subs(d, 1)[0]
    known, rare = sub["candidate_hardware"][:2]
    cal = model.metadata["calibration"]

    def with_types(by_type: dict[str, float], few: float) -> ThroughputModel:
        coef = {**cal["coef"], "few_type": few}
        meta = {**model.metadata, "calibration": {**cal, "by_type": by_type, "coef": coef}}
        return ThroughputModel(model.booster, meta, ratio=model.ratio)  # type: ignore[arg-type]

    every = dict.fromkeys(sub["candidate_hardware"], 0.0)
    (r,) = Ranker(load_catalog(), with_types({known: 0.0}, 0.0), lookup).rank_batch(
        [sub], [None], {}, NOW
    )
    (wide,) = Ranker(
        load_catalog(), with_types({known: 0.0}, float(np.log(2.0))), lookup
    ).rank_batch([sub], [None], {}, NOW)
    (plain,) = Ranker(load_catalog(), with_types(every, 0.0), lookup).rank_batch(
        [sub], [None], {}, NOW
    )
    _valid(r)
    by_hw = {c["hardware_type"]: c for c in r["candidates"]}
    doubled = {c["hardware_type"]: c for c in wide["candidates"]}
    base = {c["hardware_type"]: c for c in plain["candidates"]}
    assert by_hw[rare]["few_measurements"] is True
    assert "few_measurements" not in by_hw[known]
    assert not any(c.get("few_measurements") for c in plain["candidates"])
    # the few-rows term doubles σ on the rare type only
    assert _width(doubled[rare]) == pytest.approx(2.0 * _width(by_hw[rare]), rel=1e-6)
    assert _width(doubled[known]) == pytest.approx(_width(by_hw[known]), rel=1e-6)
    assert _width(by_hw[known]) == pytest.approx(_width(base[known]), rel=1e-6)
    assert by_hw[rare]["predicted_throughput"] == base[rare]["predicted_throughput"]


def test_each_scale_term_widens_only_the_rows_it_applies_to(
    trained: tuple[Any, ThroughputModel, LookupTable],
) -> None:
    """A rare (model type × type) pair widens moved and blind candidates, not a lineage's own
    prior there; a changed device count widens only an own prior: σ grows by e^coef."""
    d, model, lookup = trained
    sub = _subs(d, 1)[0]
    own = sub["candidate_hardware"][0]
    cal = model.metadata["calibration"]

    # one candidate's (model type × type) pair had no training row
    rare_hw = sub["candidate_hardware"][1]
    pair_rows = {**model.metadata["pair_rows"], f"{sub['model']['model_type']}|{rare_hw}": 0}

    def ranked(coef: dict[str, float], hist: Any) -> dict[str, Any]:
        calibration = {**cal, "coef": {**cal["coef"], **coef}}
        meta = {**model.metadata, "calibration": calibration, "pair_rows": pair_rows}
        m = ThroughputModel(model.booster, meta, ratio=model.ratio)  # type: ignore[arg-type]
        (r,) = Ranker(load_catalog(), m, lookup).rank_batch([sub], [hist], {}, NOW)
        _valid(r)
        return {c["hardware_type"]: c for c in r["candidates"]}

    devices = sub["training"]["num_devices"]
    same = {own: Measurement(100.0, devices, 1.7e9, 1)}
    other = {own: Measurement(100.0, devices * 2, 1.7e9, 1)}
    zero = {"rare_pair": 0.0, "devices_changed": 0.0}
    ln2 = float(np.log(2.0))
    base, rare = ranked(zero, same), ranked({**zero, "rare_pair": ln2}, same)
    moved = [h for h in base if h != own]
    assert _width(rare[own]) == pytest.approx(_width(base[own]), rel=1e-6)  # own prior
    assert _width(rare[rare_hw]) == pytest.approx(2.0 * _width(base[rare_hw]), rel=1e-6)
    assert all(_width(rare[h]) == pytest.approx(_width(base[h])) for h in moved if h != rare_hw)
    changed, changed2 = ranked(zero, other), ranked({**zero, "devices_changed": ln2}, other)
    assert _width(changed2[own]) == pytest.approx(2.0 * _width(changed[own]), rel=1e-6)
    assert all(_width(changed2[h]) == pytest.approx(_width(changed[h])) for h in moved)
    unchanged = ranked({**zero, "devices_changed": ln2}, same)
    assert _width(unchanged[own]) == pytest.approx(_width(base[own]), rel=1e-6)


def test_a_fitted_model_carries_one_calibration() -> None:
    """Offsets only for types with enough held-out rows, a coefficient per term, quantiles per
    bin, the few-rows bins from the types a refit left out; no other interval keys."""
    from leap_stream.core.intervals import BINS, MIN_TYPE_ROWS, SCALE_TERMS

    d, model = _fitted(6000)  # enough held-out rows per type to leave types out
    cal = model.metadata["calibration"]
    assert set(cal["coef"]) == {"const", *SCALE_TERMS}
    assert set(cal["quantiles"]) <= set(BINS)
    assert {"transfer|few", "model|few"} <= set(cal["quantiles"])
    for lo, hi in cal["quantiles"].values():
        assert lo < 0 < hi
    assert "interval_scale" not in model.metadata
    counts = d["hardware_type"].value_counts()
    assert cal["by_type"] and all(counts[t] >= MIN_TYPE_ROWS for t in cal["by_type"])


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


def test_rank_order_puts_a_jobs_first_rows_first_then_the_best_score() -> None:
    from leap_stream.core.ranking import rank_order

    job = np.asarray([1, 0, 0, 0, 0, 1])
    score = np.asarray([2.0, np.nan, 5.0, -np.inf, 7.0, 2.0])
    usable = np.asarray([True, True, True, False, True, True])
    assert rank_order(job, score, first=usable).tolist() == [4, 2, 1, 3, 0, 5]
    # without it a NaN score sorts after -inf: the unusable row comes before it
    assert rank_order(job, score).tolist() == [4, 2, 3, 1, 0, 5]
