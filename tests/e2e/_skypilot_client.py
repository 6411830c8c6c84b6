"""Run by the SkyPilot venv (make skypilot-venv), not collected by pytest: SkyPilot's own classes
call leap-stream serve's admin policy.

Usage: python _skypilot_client.py POLICY_URL TASK.yaml
Prints one JSON object: the mutated task's resources in SkyPilot's order, its envs, and the
runtime SkyPilot's Task.estimate_runtime gives each option through leap-stream's time estimator.
"""

from __future__ import annotations

import json
import sys

import sky
import yaml
from sky import admin_policy
from sky.server.requests.request_names import AdminPolicyRequestName
from sky.utils import config_utils

from leap_stream.schedulers.skypilot import PREDICTIONS_ENV, time_estimator


def main(url: str, task_file: str) -> None:
    with open(task_file) as fh:
        task = sky.Task.from_yaml_config(yaml.safe_load(fh))
    request = admin_policy.UserRequest(
        task=task,
        skypilot_config=config_utils.Config(),
        request_name=AdminPolicyRequestName("launch"),
    )
    mutated = admin_policy.RestfulAdminPolicy(url).validate_and_mutate(request)
    resources = mutated.task.resources
    options = (
        list(resources)
        if isinstance(resources, list)
        else sorted(resources, key=lambda r: str(r.accelerators))
    )
    out = {
        "ordered": isinstance(resources, list),
        "options": [dict(r.accelerators or {}) for r in options],
        "envs": dict(mutated.task.envs),
    }
    if PREDICTIONS_ENV in mutated.task.envs:
        mutated.task.set_time_estimator(time_estimator(mutated.task.envs[PREDICTIONS_ENV]))
        out["runtime_s"] = [mutated.task.estimate_runtime(r) for r in options]
    print(json.dumps(out))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
