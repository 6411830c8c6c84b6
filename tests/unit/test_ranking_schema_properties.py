"""Every ranking of a valid submission validates against hardware-ranking.schema.json, the
schema's extremes included: sizes at their bounds, parameters down to the smallest positive
double, every parallelism at its edge. A number the schema requires must be a number (a bound
that overflows to infinity encodes as null)."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import jsonschema
import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from leap_stream.catalog import load_catalog
from leap_stream.contracts import Ok, decode, encode
from leap_stream.core.lookup import LookupTable
from leap_stream.core.ranker import Ranker
from leap_stream.tools import synthetic_rows as S

ROOT = Path(__file__).resolve().parents[2]
SCHEMA = jsonschema.Draft202012Validator(
    json.loads((ROOT / "schemas" / "hardware-ranking.schema.json").read_text())
)
NOW = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
CATALOG = load_catalog()
HARDWARE = sorted(CATALOG.types)


@pytest.fixture(scope="module")
def ranker() -> Ranker:
    """A small model on the seeded synthetic dataset (any model will do: the claim is about
    the encoding of what it predicts, not its accuracy)."""
    train = S.dataset(3000, seed=7)
    model = S.fitted_model(train, num_rounds=20)
    return Ranker(CATALOG, model, LookupTable.fit(train))


def _edge(low: float, high: float, integer: bool = True) -> st.SearchStrategy[Any]:
    """The bounds themselves, often, and anything between."""
    inside = st.integers(int(low), int(high)) if integer else st.floats(low, high)
    return st.sampled_from([low, high] if not integer else [int(low), int(high)]) | inside


@st.composite
def extreme_submissions(draw: st.DrawFn) -> dict[str, Any]:
    tp = draw(_edge(1, 1024))
    pp = draw(_edge(1, max(1, min(1024, 100_000 // tp))))
    dp = draw(_edge(1, max(1, 100_000 // (tp * pp))))
    global_batch = draw(_edge(1, 100_000_000))
    parameters = draw(
        st.sampled_from([5e-324, 1e-300, 1.0, 1e14]) | st.floats(5e-324, 1e14, allow_subnormal=True)
    )
    candidates = draw(st.lists(st.sampled_from(HARDWARE), min_size=1, max_size=8, unique=True))
    model: dict[str, Any] = {
        "family": draw(
            st.sampled_from(["dense_llm", "moe_llm", "encoder", "vision_cnn", "recsys"])
        ),
        "model_type": draw(st.sampled_from(["resnet-50", "never-seen-type"])),
        "parameters": parameters,
        "layers": draw(_edge(1, 10_000)),
        "hidden_size": draw(_edge(1, 1_000_000)),
        "sequence_length": draw(_edge(1, 10_000_000)),
        "precision": draw(st.sampled_from(["fp32", "tf32", "fp16", "bf16", "fp8"])),
        "optimizer": "adamw",
        "framework": "pytorch",
        "framework_version": "2.5",
    }
    return {
        "schema_version": 1,
        "event_id": "sub-extreme",
        "job_id": "job-extreme",
        "attempt": 1,
        "lineage_id": "lineage/extreme",
        "submitted_at": "2026-12-01T11:59:00Z",
        "team": "t",
        "model": model,
        "training": {
            "global_batch_size": global_batch,
            "micro_batch_size": draw(_edge(1, min(global_batch, 10_000_000))),
            "num_devices": dp * tp * pp,
            "data_parallel": dp,
            "tensor_parallel": tp,
            "pipeline_parallel": pp,
            "activation_checkpointing": draw(st.booleans()),
        },
        "candidate_hardware": candidates,
        "default_hardware": candidates[0],
    }


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(event=extreme_submissions())
def test_every_ranking_of_a_valid_submission_validates(ranker: Ranker, event: dict) -> None:
    decoded = decode(orjson.dumps(event), "job-submitted", max_bytes=1 << 20)
    assert isinstance(decoded, Ok), decoded  # the strategy makes valid submissions only
    [ranking] = ranker.rank_batch([decoded.event], [None], {}, NOW)
    out = orjson.loads(encode(ranking))
    errors = [f"{list(e.path)}: {e.message}" for e in SCHEMA.iter_errors(out)]
    assert not errors, (errors[:3], event["model"], event["training"])


def test_the_smallest_positive_parameter_count_ranks_with_finite_intervals(
    ranker: Ranker,
) -> None:
    """#39's case: `parameters` = 5e-324 is valid, and every candidate's interval had
    `high: null` (the widening for a job outside the training support overflowed exp)."""
    [path] = sorted((ROOT / "schemas" / "examples" / "job-submitted" / "valid").glob("llama-70b*"))
    event = orjson.loads(path.read_bytes())
    event["model"]["parameters"] = 5e-324
    event["model"].pop("active_parameters", None)
    decoded = decode(orjson.dumps(event), "job-submitted", max_bytes=1 << 20)
    assert isinstance(decoded, Ok), decoded
    [ranking] = ranker.rank_batch([decoded.event], [None], {}, NOW)
    out = orjson.loads(encode(ranking))
    assert out["source"] == "model" and out["candidates"]
    assert all(c["interval"]["high"] is not None for c in out["candidates"])
    assert not list(SCHEMA.iter_errors(out))
