"""The simulator's model catalog is large, covers every family and is internally consistent."""

from __future__ import annotations

import numpy as np

from leap_stream.contracts.vocab import FAMILIES
from leap_stream.tools.sim.models import model_catalog


def test_at_least_300_model_types_over_all_families() -> None:
    m = model_catalog()
    assert len(m) >= 300
    assert m["model_type"].is_unique
    assert set(m["family"]) == set(FAMILIES)
    assert m.groupby("family").size().min() >= 20


def test_sizes_and_costs_are_consistent() -> None:
    m = model_catalog()
    for col in ("parameters", "active_parameters", "flops_per_unit", "act_mem_per_unit"):
        assert (m[col] > 0).all(), col
    assert (m["active_parameters"] <= m["parameters"]).all()
    moe = m[m["family"] == "moe_llm"]
    assert (moe["active_parameters"] < moe["parameters"]).all()
    assert (m["seq_min"] <= m["seq_max"]).all() and (m["batch_min"] <= m["batch_max"]).all()
    llm = m.set_index("model_type")
    # ~6·N FLOPs per token for LLM training
    assert np.isclose(llm.loc["llama-7b", "flops_per_unit"], 6 * llm.loc["llama-7b", "parameters"])
    assert 6e9 < llm.loc["llama-7b", "parameters"] < 7.5e9
    assert 40e9 < llm.loc["mixtral-8x7b", "parameters"] < 50e9
    assert (
        llm.loc["mixtral-8x7b", "active_parameters"] < 0.35 * llm.loc["mixtral-8x7b", "parameters"]
    )
    # recsys: most parameters are embedding rows, few FLOPs per byte moved
    rec = m[m["family"] == "recsys"]
    assert (rec["embedding_params"] > 0.9 * rec["parameters"]).all()
    assert (rec["flops_per_unit"] / rec["fixed_bytes"]).median() < 60
    assert set(m["frameworks"].str.split("|").explode()) <= {"pytorch", "jax", "tensorflow"}
