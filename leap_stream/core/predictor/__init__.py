"""The throughput model: a learned roofline, a LightGBM booster over it, the ratio model that
moves a lineage's prior across hardware, and their intervals (docs/model.md).

One idea per module: `model` (`ThroughputModel`: fit, predict, intervals, text), `params`
(hyper-parameters, sizes, anchor kinds, the training support), `fit` (the boosters' training),
`ratio` (the ratio model's pairs and inputs), `type_pairs` (its form on few model types),
`matrix` (the main booster's inputs and offset), `pairs` ((model type × hardware) effects),
`metadata` (what a model says about itself).
"""

from leap_stream.core.predictor.metadata import ModelMetadata, check_model_text
from leap_stream.core.predictor.model import ThroughputModel
from leap_stream.core.predictor.pairs import RARE_PAIR_ROWS
from leap_stream.core.predictor.params import (
    COMPILED_KIND,
    KIND_MODEL,
    KIND_SELF,
    KIND_TRANSFER,
    KINDS,
    LIGHTGBM_KIND,
    NUM_ROUNDS,
    OOD_MARGIN,
    BoosterCompiler,
    Scorer,
    anchor_kind,
    holdout_mask,
    lightgbm_predict,
    predict_threads,
)
from leap_stream.core.predictor.ratio import ratio_features

__all__ = [
    "COMPILED_KIND",
    "KINDS",
    "KIND_MODEL",
    "KIND_SELF",
    "KIND_TRANSFER",
    "LIGHTGBM_KIND",
    "NUM_ROUNDS",
    "OOD_MARGIN",
    "RARE_PAIR_ROWS",
    "BoosterCompiler",
    "ModelMetadata",
    "Scorer",
    "ThroughputModel",
    "anchor_kind",
    "check_model_text",
    "holdout_mask",
    "lightgbm_predict",
    "predict_threads",
    "ratio_features",
]
