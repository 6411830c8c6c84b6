"""Real measured throughputs (Gavel, OSDI 2020) in the dataset shape.

Synthetic data can only show that a model learns the simulator; these tables show whether
cross-hardware prediction from a prior measurement works on numbers nobody here made up.
Mapping rules are documented in ``leap_stream/tools/sim/data/README.md``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import numpy as np
import pandas as pd

from leap_stream.catalog import HardwareCatalog, load_catalog

DATA_DIR = Path(__file__).with_name("data")
TABLES = {
    "simulation": DATA_DIR / "gavel_throughputs.csv",
    "physical": DATA_DIR / "gavel_physical_cluster_throughputs.csv",
}
GAVEL_HARDWARE = ("k80", "p100", "v100")

# model -> (family, model_type, parameters, layers, hidden, seq, precision, optimizer, framework)
# Approximate published configurations; constant per model (context, not signal).
_MODELS: dict[str, tuple[str, str, float, int, int, int, str, str, str]] = {
    "ResNet-18": ("vision_cnn", "resnet-18-cifar", 11.2e6, 18, 512, 1, "fp32", "sgd", "pytorch"),
    "ResNet-50": ("vision_cnn", "resnet-50", 25.6e6, 50, 2048, 1, "fp32", "sgd", "pytorch"),
    "Transformer": ("encoder", "transformer-base-mt", 65e6, 12, 512, 64, "fp32", "adam", "pytorch"),
    "LM": ("dense_llm", "lstm-lm-wikitext2", 28e6, 2, 650, 35, "fp32", "sgd", "pytorch"),
    "Recommendation": ("recsys", "autoenc-cf-ml20m", 9e6, 4, 512, 1, "fp32", "adam", "pytorch"),
    "A3C": ("vision_cnn", "a3c-pong", 0.9e6, 4, 256, 1, "fp32", "adam", "pytorch"),
    "CycleGAN": ("diffusion", "cyclegan-monet", 28.3e6, 24, 256, 1, "fp32", "adam", "pytorch"),
}
_EPOCH = pd.Timestamp("2020-06-18T00:00:00Z")


def gavel_catalog() -> HardwareCatalog:
    """K80 / P100 / V100 specs in the catalog schema (validated on load)."""
    return load_catalog(DATA_DIR / "gavel_hardware.json")


def load_gavel(table: Literal["simulation", "physical"] = "simulation") -> pd.DataFrame:
    """The Gavel table as dataset rows (``DATASET_COLUMNS``, in order), one row per measurement."""
    from leap_stream.store.offline import DATASET_COLUMNS

    raw = pd.read_csv(TABLES[table])
    raw = raw[raw["throughput_steps_per_s"] > 0].reset_index(drop=True)
    unknown = set(raw["model"]) - set(_MODELS)
    if unknown:
        raise ValueError(f"unknown Gavel models: {sorted(unknown)}")
    meta = pd.DataFrame.from_dict(
        _MODELS,
        orient="index",
        columns=[
            "family",
            "model_type",
            "parameters",
            "layers",
            "hidden_size",
            "sequence_length",
            "precision",
            "optimizer",
            "framework",
        ],
    )
    df = raw.join(meta, on="model")
    has_bs = df["batch_size"].notna()
    bs = df["batch_size"].fillna(1).astype(np.int64)
    bs_label = np.where(has_bs, bs.astype(str), "-")
    n = df["num_gpus"].astype(np.int64)
    lineage = (
        "gavel:"
        + df["model"].str.replace(" ", "-")
        + ":"
        + bs_label
        + ":"
        + n.astype(str)
        + ":"
        + df["placement"]
    )
    steps_s = df["throughput_steps_per_s"].astype(float)
    sps = np.where(has_bs, steps_s * bs, steps_s)
    submitted = _EPOCH + pd.to_timedelta(np.arange(len(df)), unit="s")
    out = pd.DataFrame(
        {
            "event_id": "gavel-" + table + "-" + pd.Series(np.arange(len(df))).astype(str),
            "job_id": lineage + ":" + df["hardware"],
            "attempt": 1,
            "lineage_id": lineage,
            "submitted_at": submitted,
            "team": "gavel",
            "family": df["family"],
            "model_type": df["model_type"],
            "parameters": df["parameters"].astype(float),
            "active_parameters": df["parameters"].astype(float),
            "layers": df["layers"].astype(np.int64),
            "hidden_size": df["hidden_size"].astype(np.int64),
            "sequence_length": df["sequence_length"].astype(np.int64),
            "precision": df["precision"],
            "optimizer": df["optimizer"],
            "framework": df["framework"],
            "framework_version": "1.4.0",
            "global_batch_size": bs * n,
            "micro_batch_size": bs,
            "num_devices": n,
            "data_parallel": n,
            "tensor_parallel": 1,
            "pipeline_parallel": 1,
            "activation_checkpointing": False,
            "candidate_hardware": "|".join(GAVEL_HARDWARE),
            "default_hardware": df["hardware"],
            "hardware_type": df["hardware"],
            "status": "succeeded",
            "samples_per_s": sps.astype(float),
            "tokens_per_s": np.where(
                df["sequence_length"] > 1, sps * df["sequence_length"], np.nan
            ),
            "steps": np.round(steps_s * 3600.0).astype(np.int64),
            "started_at": submitted,
            "ended_at": submitted + pd.Timedelta(hours=1),
            "device_hours": n.astype(float),
            "quarantine": None,
            "probe": None,
        }
    )
    return out[list(DATASET_COLUMNS)]


__all__ = ["DATA_DIR", "GAVEL_HARDWARE", "TABLES", "gavel_catalog", "load_gavel"]
