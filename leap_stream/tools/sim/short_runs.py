"""Probes in the simulator: a short run of a submitted attempt on a candidate, whole or a
slice of a few data-parallel replicas of it, measured from the day's true rate at that shape
with a short run's noise (`core.probe.probe_noise` of its length), and the completion a scheduler reports for it
(marked ``probe``, so it never counts as the attempt's own run)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from leap_stream.core.probe import probe_noise, slice_shape


@dataclass
class ShortRuns:
    """One day's probes. `pos`: each (submission, type index)'s row of the day's (submission ×
    candidate) rows (-1: not a candidate), `sliced`: the true rate of
    some of those rows run as slices of a given number of data-parallel replicas; their draws come from `rng`, a stream
    of their own, so the fleet's other draws do not depend on how many probes ran."""

    pos: np.ndarray
    types: Sequence[str]
    rng: np.random.Generator
    sliced: Callable[[np.ndarray, np.ndarray], np.ndarray]

    def measure(
        self,
        submissions: np.ndarray,
        types: Sequence[str],
        minutes: float,
        slice_dp: np.ndarray,
    ) -> np.ndarray:
        """Samples/s a run of ``minutes`` of each (submission position, type) measures, run as
        a slice of ``slice_dp`` data-parallel replicas (the job's own degree: all of it); NaN
        where the type is not one of the submission's candidates."""
        index = {t: i for i, t in enumerate(self.types)}
        hw = np.asarray([index.get(t, -1) for t in types], np.int64)
        sub = np.asarray(submissions, np.int64)
        rows = np.where(hw >= 0, self.pos[sub, np.maximum(hw, 0)], -1)
        noise = np.exp(self.rng.normal(0.0, probe_noise(minutes), len(rows)))
        at = np.maximum(rows, 0)
        true = self.sliced(at, np.asarray(slice_dp, np.int64))
        return np.asarray(np.where(rows >= 0, true * noise, np.nan))


def probe_dataset_rows(
    subs: pd.DataFrame,
    submissions: np.ndarray,
    types: Sequence[str],
    samples_per_s: np.ndarray,
    minutes: float,
    columns: Sequence[str],
    slice_dp: np.ndarray,
) -> pd.DataFrame:
    """Dataset rows (`columns`) of the probes' completions: the submission's fields at the
    slice's shape (devices, data-parallel degree, global batch), the probed type and what it
    measured, run right after submission for ``minutes``."""
    rows = subs.iloc[np.asarray(submissions, np.int64)].reset_index(drop=True)
    started = pd.to_datetime(rows["submitted_at"], utc=True)
    dp = rows["data_parallel"].to_numpy(np.int64)
    nd, gb = slice_shape(
        rows["num_devices"].to_numpy(np.int64),
        dp,
        rows["global_batch_size"].to_numpy(np.int64),
        slice_dp,
    )
    rows = rows.assign(
        num_devices=nd, global_batch_size=gb, data_parallel=np.minimum(slice_dp, np.maximum(dp, 1))
    )
    out = rows.assign(
        event_id=[
            f"prb-{j}-a{a}-{t}"
            for j, a, t in zip(rows["job_id"], rows["attempt"], types, strict=True)
        ],
        hardware_type=list(types),
        samples_per_s=np.asarray(samples_per_s, np.float64),
        tokens_per_s=np.nan,
        steps=1,
        started_at=started,
        ended_at=started + pd.Timedelta(minutes=minutes),
        status="succeeded",
        device_hours=nd * minutes / 60.0,
        quarantine=None,
        probe=True,
    )
    return out[[c for c in columns if c in out.columns]]


__all__ = ["ShortRuns", "probe_dataset_rows"]
