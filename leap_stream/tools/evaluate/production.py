"""The production model under the evaluation protocol: `ThroughputModel`, the model that ranks
jobs in the worker and `serve`, fitted on the pairs of the other workloads and asked for B's
per-device throughput given A's measurement, exactly as the worker asks it for a candidate
given a lineage's prior on another type.

Each pair (A, B) becomes one row of the feature builder (`core.features.build`): the job is
B's configuration (workload → model type; the table's config columns where it has them,
missing values where it does not), the candidate is B's type, and the lineage's history is A's
measurement on A's type. The fitted model's transfer prediction (prior_A moved by the ratio
model) less A's log rate is the predicted log ratio; the protocol says which pairs each fit
learns from and predicts (`protocol.workload_folds`, `protocol.type_splits`).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from leap_stream.catalog import HardwareCatalog
from leap_stream.contracts.vocab import FAMILIES, PRECISIONS
from leap_stream.core import features as F
from leap_stream.core.history import Measurement
from leap_stream.core.predictor import ThroughputModel

# a table's configuration columns (`table.NUMERIC`) → the job frame's
CONFIG = {
    "parameters": "parameters",
    "layers": "layers",
    "hidden_size": "hidden_size",
    "sequence_length": "sequence_length",
    "batch_size": "global_batch_size",
}
NUM_ROUNDS = 300  # a table's few thousand pairs need far fewer rounds than a fleet's year


def jobs_frame(rows: pd.DataFrame, p: pd.DataFrame) -> pd.DataFrame:
    """One job per pair: B's configuration as a submission would carry it (NaN: not known)."""
    b = p["b"].to_numpy(np.int64)
    n = len(b)
    family = rows["family"].to_numpy(object)[b]
    precision = rows["precision"].to_numpy(object)[b]
    jobs = pd.DataFrame(
        {
            "family": np.where(np.isin(family, FAMILIES), family, ""),
            "model_type": rows["workload"].to_numpy(object)[b],
            "precision": np.where(np.isin(precision, PRECISIONS), precision, ""),
            "optimizer": np.full(n, "", object),
            "framework": np.full(n, "", object),
            "num_devices": rows["count"].to_numpy(np.float64)[b],
        }
    )
    for column in F.JOB_COLUMNS:
        if column not in jobs.columns:
            jobs[column] = np.nan
    for source, column in CONFIG.items():
        jobs[column] = rows[source].to_numpy(np.float64)[b]
    return jobs


def frame_of(rows: pd.DataFrame, p: pd.DataFrame, catalog: HardwareCatalog) -> pd.DataFrame:
    """The feature builder's rows of pairs `p`: B's job on B's type, A's measurement its
    history."""
    a = p["a"].to_numpy(np.int64)
    lpd = rows["log_pd"].to_numpy(np.float64)
    count = rows["count"].to_numpy(np.float64)
    histories = [
        {str(t): Measurement(float(np.exp(lpd[i]) * count[i]), int(count[i]), 0.0, 1)}
        for t, i in zip(p["a_type"].to_numpy(object), a, strict=True)
    ]
    return F.build(
        jobs_frame(rows, p),
        [[str(t)] for t in p["b_type"].to_numpy(object)],
        histories,
        [None] * len(p),
        catalog.spec_matrix(),
        np.zeros(len(p)),
    )


def predict(
    rows: pd.DataFrame,
    p: pd.DataFrame,
    catalog: HardwareCatalog,
    splits: list[tuple[np.ndarray, np.ndarray]],
) -> np.ndarray:
    """Per (train, test) split of the pairs, the test pairs predicted by a model fitted on the
    train pairs: the predicted log(B's per-device rate ÷ A's); NaN where no split tests."""
    frame = frame_of(rows, p, catalog)
    lpd = rows["log_pd"].to_numpy(np.float64)
    a, b = p["a"].to_numpy(np.int64), p["b"].to_numpy(np.int64)
    measured = np.exp(lpd[b]) * rows["count"].to_numpy(np.float64)[b]
    jobs = p["job"].to_numpy()
    pred = np.full(len(p), np.nan)
    for train, test in splits:
        model = ThroughputModel.fit(
            frame[train].reset_index(drop=True),
            measured[train],
            jobs[train],
            num_rounds=NUM_ROUNDS,
        )
        held = frame[test].reset_index(drop=True)
        p50, _lo, _hi = model.predict(held)
        pred[test] = np.log(p50) - held["log_devices"].to_numpy(np.float64) - lpd[a[test]]
    return pred
