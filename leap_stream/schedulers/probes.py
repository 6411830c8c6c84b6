"""Running a ranking's probes from a scheduler: the short jobs to submit, and the completion
each one reports (pure; the scheduler submits, the caller publishes).

A ranking's ``probe`` names types and a length. Each probe is the job's own command on the
job's own devices for that many minutes, on one type, with ``LEAP_PROBE=1`` in its environment
so the training script knows to measure and stop; it reports what it measured as a
job-completed event with ``probe: true`` (`probe_completion`). Once every probe reported (or
timed out), `core.placement.after_probes` orders the types for the job itself.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from leap_stream.contracts import format_ts
from leap_stream.contracts.events import JobCompleted


def probe_types(ranking: Mapping[str, Any]) -> list[str]:
    """The types a ranking asks to probe (empty: none)."""
    return [str(t) for t in (ranking.get("probe") or {}).get("hardware_types") or []]


def slurm_probe_args(
    ranking: Mapping[str, Any], partition_of: Mapping[str, str] | None = None
) -> list[list[str]]:
    """Per probed type, the ``sbatch`` options of its probe job: the type's partition
    (``partition_of``, default the type's own name), a time limit of the probe's minutes
    rounded up, a name that says what it is, and ``LEAP_PROBE=1`` / ``LEAP_PROBE_TYPE``."""
    probe = ranking.get("probe") or {}
    limit = max(1, math.ceil(float(probe.get("minutes", 5.0))))
    out = []
    for t in probe_types(ranking):
        out.append(
            [
                f"--partition={(partition_of or {}).get(t, t)}",
                f"--time={limit}",
                f"--job-name=leap-probe.{t}",
                f"--export=ALL,LEAP_PROBE=1,LEAP_PROBE_TYPE={t}",
            ]
        )
    return out


def probe_completion(
    submission: Mapping[str, Any],
    hardware_type: str,
    samples_per_s: float,
    started_at: datetime,
    ended_at: datetime,
    num_devices: int | None = None,
) -> JobCompleted:
    """The job-completed event of one probe of ``submission`` (the job-submitted event the
    ranking answered) on ``hardware_type``: marked ``probe``, so it completes once per type and
    never counts as the attempt's own run."""
    nd = int(num_devices or submission["training"]["num_devices"])
    hours = max(0.0, (ended_at - started_at).total_seconds() / 3600.0)
    return {
        "schema_version": 1,
        "event_id": f"probe:{submission['job_id']}:{submission['attempt']}:{hardware_type}",
        "job_id": submission["job_id"],
        "attempt": int(submission["attempt"]),
        "lineage_id": submission["lineage_id"],
        "model_type": submission["model"]["model_type"],
        "hardware_type": hardware_type,
        "num_devices": nd,
        "throughput": {"samples_per_s": float(samples_per_s)},
        "steps": 0,
        "started_at": format_ts(started_at),
        "ended_at": format_ts(ended_at),
        "status": "succeeded",
        "device_hours": nd * hours,
        "probe": True,
    }


__all__ = ["probe_completion", "probe_types", "slurm_probe_args"]
