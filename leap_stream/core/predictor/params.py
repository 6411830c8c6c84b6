"""What a throughput model is built with: the boosters' hyper-parameters, the sizes that bound a
fit, the anchor kinds and the training support a job is judged against."""

from __future__ import annotations

import os
import threading
import zlib
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import lightgbm as lgb
import numpy as np
import pandas as pd

from leap_stream.core.columns import (
    Frame,
    f64,
)

Scorer = Callable[[np.ndarray], np.ndarray]
# `ThroughputModel.scorer_kind`: LightGBM's own predict, or the same trees compiled
LIGHTGBM_KIND = "lightgbm"
COMPILED_KIND = "compiled"
# Compiles a booster's trees for `ThroughputModel.fit` to score its own training rows with
# (stream/compiled.py's `fit_scorer`; categories: the levels of its categorical features);
# None when it cannot. Core never imports the compiler: the trainer hands it in.
BoosterCompiler = Callable[[lgb.Booster, Mapping[str, Sequence[str]]], Scorer | None]

# the largest log a bound may take: exp of it is finite (a ranking's numbers must be JSON numbers)
LOG_FLOAT_MAX = float(np.log(np.finfo(np.float64).max)) - 1.0
# A type the trees never saw (a new part) is predicted from its specs alone. How far off that
# is, measured at fit: the booster refitted without the fastest `UNSEEN_TYPES` types with
# `MIN_TYPE_ROWS` held-out rows (a part a fleet adds is most often faster than what it has),
# on at most `UNSEEN_TYPE_ROWS` rows, scoring those types' held-out rows. One fit for all of
# them: one per type cost 70 % more training time for the same coverage (docs/model.md).
UNSEEN_TYPES = 3
UNSEEN_TYPE_ROWS = 200_000

DEFAULT_PARAMS: dict[str, Any] = {
    "objective": "huber",
    "alpha": 0.3,  # huber delta in log units: robust to the odd straggler measurement
    "learning_rate": 0.2,
    "num_leaves": 63,
    "min_data_in_leaf": 50,
    "feature_fraction": 0.9,
    "bagging_fraction": 0.8,
    "bagging_freq": 1,
    "lambda_l2": 5.0,
    "max_bin": 127,
    "cat_smooth": 10.0,
    "max_cat_to_onehot": 8,
    "verbose": -1,
}
NUM_ROUNDS = 150
EARLY_STOP = 40
BAG_ROWS = 2_000_000  # rows a tree sees at most (`_bagging_fraction`)
FIT_ROWS = 4_000_000  # training rows the boosters fit at most (`_fit_sample`)
# Lineage effects taken out before the second fit: a lineage's mean residual shrunk by this
# many pseudo-rows at zero (a lineage seen once moves a third of the way).
LINEAGE_SHRINK = 2.0
# The ratio model, fitted on the pairs a fleet has (lineages measured on two types); below
# RATIO_MIN_ROWS pairs the booster difference stays. Deep trees, few of them: 60 trees of 127
# leaves cost what 100 of 31 did to score (traversal grows with depth) and put more transfer
# rows within ±10 % (docs/decisions/0004)
RATIO_PARAMS: dict[str, Any] = {
    **DEFAULT_PARAMS,
    "num_leaves": 127,
    "min_data_in_leaf": 30,
    "feature_fraction": 0.8,
}
RATIO_ROUNDS = 60
RATIO_EARLY_STOP = 20
RATIO_MIN_ROWS = 500
# the ratio model's trees need pairs of this many model types or more to move the prior of a
# model type they never saw better than the type-pair effects; with fewer (a benchmark table,
# a fleet's first weeks) the effects move priors alone (docs/decisions/0012)
RATIO_MIN_MODEL_TYPES = 30
# and this share of the pairs with the job's work per sample known (its parameters): without
# it the trees see a new model type only through its hardware (a benchmark table without its
# configuration, whatever its workloads)
RATIO_MIN_CONFIGURED = 0.5
# Pairs the ratio model fits at most, each in both directions (`_at_most`): every pair of a
# backtest's night (tens of thousands), a sample of a year's ~3M, whose matrix was the peak
# of a year's training (docs/benchmarks.md)
RATIO_PAIRS = 1_000_000
# Hardware inputs whose candidate − prior difference the ratio model also sees directly.
RATIO_DIFFS = (
    "log_phys_rate",
    "log_t_compute",
    "log_t_memory",
    "log_t_comm",
    "log_peak_tflops",
    "log_mem_bw",
    "log_interconnect",
    "log_device_mem",
    "log_ideal_micro_s",
    "log_roofline",
    "log_domains",
    "log_network",
)
BOOSTER_RATIO = "booster_ratio"  # f(job, candidate) − f(job, B): the main booster's own ratio
# `ModelMetadata.ratio_base`: the ratio model learns the measured ratio less the physics ratio
# (learned roofline and pair effects, candidate less prior type); a model without it learned the
# whole ratio
PHYSICS_RATIO = "physics"
# prior_B − f(job, B): how far the lineage runs from what its configuration predicts on B. A job
# slow for its configuration (an input pipeline, a host bottleneck) gains less on a faster type,
# which no hardware input says (docs/decisions/0001)
PRIOR_RESIDUAL = "prior_residual"


def _threads(rows: int, predict: bool = False) -> int:
    """OpenMP threads: one for small work (spinning threads cost more than they save on a
    shared 2-core box), two for big training sets and serving batches, never more than the
    cores this process may run on (a worker pinned to one core would spin two threads on
    it)."""
    big = rows >= (2_000 if predict else 200_000)
    return max(1, min(2, usable_cores())) if big else 1


def usable_cores() -> int:
    """The cores this process may run on now (its CPU affinity where the OS has one)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


# LightGBM's predict is not safe on one booster from two threads (a data race where it builds its
# Predictor, LightGBM issue 6142): the worker's batches and the compile thread's check of the
# compiled trees against LightGBM both predict with the serving model's boosters, and a
# `leap-stream demo` worker segfaulted there. Every LightGBM predict goes through this lock.
_LIGHTGBM_PREDICT = threading.Lock()


def lightgbm_predict(booster: lgb.Booster, X: np.ndarray, num_threads: int) -> np.ndarray:
    """``booster.predict`` under the process's LightGBM predict lock (the one way to call it)."""
    with _LIGHTGBM_PREDICT:
        return np.asarray(booster.predict(X, num_threads=num_threads))


def predict_threads(rows: int) -> int:
    """Threads for scoring `rows` rows (LightGBM's predict, the compiled trees alike)."""
    return _threads(rows, predict=True)


def holdout_mask(lineage_ids: np.ndarray | pd.Series, fraction: float, seed: int = 0) -> np.ndarray:
    """Deterministic split by lineage (rows of one lineage share history; keep them together)."""
    salt = str(seed).encode()
    h = np.fromiter(
        (zlib.crc32(salt + str(x).encode()) for x in np.asarray(lineage_ids, dtype=object)),
        np.uint64,
        count=len(lineage_ids),
    )
    return np.asarray((h % 10_000) < int(fraction * 10_000))


KINDS = ("self", "transfer", "model")

# Out of distribution: a job whose configuration lies outside what the model was trained on.
# The support is the 0.5-99.5 % range of each of these columns over the training rows (log
# units); a job further than OOD_MARGIN (×2) outside any of them is flagged, and every interval
# of it widens by how far outside it is: extrapolating ×e^d past the data adds d of log
# uncertainty on each side (docs/model.md).
SUPPORT_COLUMNS = (
    "log_params",
    "log_seq",
    "log_global_batch",
    "log_devices",
    "log_flops_per_sample",
    "log_mem_per_device_gib",
)
SUPPORT_QUANTILES = (0.005, 0.995)
OOD_MARGIN = float(np.log(2.0))
KIND_SELF, KIND_TRANSFER, KIND_MODEL = 0, 1, 2


def anchor_kind(frame: Frame, groups: Sequence[str]) -> np.ndarray:
    """Which estimate a row gets (see the module docstring); `prior` ablated → always model."""
    kind = np.full(len(frame), KIND_MODEL, np.int64)
    if "prior" not in groups:
        return kind
    kind[np.isfinite(f64(frame, "other_log_pd"))] = KIND_TRANSFER
    kind[np.isfinite(f64(frame, "self_log_pd"))] = KIND_SELF
    return kind
