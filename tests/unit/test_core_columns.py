"""`Columns` (the serving path's frame) and its look-up helpers."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from leap_stream.core.columns import Columns, codes_of, map_values


def test_columns_rows_take_and_pandas_round_trip() -> None:
    c = Columns({"x": [1.0, 2.0, 3.0], "s": np.asarray(["a", None, "c"], object)})
    assert len(c) == 3 and c.columns == ["x", "s"] and "x" in c and "y" not in c
    c["z"] = np.arange(3)
    sub = c.take(np.asarray([True, False, True]))
    assert len(sub) == 2 and sub["x"].tolist() == [1.0, 3.0] and sub["s"].tolist() == ["a", "c"]
    assert c.take(np.asarray([2, 0]))["z"].tolist() == [2, 0]
    df = c.to_pandas()
    assert df["s"].dtype == object  # not an Arrow string column
    back = Columns.of(df)
    assert len(back) == 3 and back["x"].tolist() == [1.0, 2.0, 3.0]
    assert Columns.of(back) is back


def test_columns_refuse_a_column_of_another_length() -> None:
    c = Columns({"x": [1, 2]})
    with pytest.raises(ValueError, match="3 rows"):
        c["y"] = [1, 2, 3]
    with pytest.raises(ValueError, match="one-dimensional"):
        c["y"] = np.zeros((2, 2))
    assert len(Columns(n=4)) == 4 and len(Columns()) == 0


@pytest.mark.parametrize("n", [5, 50_000])  # the dict path and the pandas path
def test_codes_of_matches_pandas_get_indexer(n: int) -> None:
    rng = np.random.default_rng(n)
    levels = ["h100", "a100", "mi300x", "tpu-v5e"]
    pool = np.asarray([*levels, "unseen", None], dtype=object)
    values = pool[rng.integers(0, len(pool), n)]
    lut = {v: i for i, v in enumerate(levels)}
    want = pd.Index(levels, dtype=object).get_indexer(pd.Index(values, dtype=object))
    got = codes_of(values, lut)
    assert got.dtype == np.int64 and np.array_equal(got, want)


@pytest.mark.parametrize("n", [5, 50_000])
def test_map_values_matches_series_map_fillna(n: int) -> None:
    rng = np.random.default_rng(n)
    table = {"fp32": 4.0, "bf16": 2.0, "fp8": 1.0}
    pool = np.asarray(["fp32", "bf16", "fp8", "int4", None], dtype=object)
    values = pool[rng.integers(0, len(pool), n)]
    want = pd.Series(values, dtype=object).map(table).fillna(7.0).to_numpy(np.float64)
    got = map_values(values, table, 7.0)
    assert np.array_equal(got, want)


def test_of_rows_makes_numbers_float_and_keeps_the_rest() -> None:
    rows = [
        {"parameters": 7, "active_parameters": None, "precision": "bf16", "flag": True},
        {"parameters": 1.5e9, "active_parameters": 2.0, "precision": "fp8", "flag": False},
    ]
    cols = Columns.of_rows(rows, ["parameters", "active_parameters", "precision", "flag", "gone"])
    assert cols["parameters"].dtype == np.float64 and cols["parameters"].tolist() == [7.0, 1.5e9]
    assert np.isnan(cols["active_parameters"][0]) and cols["active_parameters"][1] == 2.0
    assert cols["precision"].dtype == object and cols["flag"].tolist() == [True, False]
    assert np.isnan(cols["gone"]).all() and len(cols) == 2
    assert len(Columns.of_rows([], ["parameters"])) == 0
