"""The SkyPilot policy's pure parts: a task's options, the plan, the rewrite, the estimator, and
the HTTP answer (SkyPilot's double-encoded JSON) with a stand-in ranker."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson
import pytest
import yaml
from fastapi.testclient import TestClient

from leap_stream.contracts.job_spec import spec_of
from leap_stream.schedulers.skypilot import (
    JOB_ID_ENV,
    PREDICTIONS_ENV,
    SPEC_ENV,
    Plan,
    hardware_type,
    options_of,
    plan,
    policy_answer,
    rewrite,
    time_estimator,
)
from leap_stream.stream.serve import create_app

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "schemas" / "examples" / "job-submitted" / "valid" / "llama-70b-64xh100.json"
NOW = datetime(2026, 12, 3, 12, tzinfo=UTC)


def _task(resources: dict[str, Any], **envs: str) -> dict[str, Any]:
    event = orjson.loads(EXAMPLE.read_bytes())
    spec = orjson.dumps(spec_of(event)).decode()
    return {"name": "t", "resources": resources, "envs": {SPEC_ENV: spec, **envs}, "run": "x"}


def _ranking(types: list[str], job_id: str = "skypilot/t/1") -> dict[str, Any]:
    return {
        "job_id": job_id,
        "source": "model",
        "model_version": "v3",
        "candidates": [
            {
                "hardware_type": t,
                "rank": i + 1,
                "predicted_throughput": 100.0 * (i + 1),
                "interval": None,
                "cost_per_device_hour": 2.0,
                "num_devices": 8,
            }
            for i, t in enumerate(types)
        ],
    }


def test_accelerator_names() -> None:
    assert hardware_type("H100") == "h100-sxm" and hardware_type("a100-80gb") == "a100-80g"
    assert hardware_type("tpu-v5p-128") == "tpu-v5p" and hardware_type("tpu-v5litepod-8")
    assert hardware_type("Trainium2") == "trn2" and hardware_type("K520") is None


@pytest.mark.parametrize(
    "resources",
    [
        {"accelerators": {"H100": 8, "MI300X": 8}, "disk_size": 100},
        {"accelerators": ["H100:8", "MI300X:8"], "disk_size": 100},
        {"any_of": [{"accelerators": "H100:8"}, {"accelerators": "MI300X:8"}], "disk_size": 100},
        {"ordered": [{"accelerators": {"H100": 8}, "disk_size": 100}, {"accelerators": "MI300X:8", "disk_size": 100}]},
    ],
)  # fmt: skip
def test_every_way_of_writing_the_options(resources: dict[str, Any]) -> None:
    opts = options_of(resources)
    assert [(o.accelerator, o.count, o.hardware_type) for o in opts] == [
        ("H100", 8, "h100-sxm"),
        ("MI300X", 8, "mi300x"),
    ]
    assert all(o.fields == {"disk_size": 100} for o in opts)


@pytest.mark.parametrize(
    "task, why",
    [
        ({"resources": {"accelerators": {"H100": 8, "MI300X": 8}}}, "no LEAP_JOB_SPEC"),
        (_task({"accelerators": "H100:8"}), "nothing to choose"),
        (_task({"accelerators": {"H100": 8, "K520": 1}}), "no hardware type"),
        ({**_task({}), "envs": {SPEC_ENV: "[1]"}}, "not ranked"),
    ],
)
def test_tasks_that_are_not_ranked_say_why(task: dict[str, Any], why: str) -> None:
    got = plan(task, NOW)
    assert isinstance(got, str) and why in got


def test_rewrite_orders_by_the_ranking_and_keeps_the_rest() -> None:
    task = _task(
        {"accelerators": {"H100": 8, "MI300X": 8, "A100-80GB": 8}, "disk_size": 100},
        LEAP_TOTAL_SAMPLES="720000",
    )
    p = plan(task, NOW)
    assert isinstance(p, Plan)
    assert p.submission["candidate_hardware"] == ["h100-sxm", "mi300x", "a100-80g"]
    out = rewrite(task, p, _ranking(["mi300x", "h100-sxm"], p.submission["job_id"]))
    assert out["resources"] == {
        "ordered": [
            {"disk_size": 100, "accelerators": {"MI300X": 8}},
            {"disk_size": 100, "accelerators": {"H100": 8}},
            {"disk_size": 100, "accelerators": {"A100-80GB": 8}},  # unranked: last
        ]
    }
    assert out["envs"][JOB_ID_ENV] == p.submission["job_id"] and out["run"] == "x"
    predictions = orjson.loads(out["envs"][PREDICTIONS_ENV])
    assert predictions["by_accelerator"]["MI300X"]["runtime_s"] == pytest.approx(7200.0)
    assert predictions["by_accelerator"]["MI300X"]["cost_usd"] == pytest.approx(32.0)
    assert predictions["by_accelerator"]["A100-80GB"] == {
        "hardware_type": "a100-80g",
        "ranked": False,
    }
    # the estimator: seconds per option, the unranked one never preferred
    estimate = time_estimator(out["envs"][PREDICTIONS_ENV])

    class Res:
        def __init__(self, name: str) -> None:
            self.accelerators = {name: 8}

    assert estimate(Res("MI300X")) == pytest.approx(7200.0)
    assert estimate(Res("H100")) == pytest.approx(3600.0)
    assert estimate(Res("A100-80GB")) == estimate(Res("MI300X"))
    assert time_estimator(predictions, total_samples=1e6)(Res("H100")) == pytest.approx(5000.0)
    # a ranking that ranks none of them changes nothing
    assert rewrite(task, p, _ranking(["tpu-v5p"])) == task


def _request(task: dict[str, Any]) -> bytes:
    body = {"task": yaml.safe_dump(task), "skypilot_config": "{}\n", "request_name": "launch"}
    return orjson.dumps(orjson.dumps(body).decode())  # what RestfulAdminPolicy posts


def test_policy_answer_is_encoded_the_way_skypilot_decodes_it() -> None:
    task = _task({"accelerators": {"H100": 8, "MI300X": 8}})
    ranked: list[bytes] = []

    async def rank(submission: bytes) -> dict[str, Any]:
        ranked.append(submission)
        return _ranking(["mi300x", "h100-sxm"], orjson.loads(submission)["job_id"])

    status, body, outcome = asyncio.run(policy_answer(_request(task), rank, NOW))
    assert (status, outcome) == (200, "ranked") and len(ranked) == 1
    mutated = orjson.loads(orjson.loads(body))
    assert mutated["skypilot_config"] == "{}\n"
    order = [o["accelerators"] for o in yaml.safe_load(mutated["task"])["resources"]["ordered"]]
    assert order == [{"MI300X": 8}, {"H100": 8}]

    async def refuse(_submission: bytes) -> dict[str, Any]:
        return {"error": {"kind": "schema", "message": "no"}}

    status, body, outcome = asyncio.run(policy_answer(_request(task), refuse, NOW))
    assert status == 200 and "schema" in outcome
    assert yaml.safe_load(orjson.loads(orjson.loads(body))["task"]) == task
    status, body, outcome = asyncio.run(policy_answer(b'"not yaml: ["', rank, NOW))
    assert status == 422 and orjson.loads(body)["error"]["kind"] == "not_skypilot_request"


class _Service:
    """Stands in for RankService: ranks every submission the same way."""

    async def rank(self, bodies: list[bytes]) -> list[dict[str, Any]]:
        return [_ranking(["mi300x", "h100-sxm"], orjson.loads(b)["job_id"]) for b in bodies]

    def ready(self) -> dict[str, Any]:
        return {"ready": True}


def test_the_policy_endpoint_takes_the_token_in_the_query() -> None:
    app = create_app(_Service(), frozenset({"s3cret"}))  # type: ignore[arg-type]
    body = _request(_task({"accelerators": {"H100": 8, "MI300X": 8}}))
    with TestClient(app) as client:
        assert client.post("/v1/skypilot/policy", content=body).status_code == 401
        assert client.post("/v1/skypilot/policy?token=nope", content=body).status_code == 401
        ok = client.post("/v1/skypilot/policy?token=s3cret", content=body)
        assert ok.status_code == 200
        head = client.post(
            "/v1/skypilot/policy", content=body, headers={"Authorization": "Bearer s3cret"}
        )
        assert head.status_code == 200

    def order(resp: Any) -> list[Any]:
        return yaml.safe_load(orjson.loads(resp.json())["task"])["resources"]["ordered"]

    assert (
        order(ok) == order(head) == [{"accelerators": {"MI300X": 8}}, {"accelerators": {"H100": 8}}]
    )
