"""Running a ranking's probes from a scheduler: the short jobs to submit, and the completion
each one reports (pure; the scheduler submits, the caller publishes).

A ranking's ``probe`` names types and a length, and per type the slice of the job to run
(``runs``: devices, data-parallel degree, global batch; without it, the whole job). Each probe is
the job's own command on that slice for that many minutes, on one type, with ``LEAP_PROBE=1``
and the slice's shape in its environment so the training script knows to launch that slice,
measure and stop; it reports what it measured, on the slice's devices, as a job-completed event
with ``probe: true`` (`probe_completion`). Once every probe reported (or
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


def probe_runs(ranking: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """Per probed type, the slice its probe runs (``{}``: the whole job, as asked)."""
    runs = (ranking.get("probe") or {}).get("runs") or []
    return [runs[i] if i < len(runs) else {} for i in range(len(probe_types(ranking)))]


def slurm_probe_args(
    ranking: Mapping[str, Any], partition_of: Mapping[str, str] | None = None
) -> list[list[str]]:
    """Per probed type, the ``sbatch`` options of its probe job: the type's partition
    (``partition_of``, default the type's own name), a time limit of the probe's minutes
    rounded up, a name that says what it is, and in its environment ``LEAP_PROBE=1``,
    ``LEAP_PROBE_TYPE`` and the slice to launch (``LEAP_PROBE_DEVICES``,
    ``LEAP_PROBE_DATA_PARALLEL``, ``LEAP_PROBE_GLOBAL_BATCH``; absent: the whole job)."""
    probe = ranking.get("probe") or {}
    limit = max(1, math.ceil(float(probe.get("minutes", 5.0))))
    out = []
    for t, run in zip(probe_types(ranking), probe_runs(ranking), strict=True):
        env = f"ALL,LEAP_PROBE=1,LEAP_PROBE_TYPE={t}"
        if run:
            env += (
                f",LEAP_PROBE_DEVICES={int(run['num_devices'])}"
                f",LEAP_PROBE_DATA_PARALLEL={int(run['data_parallel'])}"
                f",LEAP_PROBE_GLOBAL_BATCH={int(run['global_batch_size'])}"
            )
        out.append(
            [
                f"--partition={(partition_of or {}).get(t, t)}",
                f"--time={limit}",
                f"--job-name=leap-probe.{t}",
                f"--export={env}",
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
    ranking answered) on ``hardware_type``, on ``num_devices`` (its slice's; default the
    job's): marked ``probe``, so it completes once per type and never counts as the attempt's
    own run."""
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


__all__ = ["probe_completion", "probe_runs", "probe_types", "slurm_probe_args"]
