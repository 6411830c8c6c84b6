"""SkyPilot, for real: SkyPilot's RestfulAdminPolicy and Task call leap-stream serve's policy.

SkyPilot runs in its own venv (make skypilot-venv: it pins its own uvicorn and weighs ~450 MB);
the test writes a task YAML, runs _skypilot_client.py there against the served policy, and
checks the order SkyPilot's own classes decoded against the ranking leap-stream published.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path
from typing import Any

import orjson
import pytest
import yaml
from _served import Served

from leap_stream.contracts.job_spec import spec_of
from leap_stream.core.placement import choose
from leap_stream.schedulers.skypilot import ACCELERATORS, JOB_ID_ENV, SPEC_ENV
from leap_stream.stream.client import RankingsClient

pytestmark = [pytest.mark.e2e, pytest.mark.skypilot]

ROOT = Path(__file__).resolve().parents[2]
CLIENT = Path(__file__).with_name("_skypilot_client.py")
SKY_NAME = {t: name.upper() for name, t in reversed(list(ACCELERATORS.items()))}
TOTAL_SAMPLES = 3.6e7


@pytest.fixture(scope="module")
def sky_python() -> Path:
    python = Path(
        os.environ.get("LEAP_SKYPILOT_PYTHON", ROOT / ".venv-skypilot" / "bin" / "python")
    )
    if not python.exists():
        pytest.fail(f"SkyPilot's venv is missing ({python}): run `make skypilot-venv`")
    return python


def _policy(sky_python: Path, served: Served, tmp: Path, task: dict[str, Any]) -> dict[str, Any]:
    task_file = tmp / f"task-{time.monotonic_ns()}.yaml"
    task_file.write_text(yaml.safe_dump(task))
    proc = subprocess.run(
        [str(sky_python), str(CLIENT), f"{served.url}/v1/skypilot/policy", str(task_file)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    out: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return out


def _task(event: dict[str, Any], types: list[str], spec: str | None = None) -> dict[str, Any]:
    job_spec = spec_of(event)
    envs = {"LEAP_TOTAL_SAMPLES": str(TOTAL_SAMPLES)}
    envs[SPEC_ENV] = orjson.dumps(job_spec).decode() if spec is None else spec
    return {
        "name": "train",
        "resources": {"accelerators": {SKY_NAME[t]: 8 for t in types}, "disk_size": 256},
        "envs": envs,
        "run": "python train.py",
    }


def _three_ranked(served: Served) -> tuple[dict[str, Any], list[str]]:
    nameable = [t for t in sorted(SKY_NAME) if t.startswith(("h", "a100", "mi3", "l40", "b2"))]
    for i in range(len(served.submissions)):
        event = served.fresh(i, nameable)
        ranked = choose(served.rank(event), nameable, k=len(nameable))
        if len(ranked) >= 3:
            return event, ranked[:3]
    raise AssertionError("no submission ranks three SkyPilot accelerators")


def test_skypilot_orders_the_accelerators_by_the_ranking(
    sky_python: Path, served: Served, tmp_path: Path
) -> None:
    event, best_three = _three_ranked(served)
    allowed = list(reversed(best_three))  # worst first, as a user might list them
    out = _policy(sky_python, served, tmp_path, _task(event, allowed))

    assert out["ordered"], out
    assert out["options"] == [{SKY_NAME[t]: 8} for t in best_three]
    job_id = out["envs"][JOB_ID_ENV]
    # the ranking SkyPilot got is the one published (audit trail) and its order is the ranking's
    with RankingsClient(served.kafka, served.rank_topic) as reader:
        deadline = time.monotonic() + 30
        while reader.get(job_id) is None and time.monotonic() < deadline:
            reader.poll(timeout=0.5)
        ranking = reader.get(job_id)
    assert ranking is not None and choose(ranking, allowed, k=3) == best_three
    # SkyPilot's optimizer gets leap-stream's runtimes instead of its one-hour default
    by_type = {c["hardware_type"]: c for c in ranking["candidates"]}
    expected = [TOTAL_SAMPLES / by_type[t]["predicted_throughput"] for t in best_three]
    assert out["runtime_s"] == pytest.approx(expected, rel=1e-9)
    assert all(r != 3600.0 for r in out["runtime_s"])


@pytest.mark.parametrize("spec", ["", "{not json", '{"lineage_id": "lineage/x", "model": 1}'])
def test_a_task_without_a_usable_spec_comes_back_as_it_was(
    sky_python: Path, served: Served, tmp_path: Path, spec: str
) -> None:
    event, best_three = _three_ranked(served)
    out = _policy(sky_python, served, tmp_path, _task(event, best_three, spec=spec))
    assert not out["ordered"] and "runtime_s" not in out
    assert sorted(map(str, out["options"])) == sorted(str({SKY_NAME[t]: 8}) for t in best_three)
    assert JOB_ID_ENV not in out["envs"]
