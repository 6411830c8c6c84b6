"""Small synthetic dataset frames for unit tests and `benchmarks/bench_model.py`.

Not the fleet simulator (`leap_stream.tools.sim`): just dataset-shaped rows with a known throughput
law (roofline × per-(family, vendor) efficiency × per-lineage factor × noise), so tests can check
that history helps and that intervals cover.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from leap_stream.contracts.timestamps import format_ts
from leap_stream.core import features as F
from leap_stream.core.predictor import ThroughputModel
from leap_stream.train import pit

SPECS = pd.DataFrame(
    {
        "device_memory_gib": [24.0, 80.0, 80.0, 192.0, 16.0],
        "peak_bf16_tflops": [121.0, 312.0, 989.0, 1307.0, 197.0],
        "memory_bandwidth_gbps": [300.0, 2039.0, 3350.0, 5300.0, 819.0],
        "interconnect_gbps": [64.0, 600.0, 900.0, 896.0, 400.0],
        "cost_per_device_hour": [0.8, 5.12, 6.88, 6.0, 1.2],
        "vendor": ["nvidia", "nvidia", "nvidia", "amd", "google"],
    },
    index=pd.Index(["l4", "a100-80g", "h100-sxm", "mi300x", "tpu-v5e"], name="type_id"),
)

_MODELS = (
    # model_type, family, params, layers, hidden, seq
    ("llama-1b", "dense_llm", 1.2e9, 16, 2048, 2048),
    ("llama-7b", "dense_llm", 6.7e9, 32, 4096, 4096),
    ("bert-large", "encoder", 3.4e8, 24, 1024, 512),
    ("resnet-50", "vision_cnn", 2.5e7, 50, 2048, 1),
    ("vit-b16", "vision_vit", 8.6e7, 12, 768, 197),
    ("dlrm", "recsys", 5.0e8, 8, 512, 1),
)


@dataclass(frozen=True)
class SpecCatalog:
    """The `Catalog` protocol over a spec DataFrame (tests need no package data)."""

    specs: pd.DataFrame

    def spec_matrix(self) -> pd.DataFrame:
        return self.specs

    def __contains__(self, t: object) -> bool:
        return t in self.specs.index


def true_per_device(
    frame: pd.DataFrame, hw: np.ndarray, lineage_factor: np.ndarray, specs: pd.DataFrame = SPECS
) -> np.ndarray:
    """The synthetic law: roofline × efficiency(family, vendor) × lineage × scaling."""
    s = specs.loc[hw]
    fps = 6.0 * frame["parameters"].to_numpy(np.float64) * frame["sequence_length"].to_numpy()
    fps = np.where(frame["family"].to_numpy(object) == "vision_cnn", fps * 150.0, fps)
    mem_bound = frame["family"].isin(["recsys", "vision_cnn"]).to_numpy()
    compute = s["peak_bf16_tflops"].to_numpy() * 1e12 / fps
    bw_rate = s["memory_bandwidth_gbps"].to_numpy() * 1e9 / (fps / 50.0)
    eff = np.where(s["vendor"].to_numpy(object) == "nvidia", 0.45, 0.32)
    rate = np.where(mem_bound, np.minimum(compute, bw_rate), compute) * eff
    nd = frame["num_devices"].to_numpy(np.float64)
    return np.asarray(rate * lineage_factor * nd**-0.04)


def dataset(
    n_rows: int = 2000, seed: int = 0, days: float = 20.0, specs: pd.DataFrame = SPECS
) -> pd.DataFrame:
    """Dataset-shaped rows (docs/design.md columns) with lineages that recur across hardware."""
    rng = np.random.default_rng(seed)
    n_lin = max(1, n_rows // 4)
    lin = rng.integers(0, n_lin, n_rows)
    m = np.asarray([_MODELS[i % len(_MODELS)] for i in range(n_lin)], dtype=object)[lin]
    lin_factor = np.exp(rng.normal(0.0, 0.35, n_lin))[lin]
    nd = np.asarray([1, 2, 4, 8, 16])[rng.integers(0, 5, n_lin)][lin]
    types = np.asarray(specs.index)
    hw = types[rng.integers(0, len(types), n_rows)]
    submitted = pd.Timestamp("2026-11-01", tz="UTC") + pd.to_timedelta(
        np.sort(rng.uniform(0, days * 86400, n_rows)), unit="s"
    )
    duration = rng.uniform(600, 6 * 3600, n_rows)
    started = submitted + pd.to_timedelta(rng.uniform(1, 300, n_rows), unit="s")
    ended = started + pd.to_timedelta(duration, unit="s")
    status = rng.choice(["succeeded", "failed", "preempted"], n_rows, p=[0.85, 0.05, 0.10])
    frame = pd.DataFrame(
        {
            "event_id": [f"c-{seed}-{i}" for i in range(n_rows)],
            "job_id": [f"j-{seed}-{i}" for i in range(n_rows)],
            "attempt": 1,
            "lineage_id": [f"lin-{seed}-{i}" for i in lin],
            "submitted_at": submitted,
            "team": "t",
            "family": m[:, 1].astype(str),
            "model_type": m[:, 0].astype(str),
            "parameters": m[:, 2].astype(np.float64),
            "active_parameters": m[:, 2].astype(np.float64),
            "layers": m[:, 3].astype(np.int64),
            "hidden_size": m[:, 4].astype(np.int64),
            "sequence_length": m[:, 5].astype(np.int64),
            "precision": "bf16",
            "optimizer": "adamw",
            "framework": "pytorch",
            "framework_version": "2.5",
            "global_batch_size": 256 * nd,
            "micro_batch_size": 1,
            "num_devices": nd.astype(np.int64),
            "data_parallel": nd.astype(np.int64),
            "tensor_parallel": 1,
            "pipeline_parallel": 1,
            "activation_checkpointing": True,
            "candidate_hardware": "|".join(types),
            "default_hardware": types[0],
            "hardware_type": hw,
            "status": status,
            "started_at": started,
            "ended_at": ended,
        }
    )
    true_pd = true_per_device(frame, hw, lin_factor, specs)
    noise = np.exp(rng.normal(0.0, 0.03, n_rows))
    sps = true_pd * nd * noise
    frame["samples_per_s"] = np.where(status == "failed", np.nan, sps)
    frame["true_samples_per_s"] = true_pd * nd
    frame["tokens_per_s"] = frame["samples_per_s"] * frame["sequence_length"]
    frame["steps"] = 1000
    frame["device_hours"] = duration / 3600.0 * nd
    frame["lineage_factor"] = lin_factor
    return frame


def submission_event(row: Any, candidates: list[str] | None = None) -> dict[str, Any]:
    """A job-submitted event (schema-shaped) from one dataset row."""
    r: dict[str, Any] = dict(row)
    cands = candidates or str(r["candidate_hardware"]).split("|")
    return {
        "schema_version": 1,
        "event_id": f"sub-{r['job_id']}-{r['attempt']}",
        "job_id": str(r["job_id"]),
        "attempt": int(r["attempt"]),
        "lineage_id": str(r["lineage_id"]),
        "submitted_at": format_ts(pd.Timestamp(r["submitted_at"])),
        "team": str(r["team"]),
        "model": {
            "family": str(r["family"]),
            "model_type": str(r["model_type"]),
            "parameters": float(r["parameters"]),
            "active_parameters": float(r["active_parameters"]),
            "layers": int(r["layers"]),
            "hidden_size": int(r["hidden_size"]),
            "sequence_length": int(r["sequence_length"]),
            "precision": str(r["precision"]),
            "optimizer": str(r["optimizer"]),
            "framework": str(r["framework"]),
            "framework_version": str(r["framework_version"]),
        },
        "training": {
            "global_batch_size": int(r["global_batch_size"]),
            "micro_batch_size": int(r["micro_batch_size"]),
            "num_devices": int(r["num_devices"]),
            "data_parallel": int(r["data_parallel"]),
            "tensor_parallel": int(r["tensor_parallel"]),
            "pipeline_parallel": int(r["pipeline_parallel"]),
            "activation_checkpointing": bool(r["activation_checkpointing"]),
        },
        "candidate_hardware": cands,
        "default_hardware": str(r["default_hardware"]),
    }


def fitted_model(train: pd.DataFrame, num_rounds: int) -> ThroughputModel:
    """A model fitted on `train`'s measured rows with their point-in-time history, as the
    trainer builds them, on `SPECS`: a model for tests that need *a* model."""
    measured = pit.measured(train)
    snap = pit.replay(measured, measured)
    frame = F.build(
        measured,
        [[h] for h in measured["hardware_type"]],
        snap.histories,
        snap.aggregates,
        SPECS,
        snap.now,
    )
    return ThroughputModel.fit(
        frame, measured["samples_per_s"].to_numpy(), measured["lineage_id"], num_rounds=num_rounds
    )
