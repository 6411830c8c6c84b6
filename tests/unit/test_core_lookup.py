"""Lookup table: medians per level, coarser fallbacks, JSON round trip."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd

from leap_stream.core.lookup import LookupTable, device_bucket
from leap_stream.store.artefact import read_lookup, write_lookup


def _rows() -> pd.DataFrame:
    return pd.DataFrame(
        {
            "model_type": ["a", "a", "a", "a", "b"],
            "family": ["f", "f", "f", "f", "f"],
            "hardware_type": ["x", "x", "x", "x", "y"],
            "num_devices": [2, 2, 3, 8, 1],
            "samples_per_s": [20.0, 40.0, 36.0, 80.0, 7.0],
            "status": ["succeeded", "succeeded", "preempted", "succeeded", "succeeded"],
        }
    )


def test_device_bucket_powers_of_two() -> None:
    assert device_bucket(np.asarray([1, 2, 3, 4, 7, 8, 100])).tolist() == [1, 2, 2, 4, 4, 8, 64]


def test_levels_and_fallbacks(tmp_path: Path) -> None:
    lk = LookupTable.fit(_rows())
    pred, level = lk.predict(
        ["a", "a", "c", "zz"], ["f", "f", "f", "g"], ["x", "x", "y", "x"], [2, 16, 4, 1]
    )
    # bucket 2 has per-device 10, 20, 12 → median 12, times 2 devices
    assert math.isclose(pred[0], 24.0) and level[0] == 0
    # no bucket 16 for a on x → model×hw median per device (10, 20, 12, 10) = 11, × 16
    assert math.isclose(pred[1], 176.0) and level[1] == 1
    # unknown model type → family×hw (only b on y: 7 per device) × 4
    assert math.isclose(pred[2], 28.0) and level[2] == 2
    assert math.isnan(pred[3]) and level[3] == -1
    path = write_lookup(tmp_path / "lookup.json", lk)
    again = read_lookup(path)
    p2, l2 = again.predict(["a"], ["f"], ["x"], [2])
    assert math.isclose(p2[0], 24.0) and l2[0] == 0


def test_unmeasured_rows_are_ignored() -> None:
    d = _rows()
    d.loc[0, "status"] = "failed"
    d.loc[1, "samples_per_s"] = float("nan")
    lk = LookupTable.fit(d)
    pred, _ = lk.predict(["a"], ["f"], ["x"], [2])
    assert math.isclose(pred[0], 24.0)  # only the 3-device row (12 per device) is left in bucket 2
