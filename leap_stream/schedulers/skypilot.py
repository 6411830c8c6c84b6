"""SkyPilot: an admin policy that orders a task's accelerators by leap-stream's ranking.

SkyPilot calls an admin policy over REST (``RestfulAdminPolicy``) with the user's request: the
task as YAML. The task carries its job spec (contracts/job_spec.py) as a JSON string in the env
``LEAP_JOB_SPEC``; the accelerators the user allows are its resources (``accelerators: {H100: 8,
A100-80GB: 8}``, ``any_of`` or ``ordered``). The policy ranks the job and rewrites the resources
as an ``ordered`` list, best first (SkyPilot's own way of saying "try these in this order"),
keeping every other resource field of each option, and adds the predictions to the task's envs
(``LEAP_JOB_ID``, ``LEAP_PREDICTIONS``: throughput, interval, price and, when the task says how
many samples it trains in ``LEAP_TOTAL_SAMPLES``, the runtime and cost of each option).
`time_estimator` turns those predictions into a ``Task.set_time_estimator`` function, so
SkyPilot's optimizer compares candidates by predicted runtime instead of its one-hour default.

A task without a spec, with an accelerator leap-stream cannot name, or whose ranking says
nothing is returned unchanged: the policy never rejects a request. This module is pure (the
YAML is parsed by the caller); `leap-stream serve` serves it at ``POST /v1/skypilot/policy``.
"""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import orjson

from leap_stream.contracts.job_spec import JobSpecError, submission_from_spec
from leap_stream.core.placement import candidate_of, ranked_types

SPEC_ENV = "LEAP_JOB_SPEC"
TOTAL_SAMPLES_ENV = "LEAP_TOTAL_SAMPLES"
JOB_ID_ENV = "LEAP_JOB_ID"
PREDICTIONS_ENV = "LEAP_PREDICTIONS"

# SkyPilot's canonical accelerator names (lower case) -> catalog type ids
ACCELERATORS: dict[str, str] = {
    "t4": "t4",
    "v100": "v100-sxm",
    "a10g": "a10g",
    "a100": "a100-40g",
    "a100-80gb": "a100-80g",
    "l4": "l4",
    "l40s": "l40s",
    "rtx6000-ada": "rtx-6000-ada",
    "h100": "h100-sxm",
    "h100-80gb": "h100-sxm",
    "h100-mega": "h100-sxm",
    "h100-nvl": "h100-nvl",
    "h200": "h200",
    "b200": "b200",
    "gb200": "gb200",
    "mi250x": "mi250x",
    "mi300x": "mi300x",
    "mi325x": "mi325x",
    "mi355x": "mi355x",
    "trainium": "trn1",
    "trainium2": "trn2",
    "gaudi2": "gaudi2",
    "gaudi3": "gaudi3",
}
# TPU slices are named by their version and size (tpu-v5p-8): the version is the type
TPU_PREFIXES: dict[str, str] = {
    "tpu-v4-": "tpu-v4",
    "tpu-v5litepod-": "tpu-v5e",
    "tpu-v5e-": "tpu-v5e",
    "tpu-v5p-": "tpu-v5p",
    "tpu-v6e-": "tpu-v6e",
}


def hardware_type(accelerator: str) -> str | None:
    """The catalog type of a SkyPilot accelerator name, or None when leap-stream has none."""
    name = accelerator.strip().lower()
    if name in ACCELERATORS:
        return ACCELERATORS[name]
    return next((t for p, t in TPU_PREFIXES.items() if name.startswith(p)), None)


@dataclass(frozen=True)
class Option:
    """One accelerator choice of the task: its name and count as the user wrote them, the
    other resource fields of that choice, and its catalog type."""

    accelerator: str
    count: float
    fields: dict[str, Any]
    hardware_type: str


@dataclass(frozen=True)
class Plan:
    """What to rank (the submission) and the task's options to order by the ranking."""

    submission: dict[str, Any]
    options: list[Option]


def _accelerators(value: Any) -> list[tuple[str, float]]:
    if isinstance(value, str):
        name, _, count = value.partition(":")
        return [(name, float(count) if count else 1.0)]
    if isinstance(value, Mapping):
        return [(str(k), float(v if v is not None else 1)) for k, v in value.items()]
    if isinstance(value, list):
        return [pair for item in value for pair in _accelerators(item)]
    raise ValueError(f"accelerators {value!r} is neither a name, a mapping nor a list")


def options_of(resources: Mapping[str, Any]) -> list[Option]:
    """Every accelerator option of a task's resources (``any_of``/``ordered`` expanded)."""
    base = {k: v for k, v in resources.items() if k not in ("any_of", "ordered", "accelerators")}
    choices = resources.get("ordered") or resources.get("any_of") or [resources]
    options = []
    for choice in choices:
        fields = {**base, **{k: v for k, v in choice.items() if k != "accelerators"}}
        for name, count in _accelerators(choice.get("accelerators")):
            hw = hardware_type(name)
            if hw is None:
                raise ValueError(f"no hardware type for the accelerator {name!r}")
            options.append(Option(name, count, fields, hw))
    return options


def plan(task: Mapping[str, Any], now: datetime) -> Plan | str:
    """The submission of a task and its options, or why the task is left as it is."""
    envs = task.get("envs") or {}
    raw = envs.get(SPEC_ENV)
    if not raw:
        return f"no {SPEC_ENV} in the task's envs"
    try:
        spec = orjson.loads(raw)
        options = options_of(task.get("resources") or {})
        if len(options) < 2:
            return "one accelerator option: nothing to choose"
        job_id = (
            envs.get(JOB_ID_ENV) or f"skypilot/{task.get('name') or 'task'}/{uuid.uuid4().hex[:12]}"
        )
        submission = submission_from_spec(
            spec, job_id=str(job_id), allowed=[o.hardware_type for o in options], now=now
        )
    except (orjson.JSONDecodeError, JobSpecError, ValueError, TypeError) as exc:
        return f"not ranked: {exc}"
    return Plan(submission, options)


def _prediction(option: Option, ranking: Mapping[str, Any], total: float | None) -> dict[str, Any]:
    c = candidate_of(ranking, option.hardware_type)
    if c is None:
        return {"hardware_type": option.hardware_type, "ranked": False}
    out: dict[str, Any] = {
        "hardware_type": option.hardware_type,
        "ranked": True,
        "rank": c["rank"],
        "samples_per_s": c["predicted_throughput"],
        "interval": c.get("interval"),
        "cost_per_hour": c["cost_per_device_hour"] * c["num_devices"],
    }
    if total is not None:
        out["runtime_s"] = total / c["predicted_throughput"]
        out["cost_usd"] = out["runtime_s"] / 3600.0 * out["cost_per_hour"]
    return out


def rewrite(task: Mapping[str, Any], plan_: Plan, ranking: Mapping[str, Any]) -> dict[str, Any]:
    """The task with its options ordered best first (unranked ones last, as the user gave them)
    and the predictions in its envs; unchanged when the ranking ranks none of them."""
    order = {t: i for i, t in enumerate(ranked_types(ranking))}
    if not any(o.hardware_type in order for o in plan_.options):
        return dict(task)
    positions = {id(o): i for i, o in enumerate(plan_.options)}
    options = sorted(
        plan_.options, key=lambda o: (order.get(o.hardware_type, len(order)), positions[id(o)])
    )
    envs = dict(task.get("envs") or {})
    total = float(envs[TOTAL_SAMPLES_ENV]) if envs.get(TOTAL_SAMPLES_ENV) else None
    envs[JOB_ID_ENV] = str(plan_.submission["job_id"])
    envs[PREDICTIONS_ENV] = orjson.dumps(
        {
            "job_id": ranking["job_id"],
            "model_version": ranking.get("model_version"),
            "source": ranking.get("source"),
            "by_accelerator": {o.accelerator: _prediction(o, ranking, total) for o in options},
        }
    ).decode()
    ordered = [{**o.fields, "accelerators": {o.accelerator: _count(o.count)}} for o in options]
    return {**task, "resources": {"ordered": ordered}, "envs": envs}


def _count(count: float) -> int | float:
    return int(count) if float(count).is_integer() else count


def time_estimator(
    predictions: str | Mapping[str, Any], total_samples: float | None = None
) -> Callable[[Any], float]:
    """A ``Task.set_time_estimator`` function from a task's ``LEAP_PREDICTIONS``: seconds for a
    SkyPilot ``Resources`` (``total_samples`` overrides the runtime the policy computed).
    Accelerators without a prediction get the slowest predicted runtime, so they are never
    preferred."""
    data = orjson.loads(predictions) if isinstance(predictions, str) else predictions
    runtimes: dict[str, float] = {}
    for name, p in data["by_accelerator"].items():
        if not p.get("ranked"):
            continue
        if total_samples is not None:
            runtimes[name.lower()] = total_samples / p["samples_per_s"]
        elif "runtime_s" in p:
            runtimes[name.lower()] = p["runtime_s"]
    if not runtimes:
        raise ValueError(f"no runtime: set {TOTAL_SAMPLES_ENV} in the task or pass total_samples")
    slowest = max(runtimes.values())

    def estimate(resources: Any) -> float:
        accelerators = getattr(resources, "accelerators", None) or {}
        known = [runtimes[n.lower()] for n in accelerators if n.lower() in runtimes]
        return min(known) if known else slowest

    return estimate


async def policy_answer(
    body: bytes, rank: Callable[[bytes], Awaitable[Mapping[str, Any]]], now: datetime
) -> tuple[int, bytes, str]:
    """The HTTP answer to a ``RestfulAdminPolicy`` request: (status, body, outcome).

    SkyPilot posts ``json=UserRequest.encode()`` (so the body is a JSON string of a JSON
    object) and decodes ``response.json()`` as the JSON text of a ``MutatedUserRequest``, so the
    answer is encoded twice too. ``rank`` ranks one submission (a ranking or a dead letter).
    Anything short of a ranking returns the task as it came (outcome says why)."""
    import yaml

    try:
        outer = orjson.loads(body)
        request = orjson.loads(outer) if isinstance(outer, str) else outer
        task = yaml.safe_load(request["task"])
        config = request["skypilot_config"]
        if not isinstance(task, dict) or not isinstance(config, str):
            raise TypeError("task must be a YAML mapping and skypilot_config a YAML string")
    except (orjson.JSONDecodeError, yaml.YAMLError, KeyError, TypeError) as exc:
        error = {"kind": "not_skypilot_request", "message": f"not a SkyPilot user request: {exc}"}
        return 422, orjson.dumps({"error": error}), "invalid"
    p = plan(task, now)
    outcome = p if isinstance(p, str) else "ranked"
    if isinstance(p, Plan):
        ranking = await rank(orjson.dumps(p.submission))
        if "error" in ranking:
            outcome = (
                f"not ranked: {ranking['error'].get('kind')}: {ranking['error'].get('message')}"
            )
        else:
            task = rewrite(task, p, ranking)
    mutated = {"task": yaml.safe_dump(task, sort_keys=False), "skypilot_config": config}
    return 200, orjson.dumps(orjson.dumps(mutated).decode()), outcome


__all__ = [
    "ACCELERATORS",
    "JOB_ID_ENV",
    "PREDICTIONS_ENV",
    "SPEC_ENV",
    "TOTAL_SAMPLES_ENV",
    "Option",
    "Plan",
    "hardware_type",
    "options_of",
    "plan",
    "policy_answer",
    "rewrite",
    "time_estimator",
]
