"""A job spec: the training configuration a user hands a scheduler, turned into a submission.

Schedulers know some fields of a job-submitted event and users know the rest. A *job spec* is a
job-submitted event without the fields a scheduler fills in at its hook: which job this is, when,
and which hardware types the user allowed (the scheduler's partitions, accelerator list or node
labels). `submission_from_spec` joins the two; the result is checked by the contracts like any
other event, so a malformed spec gets the same error kinds as the dead-letter topic.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from leap_stream.contracts.timestamps import format_ts

SCHEDULER_FIELDS = (
    "schema_version",
    "event_id",
    "job_id",
    "attempt",
    "submitted_at",
    "candidate_hardware",
    "default_hardware",
)


class JobSpecError(ValueError):
    """The spec is not a JSON object of a job's training configuration."""


def submission_from_spec(
    spec: Mapping[str, Any],
    *,
    job_id: str,
    allowed: Sequence[str],
    now: datetime,
    default: str | None = None,
) -> dict[str, Any]:
    """The job-submitted event of ``spec`` as scheduled: ``allowed`` (non-empty) becomes the
    candidates and ``default`` (else the first allowed type) the default hardware. Fields the
    spec sets itself win over the scheduler's, except the candidates: what the user allowed at
    the scheduler is what may be chosen."""
    if not isinstance(spec, Mapping):
        raise JobSpecError("a job spec is a JSON object")
    if not allowed:
        raise JobSpecError("no hardware type is allowed for the job")
    event: dict[str, Any] = {
        "schema_version": 1,
        "event_id": f"sub-{uuid.uuid4().hex}",
        "job_id": job_id,
        "attempt": 1,
        "submitted_at": format_ts(now),
        "default_hardware": default if default in allowed else allowed[0],
    }
    event.update(spec)
    event["candidate_hardware"] = list(dict.fromkeys(allowed))
    if event["default_hardware"] not in event["candidate_hardware"]:
        event["default_hardware"] = event["candidate_hardware"][0]
    return event


def spec_of(submission: Mapping[str, Any]) -> dict[str, Any]:
    """The job spec of a job-submitted event: what its user would have written (the inverse of
    `submission_from_spec` on the fields it keeps)."""
    return {k: v for k, v in submission.items() if k not in SCHEDULER_FIELDS}


__all__ = ["SCHEDULER_FIELDS", "JobSpecError", "spec_of", "submission_from_spec"]
