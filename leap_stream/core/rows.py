"""The submission side of a dataset row: the columns the online store remembers for the
completion join and the offline store writes, and how a submission event flattens into them.
Pure: both stores and the simulator use it, so neither store depends on the other."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

# Columns that come from the submission; the online store keeps exactly these for the join.
SUBMISSION_COLUMNS: tuple[str, ...] = (
    "job_id",
    "attempt",
    "lineage_id",
    "submitted_at",
    "team",
    "family",
    "model_type",
    "parameters",
    "active_parameters",
    "layers",
    "hidden_size",
    "sequence_length",
    "precision",
    "optimizer",
    "framework",
    "framework_version",
    "global_batch_size",
    "micro_batch_size",
    "num_devices",
    "data_parallel",
    "tensor_parallel",
    "pipeline_parallel",
    "activation_checkpointing",
    "candidate_hardware",
    "default_hardware",
)


def submission_fields(submission: Mapping[str, Any]) -> dict[str, Any]:
    """The submission side of a dataset row, flat and JSON-friendly (stored in Redis for the join).

    Accepts a nested ``JobSubmitted`` event or an already flat dict (idempotent).
    """
    if "model" not in submission:
        return {k: submission[k] for k in SUBMISSION_COLUMNS}
    model = submission["model"]
    training = submission["training"]
    return {
        "job_id": submission["job_id"],
        "attempt": int(submission["attempt"]),
        "lineage_id": submission["lineage_id"],
        "submitted_at": submission["submitted_at"],
        "team": submission["team"],
        "family": model["family"],
        "model_type": model["model_type"],
        "parameters": float(model["parameters"]),
        "active_parameters": float(model.get("active_parameters") or model["parameters"]),
        "layers": int(model["layers"]),
        "hidden_size": int(model["hidden_size"]),
        "sequence_length": int(model["sequence_length"]),
        "precision": model["precision"],
        "optimizer": model["optimizer"],
        "framework": model["framework"],
        "framework_version": model["framework_version"],
        "global_batch_size": int(training["global_batch_size"]),
        "micro_batch_size": int(training["micro_batch_size"]),
        "num_devices": int(training["num_devices"]),
        "data_parallel": int(training["data_parallel"]),
        "tensor_parallel": int(training["tensor_parallel"]),
        "pipeline_parallel": int(training["pipeline_parallel"]),
        "activation_checkpointing": bool(training["activation_checkpointing"]),
        "candidate_hardware": "|".join(submission["candidate_hardware"]),
        "default_hardware": submission["default_hardware"],
    }


__all__ = ["SUBMISSION_COLUMNS", "submission_fields"]
