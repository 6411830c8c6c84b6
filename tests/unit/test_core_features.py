"""Feature builder: point-in-time history features, spec ratios, fit check, vectorised shapes."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from leap_stream.core import features as F
from leap_stream.core.history import Measurement, TypeAggregate
from leap_stream.core.physics import min_memory_per_device_gib
from leap_stream.tools import synthetic_rows as S

NOW = 1_800_000_000.0


def _jobs(n: int = 2, **over: object) -> pd.DataFrame:
    d = S.dataset(50, seed=3).iloc[:n].reset_index(drop=True)
    for k, v in over.items():
        d[k] = v
    return d


def test_shapes_and_order_follow_candidates() -> None:
    jobs = _jobs(2)
    cands = [["l4", "h100-sxm"], ["a100-80g", "mi300x", "tpu-v5e"]]
    fr = F.build(jobs, cands, [None, None], [None, None], S.SPECS, np.full(2, NOW))
    assert fr["job"].tolist() == [0, 0, 1, 1, 1]
    assert fr["hardware_type"].tolist() == ["l4", "h100-sxm", "a100-80g", "mi300x", "tpu-v5e"]
    assert set(F.ALL_FEATURES) <= set(fr.columns)
    # no history at all: every history feature is NaN
    for c in F.GROUPS["prior"]:
        if c != "hist_types":
            assert fr[c].isna().all(), c
    assert (fr["hist_types"] == 0).all()


def test_self_prior_is_per_device_and_other_is_most_similar_type() -> None:
    jobs = _jobs(1, num_devices=8)
    hist = {
        "h100-sxm": Measurement(800.0, 4, NOW - 2 * 86400, 3),
        "l4": Measurement(100.0, 8, NOW - 86400, 1),
        "mi300x": Measurement(900.0, 8, NOW - 3600, 2),
    }
    cands = [["h100-sxm", "a100-80g"]]
    fr = F.build(jobs, cands, [hist], [None], S.SPECS, np.asarray([NOW]))
    h100 = fr.iloc[0]
    assert math.isclose(h100["self_log_pd"], math.log(800.0 / 4))
    assert math.isclose(h100["self_log_dev_ratio"], math.log(8 / 4))
    assert h100["self_count"] == 3
    assert math.isclose(h100["self_age_days"], 2.0)
    assert h100["hist_types"] == 3
    # for h100 the most similar *other* type by FLOP/s + bandwidth is mi300x, not l4
    # (the only other nvidia part, l4, is farther than the vendor penalty)
    assert math.isclose(h100["other_log_pd"], math.log(900.0 / 8))
    assert h100["other_log_dev_ratio"] == 0.0  # mi300x ran on 8, as now
    specs = S.SPECS
    flops_ratio = math.log(
        specs.loc["h100-sxm", "peak_bf16_tflops"] / specs.loc["mi300x", "peak_bf16_tflops"]
    )
    assert math.isclose(h100["other_log_flops_ratio"], flops_ratio)
    a100 = fr.iloc[1]
    assert math.isnan(a100["self_log_pd"])
    assert math.isclose(a100["other_log_pd"], math.log(800.0 / 4))  # h100 is nearest to a100
    assert math.isclose(a100["other_log_dev_ratio"], math.log(8 / 4))  # h100 ran on 4


def test_aggregate_ratio_between_candidate_and_prior_hardware() -> None:
    jobs = _jobs(1)
    hist = {"l4": Measurement(10.0, 1, NOW - 10, 1)}
    aggs = {
        "l4": TypeAggregate(math.log(10.0), 5, NOW - 10),
        "h100-sxm": TypeAggregate(math.log(60.0), 7, NOW - 10),
    }
    fr = F.build(jobs, [["h100-sxm"]], [hist], [aggs], S.SPECS, np.asarray([NOW]))
    row = fr.iloc[0]
    assert math.isclose(row["agg_ratio"], math.log(6.0))
    assert row["agg_cand_count"] == 7
    # the prior hardware's copies of the booster inputs
    assert row["o_hardware_type"] == "l4"
    assert math.isclose(row["o_agg_cand"], math.log(10.0)) and row["o_agg_cand_count"] == 5
    assert math.isclose(row["o_log_peak_tflops"], math.log(S.SPECS.loc["l4", "peak_bf16_tflops"]))
    # physics: faster hardware, faster rate
    assert row["log_phys_rate"] > row["o_log_phys_rate"]


def test_same_vendor_prior_is_preferred() -> None:
    jobs = _jobs(1)
    hist = {
        "mi300x": Measurement(900.0, 8, NOW - 3600, 2),  # amd, spec-closer to h100
        "a100-80g": Measurement(500.0, 8, NOW - 3600, 2),  # nvidia
    }
    fr = F.build(jobs, [["h100-sxm"]], [hist], [None], S.SPECS, np.asarray([NOW]))
    assert fr.iloc[0]["o_hardware_type"] == "a100-80g"


def test_memory_fit_check_excludes_small_devices() -> None:
    jobs = _jobs(1, parameters=7e10, active_parameters=7e10, num_devices=1)
    fr = F.build(jobs, [["l4", "mi300x"]], [None], [None], S.SPECS, np.asarray([NOW]))
    assert fr["fits"].tolist() == [False, False]  # 70B params × 16 B/param on one device
    jobs = _jobs(1, parameters=7e10, active_parameters=7e10, num_devices=32)
    fr = F.build(jobs, [["l4", "mi300x"]], [None], [None], S.SPECS, np.asarray([NOW]))
    assert fr["fits"].tolist() == [False, True]  # fully sharded over 32: 35 GB each
    jobs = _jobs(1, parameters=1e8, active_parameters=1e8)
    fr = F.build(jobs, [["l4", "mi300x"]], [None], [None], S.SPECS, np.asarray([NOW]))
    assert fr["fits"].tolist() == [True, True]


def _comm(specs: pd.DataFrame, devices: int) -> pd.DataFrame:
    jobs = _jobs(
        1, num_devices=devices, data_parallel=devices, tensor_parallel=1, pipeline_parallel=1
    )
    return F.build(jobs, [["h100-sxm"]], [None], [None], specs, np.asarray([NOW]))


def test_an_all_reduce_past_the_scale_up_domain_crosses_the_network() -> None:
    """8 devices of an 8-GPU node all-reduce over NVLink; 16 span two nodes and the gradient
    crosses the 50 GB/s network instead. Per sample, the ring's volume grows by 15/16 over 7/8
    and each device's share of the same global batch halves."""
    specs = S.SPECS.assign(scale_up_domain=8.0, network_gbps=50.0)
    inside, across = _comm(specs, 8), _comm(specs, 16)
    assert inside["log_domains"].item() == 0.0
    assert across["log_domains"].item() == pytest.approx(math.log(2))
    assert across["log_network"].item() == pytest.approx(math.log(50))
    gap = across["log_t_comm"].item() - inside["log_t_comm"].item()
    assert gap == pytest.approx(math.log(900 / 50 * (15 / 16) / (7 / 8) * 2), rel=1e-5)
    assert across["log_phys_rate"].item() < inside["log_phys_rate"].item()
    # a catalog that does not say how the part is deployed: the scale-up link throughout
    old = _comm(S.SPECS, 16)
    assert math.isnan(old["log_domains"].item()) and math.isnan(old["log_network"].item())
    assert old["log_t_comm"].item() == pytest.approx(
        inside["log_t_comm"].item() + gap - math.log(18), rel=1e-5
    )


def _state_gib(**over: object) -> float:
    """`min_memory_per_device_gib` of one job whose activations are negligible."""
    tiny = {
        "micro_batch_size": 1,
        "sequence_length": 1,
        "hidden_size": 1,
        "layers": 1,
        "num_devices": 1,
    }
    return float(min_memory_per_device_gib(_jobs(1, **{**tiny, **over}))[0])


def test_the_memory_lower_bound_counts_what_every_sharding_must_keep() -> None:
    gib = 1e9 / 2**30
    # mixed precision: 16-bit weights and gradients, Adam's moments and the fp32 master copy
    bf16 = _state_gib(parameters=1e9, precision="bf16", optimizer="adam", family="dense_llm")
    assert bf16 == pytest.approx(16 * gib, rel=1e-6)
    # fp32 weights are their own master copy: 4 + 4 + 8, not 4 + 4 + 12
    fp32 = _state_gib(parameters=1e9, precision="fp32", optimizer="adam", family="dense_llm")
    assert fp32 == pytest.approx(16 * gib, rel=1e-6)
    # a recommender's parameters are embedding tables (sparse gradients, row-wise optimizer
    # state): its weights alone, sharded over the devices
    rec = _state_gib(
        parameters=8e9, precision="fp32", optimizer="adam", family="recsys", num_devices=8
    )
    assert rec == pytest.approx(4 * gib, rel=1e-6)


def test_a_type_the_lineage_ran_on_fits_whatever_the_estimate() -> None:
    jobs = _jobs(1, parameters=7e10, active_parameters=7e10, num_devices=2)
    cands, now = [["l4", "mi300x"]], np.asarray([NOW])
    for devices_then, fits_l4 in ((2, True), (1, True), (4, False)):
        hist = {"l4": Measurement(10.0, devices_then, NOW - 3600, 1)}
        fr = F.build(jobs, cands, [hist], [None], S.SPECS, now)
        # on more devices then, each held less than it would now: no evidence
        assert fr["fits"].tolist() == [fits_l4, False], devices_then


def test_unknown_hardware_and_unknown_history_type_do_not_break() -> None:
    jobs = _jobs(1)
    hist = {"retired-gpu": Measurement(5.0, 1, NOW - 5, 1)}
    fr = F.build(jobs, [["nope", "l4"]], [hist], [None], S.SPECS, np.asarray([NOW]))
    assert fr["known"].tolist() == [False, True]
    assert fr["log_peak_tflops"].isna().tolist() == [True, False]
    assert fr["other_log_pd"].isna().all()


def test_vectorised_build_matches_one_job_at_a_time() -> None:
    d = S.dataset(300, seed=5)
    from leap_stream.train import pit

    snap = pit.replay(d, d)
    cands = [list(S.SPECS.index)] * len(d)
    whole = F.build(d, cands, snap.histories, snap.aggregates, S.SPECS, snap.now)
    for i in (0, 100, 250, 299):
        one = F.build(
            d.iloc[[i]].reset_index(drop=True),
            [cands[i]],
            [snap.histories[i]],
            [snap.aggregates[i]],
            S.SPECS,
            snap.now[[i]],
        )
        part = whole[whole["job"] == i].reset_index(drop=True)
        num = [c for c in F.ALL_FEATURES if pd.api.types.is_float_dtype(one[c])]
        np.testing.assert_allclose(part[num].to_numpy(), one[num].to_numpy(), equal_nan=True)


def test_shared_and_copied_history_dicts_give_the_same_frame() -> None:
    """Distinct dicts are flattened once (identity dedupe); copies must not change anything."""
    jobs = _jobs(4)
    h = {
        "h100-sxm": Measurement(800.0, 4, NOW - 2 * 86400, 3),
        "mi300x": Measurement(900.0, 8, NOW - 3600, 2),
    }
    a = {"h100-sxm": TypeAggregate(3.1, 5, NOW - 100), "l4": TypeAggregate(1.2, 2, NOW - 50)}
    other = {"l4": Measurement(50.0, 1, NOW - 60, 1)}
    cands = [["h100-sxm", "l4", "mi300x"]] * 4
    shared = F.build(jobs, cands, [h, h, other, h], [a, a, a, None], S.SPECS, np.full(4, NOW))
    copies = F.build(
        jobs,
        cands,
        [dict(h), dict(h), dict(other), dict(h)],
        [dict(a), dict(a), dict(a), None],
        S.SPECS,
        np.full(4, NOW),
    )
    pd.testing.assert_frame_equal(shared, copies)
    assert math.isclose(shared.loc[1, "agg_cand"], 1.2)  # job 0, l4
    assert np.isnan(shared.loc[9, "agg_cand"])  # job 3 has no aggregates
    assert shared.loc[6, "hist_types"] == 1 and shared.loc[0, "hist_types"] == 2
