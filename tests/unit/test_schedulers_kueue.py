"""The Kueue gate's decision (pure) and its controller loop against an in-memory API server.

Nothing here talks to a real cluster: the controller is untested against a live one."""

from __future__ import annotations

import copy
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson
import pytest

from leap_stream.contracts.job_spec import spec_of
from leap_stream.schedulers.kueue import (
    ALLOWED_ANNOTATION,
    DECISION_ANNOTATION,
    GATE_ANNOTATION,
    GATE_NAME,
    NODE_LABEL,
    SPEC_ANNOTATION,
    GateController,
    decide,
    gated,
    submission_of,
)

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "schemas" / "examples" / "job-submitted" / "valid" / "llama-70b-64xh100.json"
NOW = datetime(2026, 12, 3, 12, tzinfo=UTC)


def _job(name: str = "train", gates: str = GATE_NAME, affinity: Any = None) -> dict[str, Any]:
    event = orjson.loads(EXAMPLE.read_bytes())
    spec = spec_of(event)
    pod: dict[str, Any] = {"containers": [{"name": "c", "image": "i"}]}
    if affinity is not None:
        pod["affinity"] = affinity
    return {
        "metadata": {
            "name": name,
            "namespace": "ml",
            "uid": "0123456789abcdef",
            "labels": {"leap-stream.io/rank": "true"},
            "annotations": {
                GATE_ANNOTATION: gates,
                SPEC_ANNOTATION: orjson.dumps(spec).decode(),
                ALLOWED_ANNOTATION: "h100-sxm, mi300x,h200",
            },
        },
        "spec": {"suspend": True, "template": {"spec": pod}},
    }


def _ranking(types: list[str]) -> dict[str, Any]:
    return {
        "job_id": "k8s/ml/train/01234567",
        "source": "model",
        "candidates": [{"hardware_type": t, "rank": i + 1} for i, t in enumerate(types)],
    }


def test_a_gated_job_becomes_a_submission() -> None:
    job = _job()
    assert gated(job) and not gated(_job(gates="other.io/gate"))
    sub = submission_of(job, NOW)
    assert isinstance(sub, dict)
    assert sub["job_id"] == "k8s/ml/train/01234567"
    assert sub["candidate_hardware"] == ["h100-sxm", "mi300x", "h200"]
    bad = _job()
    bad["metadata"]["annotations"][SPEC_ANNOTATION] = "{nope"
    assert "job spec" in str(submission_of(bad, NOW))
    del bad["metadata"]["annotations"][ALLOWED_ANNOTATION]
    assert ALLOWED_ANNOTATION in str(submission_of(bad, NOW))


def test_decide_sets_the_top_k_and_releases_the_gate() -> None:
    patch = decide(_job(), _ranking(["b200", "mi300x", "h200", "h100-sxm"]), k=2)
    annotations = patch["metadata"]["annotations"]
    assert annotations[GATE_ANNOTATION] is None  # the last gate: the annotation goes
    assert annotations[DECISION_ANNOTATION].startswith("types=mi300x,h200;")
    terms = patch["spec"]["template"]["spec"]["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"
    ]["nodeSelectorTerms"]
    assert terms == [
        {"matchExpressions": [{"key": NODE_LABEL, "operator": "In", "values": ["mi300x", "h200"]}]}
    ]


def test_decide_ands_into_every_existing_term_and_keeps_other_gates() -> None:
    zone = {"key": "zone", "operator": "In", "values": ["a"]}
    old = {"key": NODE_LABEL, "operator": "In", "values": ["t4"]}
    affinity = {
        "podAntiAffinity": {"x": 1},
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [{"matchExpressions": [zone, old]}, {"matchFields": [1]}]
            }
        },
    }
    job = _job(gates=f"other.io/quota, {GATE_NAME}", affinity=affinity)
    before = copy.deepcopy(job)
    patch = decide(job, _ranking(["h200"]), node_label=NODE_LABEL)
    assert job == before  # the job itself is not touched
    assert patch["metadata"]["annotations"][GATE_ANNOTATION] == "other.io/quota"
    new = patch["spec"]["template"]["spec"]["affinity"]
    assert new["podAntiAffinity"] == {"x": 1}
    terms = new["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"
    ]
    expr = {"key": NODE_LABEL, "operator": "In", "values": ["h200"]}
    assert terms == [
        {"matchExpressions": [zone, expr]},
        {"matchFields": [1], "matchExpressions": [expr]},
    ]


@pytest.mark.parametrize(
    "ranking", [None, _ranking(["b200"]), {**_ranking(["h200"]), "source": "none"}]
)
def test_without_a_usable_ranking_the_job_is_released_as_it_is(ranking: Any) -> None:
    patch = decide(_job(), ranking, why="rank failed")
    assert "spec" not in patch
    assert patch["metadata"]["annotations"][GATE_ANNOTATION] is None
    assert patch["metadata"]["annotations"][DECISION_ANNOTATION].startswith("unranked;")


class _API:
    """In-memory jobs with JSON merge patch semantics for the fields the controller patches."""

    def __init__(self, jobs: list[dict[str, Any]]) -> None:
        self.jobs = {j["metadata"]["name"]: j for j in jobs}
        self.patches: list[tuple[str, Mapping[str, Any]]] = []

    def list_jobs(self, label_selector: str) -> list[dict[str, Any]]:
        key, _, value = label_selector.partition("=")
        return [j for j in self.jobs.values() if j["metadata"]["labels"].get(key) == value]

    def patch_job(self, namespace: str, name: str, patch: Mapping[str, Any]) -> None:
        self.patches.append((name, patch))
        _merge(self.jobs[name], patch)


def _merge(target: dict[str, Any], patch: Mapping[str, Any]) -> None:
    for key, value in patch.items():
        if value is None:
            target.pop(key, None)
        elif isinstance(value, Mapping) and isinstance(target.get(key), dict):
            _merge(target[key], value)
        else:
            target[key] = copy.deepcopy(value)


def test_the_controller_releases_each_gated_job_once_even_when_ranking_fails() -> None:
    api = _API([_job("a"), _job("b"), _job("c", gates="other.io/gate")])
    calls: list[bytes] = []

    def rank(submission: bytes) -> Mapping[str, Any]:
        calls.append(submission)
        if orjson.loads(submission)["job_id"].startswith("k8s/ml/b/"):
            raise ConnectionError("serve down")
        return _ranking(["mi300x"])

    controller = GateController(api, rank, clock=lambda: NOW)
    assert controller.run_once() == 2 and len(calls) == 2
    assert controller.run_once() == 0  # released jobs are not gated any more
    a, b, c = (api.jobs[n] for n in "abc")
    assert GATE_ANNOTATION not in a["metadata"]["annotations"]
    assert a["spec"]["template"]["spec"]["affinity"]["nodeAffinity"]
    assert b["metadata"]["annotations"][DECISION_ANNOTATION].startswith("unranked;rank failed")
    assert "affinity" not in b["spec"]["template"]["spec"]
    assert c["metadata"]["annotations"][GATE_ANNOTATION] == "other.io/gate"
