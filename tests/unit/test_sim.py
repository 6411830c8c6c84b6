"""Fleet simulator: determinism, contracts, physical plausibility, drift, policies."""

from __future__ import annotations

import hashlib
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from leap_stream.catalog import HardwareCatalog, load_catalog
from leap_stream.contracts.schemas import validator
from leap_stream.core.rows import SUBMISSION_COLUMNS
from leap_stream.store.offline import DATASET_COLUMNS
from leap_stream.tools.sim.config import DriftEvent, SimConfig, SimResult
from leap_stream.tools.sim.events import (
    completion_events,
    completion_lines,
    submission_events,
    submission_lines,
    timeline,
    write_jsonl,
)
from leap_stream.tools.sim.fleet import FleetSimulator, simulate
from leap_stream.tools.sim.models import model_catalog
from leap_stream.tools.sim.population import jobs_from_frame
from leap_stream.tools.sim.throughput import HardwareArrays, base_throughput, memory_per_device_gib

SMALL = SimConfig(seed=5, days=2, rate=2500)


@pytest.fixture(scope="module")
def small() -> SimResult:
    return simulate(SMALL)


def _digest(folder: Path) -> dict[str, str]:
    return {
        name: hashlib.sha256((folder / name).read_bytes()).hexdigest()
        for name in ("submissions.jsonl", "completions.jsonl")
    }


def test_same_seed_same_bytes_other_seed_differs(small: SimResult, tmp_path: Path) -> None:
    write_jsonl(small, tmp_path / "a")
    write_jsonl(simulate(SMALL), tmp_path / "b")
    write_jsonl(simulate(replace(SMALL, seed=6)), tmp_path / "c")
    assert _digest(tmp_path / "a") == _digest(tmp_path / "b")
    assert _digest(tmp_path / "a") != _digest(tmp_path / "c")
    assert pd.read_parquet(tmp_path / "a" / "dataset.parquet").columns.tolist() == list(
        DATASET_COLUMNS
    )


def test_every_event_is_schema_valid(small: SimResult) -> None:
    check_sub = validator("job-submitted")
    check_comp = validator("job-completed")
    subs = submission_events(small.submissions)
    comps = completion_events(small.completions)
    assert len(subs) == len(comps) == len(small.submissions)
    for ev in subs:
        check_sub(ev)
    for ev in comps:
        check_comp(ev)
    # measured completions carry throughput, unmeasured ones do not
    measured = small.completions["samples_per_s"].notna().to_numpy()
    assert [("throughput" in e) for e in comps] == measured.tolist()


def test_fast_lines_are_the_orjson_bytes_of_the_events(small: SimResult) -> None:
    import orjson

    assert submission_lines(small.submissions) == [
        orjson.dumps(e) for e in submission_events(small.submissions)
    ]
    assert completion_lines(small.completions) == [
        orjson.dumps(e) for e in completion_events(small.completions)
    ]
    # the Kafka timeline: time-ordered, each completion after its own submission
    seen: set[str] = set()
    last = ""
    for kind, key, value in timeline(small):
        ev = orjson.loads(value)
        assert ev["job_id"] == key
        ts = ev["submitted_at"] if kind == "submission" else ev["ended_at"]
        assert ts >= last
        last = ts
        ident = f"{key}/{ev['attempt']}"
        if kind == "submission":
            seen.add(ident)
        else:
            assert ident in seen


def test_frames_follow_the_dataset_contract(small: SimResult) -> None:
    assert list(small.dataset.columns) == list(DATASET_COLUMNS)
    assert set(SUBMISSION_COLUMNS) | {"submission_event_id"} <= set(small.submissions.columns)
    for col in ("submitted_at", "started_at", "ended_at"):
        assert str(small.dataset[col].dtype).endswith("UTC]")
    d = small.dataset
    assert (d["started_at"] >= d["submitted_at"]).all()
    assert (d["ended_at"] > d["started_at"]).all()
    assert d["event_id"].is_unique
    assert not d.duplicated(["job_id", "attempt"]).any()
    # the hardware run on is always a candidate, and so is the default
    cands = d["candidate_hardware"].str.split("|")
    assert all(h in c for h, c in zip(d["hardware_type"], cands, strict=True))
    assert all(h in c for h, c in zip(d["default_hardware"], cands, strict=True))
    sizes = cands.str.len()
    assert sizes.min() >= 1 and sizes.max() <= 20 and sizes.median() >= 3
    # succeeded runs are measured; failed runs never are
    assert d.loc[d["status"] == "succeeded", "samples_per_s"].notna().all()
    assert d.loc[d["status"] == "failed", "samples_per_s"].isna().all()
    # some of a day's completions arrive on a later day (durations are heavy-tailed)
    assert (d["ended_at"].dt.normalize() > d["submitted_at"].dt.normalize()).any()


def test_truth_covers_every_candidate(small: SimResult) -> None:
    t = small.truth
    per_attempt = t.groupby(["job_id", "attempt"]).size()
    sizes = small.submissions.set_index(["job_id", "attempt"])["candidate_hardware"].str.count(
        r"\|"
    )
    assert (per_attempt.reindex(sizes.index) == sizes + 1).all()
    assert (t["true_samples_per_s"] > 0).all()
    # measured = truth × a few percent of lognormal noise
    noise = np.log(t["measured_samples_per_s"] / t["true_samples_per_s"])
    assert 0.02 < noise.std() < 0.06 and abs(noise.mean()) < 0.01
    # the dataset's measurement is the truth table's measured value on the hardware run on
    d = small.dataset.dropna(subset=["samples_per_s"])
    j = d.merge(t, on=["job_id", "attempt", "hardware_type"])
    assert len(j) == len(d)
    np.testing.assert_allclose(j["samples_per_s"], j["measured_samples_per_s"])


def test_many_submissions_have_prior_and_lineages_span_types() -> None:
    sim = FleetSimulator(SimConfig(seed=9, days=3, rate=3000))
    days = [sim.step_day() for _ in range(3)]
    share = [float(d.submissions["has_prior"].mean()) for d in days]
    assert 0.5 < share[0] < share[1]
    assert all(0.7 <= s <= 0.92 for s in share[1:]), share
    ds = pd.concat([d.dataset for d in days])
    measured = ds.dropna(subset=["samples_per_s"])
    multi = measured.groupby("lineage_id")["hardware_type"].nunique()
    assert (multi > 1).mean() > 0.03
    n = ds["num_devices"]
    assert n.min() == 1 and n.max() >= 256 and n.median() <= 8  # heavy tail


def test_jobs_that_do_not_fit_are_never_candidates(small: SimResult) -> None:
    cat = load_catalog()
    subs = small.submissions
    mem = memory_per_device_gib(jobs_from_frame(subs))
    spec = cat.spec_matrix()["device_memory_gib"]
    cands = subs["candidate_hardware"].str.split("|")
    smallest_candidate = np.array([spec[c].min() for c in cands])
    assert (mem <= smallest_candidate * 0.92 + 1e-9).all()
    # and memory does exclude types: some big jobs have no 16-24 GiB part among candidates
    big = mem > 24
    assert big.sum() > 50
    assert not any({"t4", "l4", "a10g", "tpu-v5e"} & set(c) for c in cands[big])


def _model_rows(names: list[str]) -> pd.DataFrame:
    m = model_catalog().set_index("model_type").loc[names].reset_index()
    return m


def _frame(model_type: str, n: int, **kw: object) -> pd.DataFrame:
    row = {
        "model_type": model_type,
        "framework": "pytorch",
        "precision": "bf16",
        "optimizer": "adamw",
        "sequence_length": 4096,
        "global_batch_size": 512,
        "micro_batch_size": 1,
        "num_devices": n,
        "data_parallel": n,
        "tensor_parallel": 1,
        "pipeline_parallel": 1,
        "activation_checkpointing": True,
    }
    row.update(kw)
    return pd.DataFrame([row])


def _thr(frame: pd.DataFrame, hw: HardwareArrays, type_id: str) -> float:
    idx = np.array([hw.types.index(type_id)])
    return float(base_throughput(jobs_from_frame(frame), hw, idx)[0])


def test_large_dense_llm_faster_per_device_on_h100_than_a100() -> None:
    hw = HardwareArrays.from_catalog(load_catalog())
    job = _frame("llama-70b", 64, data_parallel=4, tensor_parallel=8, pipeline_parallel=2)
    h100, a100 = _thr(job, hw, "h100-sxm"), _thr(job, hw, "a100-80g")
    assert 1.8 < h100 / a100 < 3.3
    b200 = _thr(job, hw, "b200")
    assert b200 > h100
    # and in expectation over the simulated fleet (with lineage effects and noise)
    res = simulate(SimConfig(seed=21, days=1, rate=6000))
    t = res.truth.merge(res.submissions[["job_id", "attempt", "family", "parameters"]])
    t = t[(t["family"] == "dense_llm") & (t["parameters"] > 5e9)]
    wide = t.pivot_table(
        index=["job_id", "attempt"], columns="hardware_type", values="measured_samples_per_s"
    )
    both = wide[["h100-sxm", "a100-80g"]].dropna()
    assert len(both) >= 20
    assert np.log(both["h100-sxm"] / both["a100-80g"]).mean() > np.log(1.5)


def test_the_simulator_deploys_parts_as_the_catalog_says() -> None:
    """One source for the fleet's nodes and networks: the catalog the model's features read
    (a catalog that does not say gets a guess from the part)."""
    cat = load_catalog()
    hw = HardwareArrays.from_catalog(cat)
    for i, t in enumerate(hw.types):
        assert hw.node_size[i] == cat[t].scale_up_domain
        assert hw.network_gbps[i] == cat[t].network_gbps
    bare = HardwareCatalog(
        [replace(cat[t], scale_up_domain=None, network_gbps=None) for t in ("h100-sxm", "tpu-v4")]
    )
    guessed = HardwareArrays.from_catalog(bare)
    assert guessed.node_size.tolist() == [8, 4096]
    assert guessed.network_gbps.tolist() == [50.0, 12.5]


def _scaled(hw: HardwareArrays, i: int, *, flops: float = 1.0, bw: float = 1.0) -> HardwareArrays:
    peak = hw.peak_tflops.copy()
    band = hw.bandwidth_gbps.copy()
    peak[i] *= flops
    band[i] *= bw
    return replace(hw, peak_tflops=peak, bandwidth_gbps=band)


def test_recsys_gains_more_from_bandwidth_than_flops_and_llm_the_reverse() -> None:
    hw = HardwareArrays.from_catalog(load_catalog())
    i = hw.types.index("h100-sxm")
    idx = np.array([i])

    def gains(frame: pd.DataFrame) -> tuple[float, float]:
        job = jobs_from_frame(frame)
        base = base_throughput(job, hw, idx)[0]
        more_bw = base_throughput(job, _scaled(hw, i, bw=2.0), idx)[0]
        more_flops = base_throughput(job, _scaled(hw, i, flops=2.0), idx)[0]
        return float(more_bw / base), float(more_flops / base)

    rec = _frame(
        "dlrm-large",
        8,
        sequence_length=1,
        global_batch_size=65536,
        micro_batch_size=8192,
        precision="tf32",
        optimizer="adagrad",
        activation_checkpointing=False,
    )
    bw_gain, flop_gain = gains(rec)
    assert bw_gain > flop_gain and bw_gain > 1.3
    llm = _frame("llama-7b", 8, tensor_parallel=2, data_parallel=4, micro_batch_size=2)
    bw_gain, flop_gain = gains(llm)
    assert flop_gain > bw_gain and flop_gain > 1.4


def test_drift_changes_only_its_vendor_and_family() -> None:
    base = SimConfig(seed=3, days=2, rate=2000, drift_events=())
    event = DriftEvent(day=1, vendor="amd", family="dense_llm", factor=1.2)
    plain, drifted = simulate(base), simulate(replace(base, drift_events=(event,)))
    assert [e.to_dict(base.start)["vendor"] for e in drifted.drift_events] == ["amd"]
    t0 = plain.truth.merge(plain.submissions[["job_id", "attempt", "family", "submitted_at"]])
    t1 = drifted.truth
    assert t0[["job_id", "attempt", "hardware_type"]].equals(
        t1[["job_id", "attempt", "hardware_type"]]
    )
    ratio = t1["true_samples_per_s"].to_numpy() / t0["true_samples_per_s"].to_numpy()
    vendor = t0["hardware_type"].map(load_catalog().spec_matrix()["vendor"])
    day1 = (t0["submitted_at"] >= pd.Timestamp("2026-11-02", tz="UTC")).to_numpy()
    hit = day1 & (vendor == "amd").to_numpy() & (t0["family"] == "dense_llm").to_numpy()
    assert hit.sum() > 10
    # input-bound lineages (data loader cap) gain less: the cap does not move with the chip
    assert ((ratio[hit] > 1.0) & (ratio[hit] < 1.2 + 1e-9)).all()
    assert np.isclose(ratio[hit], 1.2).mean() > 0.7
    np.testing.assert_allclose(ratio[~hit], 1.0)


def test_random_drift_events_are_listed() -> None:
    sim = FleetSimulator(SimConfig(seed=1, days=30, rate=100, drift_rate=0.5))
    assert 5 <= len(sim.drift_events) <= 25
    assert all(1 <= e.day < 30 for e in sim.drift_events)
    mat = sim.drift_matrix(29)
    assert (mat != 1.0).sum() >= 3


def test_policy_changes_where_jobs_run_not_which_jobs_exist() -> None:
    cfg = SimConfig(seed=4, days=1, rate=2000)
    default = simulate(cfg)
    truth = default.truth
    best = truth.loc[truth.groupby(["job_id", "attempt"])["true_samples_per_s"].idxmax()]
    fastest = best.set_index(["job_id", "attempt"])["hardware_type"]

    def oracle(subs: pd.DataFrame) -> pd.Series:  # type: ignore[type-arg]
        keys = pd.MultiIndex.from_frame(subs[["job_id", "attempt"]])
        return pd.Series(fastest.reindex(keys).to_numpy(), index=subs.index)

    fast = simulate(cfg, policy=oracle)
    assert fast.submissions["job_id"].equals(default.submissions["job_id"])
    assert fast.truth.equals(default.truth)  # common random numbers
    assert fast.completions["device_hours"].sum() < 0.9 * default.completions["device_hours"].sum()
    assert (fast.dataset["hardware_type"] != fast.dataset["default_hardware"]).mean() > 0.5

    def bad(subs: pd.DataFrame) -> pd.Series:  # type: ignore[type-arg]
        return pd.Series("not-a-type", index=subs.index)

    worse = simulate(cfg, policy=bad)
    assert worse.invalid_choices == len(worse.submissions)
    assert worse.completions["hardware_type"].equals(default.completions["hardware_type"])


def test_summary_fields(small: SimResult) -> None:
    s = small.summary()
    for key in ("submissions", "completions", "hardware_types", "vendors", "model_types"):
        assert s[key] > 0
    assert s["vendors"] == 5
    assert s["submissions_with_prior"] == int(small.submissions["has_prior"].sum())
    assert abs(s["submissions"] - SMALL.rate * SMALL.days) < 0.02 * SMALL.rate * SMALL.days


def test_dataset_rows_equal_what_the_offline_store_builds_from_the_events(
    small: SimResult,
) -> None:
    """The trainer must see the same rows from simulator frames and from replayed telemetry."""
    from leap_stream.store.offline import flatten

    subs = submission_events(small.submissions)
    comps = {(e["job_id"], e["attempt"]): e for e in completion_events(small.completions)}
    ds = small.dataset.set_index(["job_id", "attempt"], drop=False)
    for sub in subs[::17]:
        key = (sub["job_id"], sub["attempt"])
        row = flatten(sub, comps[key])
        expected = ds.loc[key]
        for col in DATASET_COLUMNS:
            a, b = row[col], expected[col]
            if isinstance(a, float) and np.isnan(a):
                assert pd.isna(b), col
            else:
                assert a == b, (col, a, b)


def test_hardware_from_keeps_a_type_out_until_its_day() -> None:
    from leap_stream.tools.sim.config import SimConfig
    from leap_stream.tools.sim.fleet import simulate

    plain = simulate(SimConfig(seed=2, days=3, rate=600))
    same = simulate(SimConfig(seed=2, days=3, rate=600, hardware_from=()))
    assert plain.truth.equals(same.truth)  # no entry: the same fleet, draw for draw
    res = simulate(SimConfig(seed=2, days=4, rate=800, hardware_from=(("mi355x", 2),)))
    subs = res.submissions
    day = (subs["submitted_at"] - subs["submitted_at"].min()).dt.days.to_numpy()
    offered = subs["candidate_hardware"].str.split("|").apply(lambda c: "mi355x" in c)
    assert not offered[day < 2].any() and offered[day >= 2].any()
    assert not (subs["default_hardware"][day < 2] == "mi355x").any()
    key = ["job_id", "attempt"]
    early = res.truth.merge(subs.loc[day < 2, key], on=key)  # attempts submitted before day 2
    assert len(early) and not (early["hardware_type"] == "mi355x").any()
    with pytest.raises(ValueError, match="catalog lacks"):
        simulate(SimConfig(seed=2, days=1, rate=100, hardware_from=(("no-such", 1),)))


def test_submissions_carry_their_users_estimate_of_the_work() -> None:
    """`planned_samples`: the attempt's planned work on its default type, off by the user's
    lognormal error (σ 0.5); a job that succeeded on its default type processed its planned
    work, so the estimate over what it processed is that error alone."""
    sim = simulate(SimConfig(seed=3, days=1, rate=3000))
    subs, comps = sim.submissions, sim.completions
    planned = subs["planned_samples"].to_numpy(np.float64)
    assert np.isfinite(planned).all() and (planned > 0).all()
    events = submission_events(subs.head(50))  # schema-valid: test_every_event_is_schema_valid
    assert [e["training"]["planned_samples"] for e in events] == planned[:50].tolist()
    done = comps.merge(subs, on=["job_id", "attempt"], suffixes=("", "_sub"))
    done = done[
        (done["status"] == "succeeded") & (done["hardware_type"] == done["default_hardware"])
    ]
    processed = done["steps"].to_numpy(np.float64) * done["global_batch_size"].to_numpy(np.float64)
    error = np.log(done["planned_samples"].to_numpy(np.float64) / processed)
    assert len(error) > 500
    assert abs(float(np.median(error))) < 0.1
    assert 0.4 < float(np.std(error)) < 0.6


def test_a_probe_measures_the_day_s_truth_on_the_whole_job_and_more_per_device_on_a_slice() -> None:
    """`ShortRuns`: a whole-job probe (the job's own data-parallel degree) measures the day's
    true rate within a short run's noise; one replica of a data-parallel job runs no
    all-reduce, so it measures more per device; its dataset row has the slice's shape."""
    from leap_stream.core.probe import probe_noise
    from leap_stream.tools.sim.short_runs import probe_dataset_rows

    sim = FleetSimulator(SimConfig(seed=4, days=1, rate=2000))
    day = sim.step_day()
    runs = sim.short_runs
    assert runs is not None
    subs = day.submissions
    truth = day.truth.set_index(["job_id", "attempt", "hardware_type"])["true_samples_per_s"]
    dp = subs["data_parallel"].to_numpy(np.int64)
    at = np.flatnonzero(dp >= 8)[:50]
    types = [str(subs["candidate_hardware"].iloc[j]).split("|")[0] for j in at.tolist()]
    whole = runs.measure(at, types, 5.0, dp[at])
    true = np.asarray(
        [
            truth[(subs["job_id"].iloc[j], subs["attempt"].iloc[j], t)]
            for j, t in zip(at, types, strict=True)
        ]
    )
    assert np.abs(np.log(whole / true)).max() < 5 * probe_noise(5.0)
    one = runs.measure(at, types, 5.0, np.ones(len(at), np.int64))
    per_device = (one / (subs["num_devices"].to_numpy()[at] // dp[at])) / (
        whole / subs["num_devices"].to_numpy()[at]
    )
    assert np.median(per_device) > 1.01
    rows = probe_dataset_rows(
        subs, at, types, one, 5.0, [*subs.columns, "probe"], np.ones(len(at), np.int64)
    )
    assert (rows["data_parallel"] == 1).all() and rows["probe"].all()
    assert (rows["num_devices"].to_numpy() * dp[at] == subs["num_devices"].to_numpy()[at]).all()
