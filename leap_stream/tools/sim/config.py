"""What a simulation is asked for (`SimConfig`, drift events) and what it gives back (a day's
and a run's frames), with the distributions it draws jobs from."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import date, timedelta
from typing import Any

import numpy as np
import numpy.typing as npt
import pandas as pd

from leap_stream.contracts.vocab import FAMILIES
from leap_stream.tools.sim.draw import _multi_hw

F64 = npt.NDArray[np.float64]
I64 = npt.NDArray[np.int64]

Policy = Callable[[pd.DataFrame], "pd.Series[str]"]

STATUSES: tuple[str, ...] = ("succeeded", "failed", "preempted")
FRAMEWORK_VERSIONS: dict[str, tuple[str, ...]] = {
    "pytorch": ("2.3.1", "2.4.1", "2.5.1", "2.6.0", "2.7.1"),
    "jax": ("0.4.30", "0.4.35", "0.5.3", "0.6.2"),
    "tensorflow": ("2.15.1", "2.16.2", "2.17.1", "2.18.0"),
}
# Family mix of new lineages, and per-family precision / optimizer mixes.
FAMILY_WEIGHTS = np.array([0.22, 0.08, 0.10, 0.14, 0.10, 0.08, 0.10, 0.08, 0.10])
_PREC = {  # fp32 tf32 fp16 bf16 fp8
    "dense_llm": (0.0, 0.0, 0.05, 0.80, 0.15),
    "moe_llm": (0.0, 0.0, 0.05, 0.80, 0.15),
    "encoder": (0.10, 0.05, 0.35, 0.50, 0.0),
    "vision_cnn": (0.15, 0.20, 0.40, 0.25, 0.0),
    "vision_vit": (0.05, 0.05, 0.20, 0.70, 0.0),
    "diffusion": (0.05, 0.0, 0.35, 0.60, 0.0),
    "recsys": (0.20, 0.35, 0.25, 0.20, 0.0),  # fp32 tables, mixed-precision MLPs
    "speech": (0.10, 0.05, 0.40, 0.45, 0.0),
    "gnn": (0.80, 0.15, 0.05, 0.0, 0.0),
}
_OPT = {  # adamw adam sgd adafactor lamb lion adagrad
    "dense_llm": (0.85, 0.03, 0.0, 0.05, 0.0, 0.07, 0.0),
    "moe_llm": (0.85, 0.03, 0.0, 0.10, 0.0, 0.02, 0.0),
    "encoder": (0.60, 0.20, 0.0, 0.05, 0.15, 0.0, 0.0),
    "vision_cnn": (0.15, 0.05, 0.70, 0.0, 0.10, 0.0, 0.0),
    "vision_vit": (0.80, 0.0, 0.0, 0.0, 0.15, 0.05, 0.0),
    "diffusion": (0.90, 0.10, 0.0, 0.0, 0.0, 0.0, 0.0),
    "recsys": (0.0, 0.40, 0.10, 0.0, 0.0, 0.0, 0.50),
    "speech": (0.70, 0.30, 0.0, 0.0, 0.0, 0.0, 0.0),
    "gnn": (0.10, 0.85, 0.05, 0.0, 0.0, 0.0, 0.0),
}
PREC_P = np.array([_PREC[f] for f in FAMILIES])
OPT_P = np.array([_OPT[f] for f in FAMILIES])
# How likely users are to ask for a type by default (unlisted: 1.0).
POPULARITY = {
    "h100-sxm": 6.0,
    "a100-80g": 5.0,
    "a100-40g": 4.0,
    "h200": 3.0,
    "l4": 2.5,
    "a10g": 2.5,
    "v100-sxm": 2.0,
    "l40s": 2.0,
    "tpu-v5e": 2.0,
    "tpu-v5p": 2.0,
    "b200": 1.5,
    "mi300x": 1.5,
    "t4": 0.8,
    "tpu-v4": 0.7,
    "rtx-6000-ada": 0.6,
    "mi325x": 0.6,
    "mi355x": 0.5,
    "gaudi3": 0.5,
    "gb200": 0.4,
    "gaudi1": 0.3,
}
REFERENCE_MEMORY_GIB = 80.0  # users size jobs so they fit on the common 80 GiB parts
MAX_DEVICES = 1024
# A user's estimate of an attempt's samples is off by a lognormal factor of this σ (log): about
# ×0.6–×1.7 for half of them. Drawn from its own stream (`PLANNED_SAMPLES_STREAM`).
PLANNED_SAMPLES_SIGMA = 0.5
PLANNED_SAMPLES_STREAM = 7
# A probe (a short run of a few minutes) measures with σ (log) `core.probe.probe_noise(minutes)`,
# above a full run's `noise_sigma`; its draws come from a stream of their own (`PROBE_STREAM`).
PROBE_STREAM = 11


@dataclass(frozen=True)
class DriftEvent:
    """From ``day`` on (0-based), ``vendor``'s speed on ``family`` is multiplied by ``factor``."""

    day: int
    vendor: str
    family: str
    factor: float
    reason: str = "software release"

    def to_dict(self, start: date) -> dict[str, Any]:
        return {
            "day": self.day,
            "date": (start + timedelta(days=self.day)).isoformat(),
            "vendor": self.vendor,
            "family": self.family,
            "factor": round(self.factor, 4),
            "reason": self.reason,
        }


@dataclass(frozen=True)
class SimConfig:
    seed: int = 0
    days: int = 1
    rate: int = 30000  # submissions (attempts) per day
    start: date = date(2026, 11, 1)
    teams: int = 48
    noise_sigma: float = 0.035  # lognormal measurement noise
    lineage_sigma: float = 0.25  # hardware-independent per-lineage factor
    lineage_vendor_sigma: float = 0.08  # vendor-specific part of the lineage factor
    model_hw_sigma: float = 0.10  # per (model type × hardware type) idiosyncrasy
    input_bound_share: float = 0.15  # lineages capped by their input pipeline
    fail_prob: float = 0.04
    preempt_prob: float = 0.07
    move_prob: float = 0.06  # a new job of a lineage switches its default type
    rescale_prob: float = 0.05  # a new job changes its data-parallel size
    drift_rate: float = 0.2  # chance per day (after day 0) of a drift event
    drift_events: tuple[DriftEvent, ...] | None = None  # explicit list replaces random drift
    # (type id, day): a type the fleet adds on that day (0-based); before it, no job has it as a
    # candidate or a default. The catalog holds its specs from the start, as a real one would.
    hardware_from: tuple[tuple[str, int], ...] = ()


@dataclass
class DayResult:
    day: date
    submissions: pd.DataFrame
    completions: pd.DataFrame
    dataset: pd.DataFrame
    truth: pd.DataFrame
    drift_events: list[DriftEvent]  # events that start on this day
    invalid_choices: int  # policy choices outside the candidate set (replaced by the default)


@dataclass
class SimResult:
    config: SimConfig
    submissions: pd.DataFrame
    completions: pd.DataFrame
    dataset: pd.DataFrame
    truth: pd.DataFrame
    drift_events: list[DriftEvent] = field(default_factory=list)
    invalid_choices: int = 0
    n_types: int = 1  # hardware types in the catalog the fleet ran with

    def summary(self) -> dict[str, Any]:
        subs = self.submissions
        n = len(subs)
        cand_len = subs["candidate_hardware"].str.count(r"\|") + 1 if n else pd.Series(dtype=float)
        return {
            "seed": self.config.seed,
            "days": self.config.days,
            "start": self.config.start.isoformat(),
            "submissions": n,
            "completions": len(self.completions),
            "lineages": int(subs["lineage_id"].nunique()) if n else 0,
            "hardware_types": int(self.truth["hardware_type"].nunique()) if n else 0,
            "vendors": int(subs.attrs.get("vendors", 0)),
            "model_types": int(subs["model_type"].nunique()) if n else 0,
            "families": int(subs["family"].nunique()) if n else 0,
            "submissions_with_prior": int(subs["has_prior"].sum()) if n else 0,
            "prior_share": round(float(subs["has_prior"].mean()), 4) if n else 0.0,
            "lineages_multi_hw": _multi_hw(self.dataset),
            "candidates_mean": round(float(cand_len.mean()), 2) if n else 0.0,
            "candidates_max": int(cand_len.max()) if n else 0,
            "eligible_share": round(float(cand_len.mean()) / self.n_types, 4) if n else 0.0,
            "status": self.completions["status"].value_counts().to_dict() if n else {},
            "device_hours": round(float(self.completions["device_hours"].sum()), 1) if n else 0,
            "invalid_choices": self.invalid_choices,
            "drift_events": [e.to_dict(self.config.start) for e in self.drift_events],
        }
