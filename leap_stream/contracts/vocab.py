"""The closed vocabularies of the events, as tuples in schema order.

The simulator indexes its tables by these and the feature builder encodes categoricals with
them, so their order is part of a trained model; `tests/unit/test_contracts_vocab.py` checks
them against the enums in `schemas/`.
"""

from __future__ import annotations

FAMILIES: tuple[str, ...] = (
    "dense_llm",
    "moe_llm",
    "encoder",
    "vision_cnn",
    "vision_vit",
    "diffusion",
    "recsys",
    "speech",
    "gnn",
)
PRECISIONS: tuple[str, ...] = ("fp32", "tf32", "fp16", "bf16", "fp8")
OPTIMIZERS: tuple[str, ...] = ("adamw", "adam", "sgd", "adafactor", "lamb", "lion", "adagrad")
FRAMEWORKS: tuple[str, ...] = ("pytorch", "jax", "tensorflow")
VENDORS: tuple[str, ...] = ("nvidia", "amd", "google", "aws", "intel")

__all__ = ["FAMILIES", "FRAMEWORKS", "OPTIMIZERS", "PRECISIONS", "VENDORS"]
