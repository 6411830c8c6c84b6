"""`Columns` (the serving path's frame) and its look-up helpers."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from leap_stream.core.columns import (
    Coded,
    Columns,
    category_codes,
    codes_of,
    column_codes,
    map_column,
    map_values,
    value_ids,
)


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
    none = codes_of(values, {})  # an empty table: every value absent, on both paths
    assert none.dtype == np.int64 and (none == -1).all() and len(none) == n


@pytest.mark.parametrize("n", [5, 50_000])
def test_map_values_and_map_column_match_series_map_fillna(n: int) -> None:
    rng = np.random.default_rng(n)
    table = {"fp32": 4.0, "bf16": 2.0, "fp8": 1.0}
    pool = np.asarray(["fp32", "bf16", "fp8", "int4", None], dtype=object)
    values = pool[rng.integers(0, len(pool), n)]
    want = pd.Series(values, dtype=object).map(table).fillna(7.0).to_numpy(np.float64)
    got = map_values(values, table, 7.0)
    assert np.array_equal(got, want)
    codes, levels = pd.factorize(values)  # None -> -1
    frames = {  # every encoding a column comes in: the same values
        "object": pd.DataFrame({"p": pd.Series(values, dtype=object)}),
        "categorical": pd.DataFrame({"p": pd.Categorical(values)}),
        "columns": Columns({"p": values}),
        "coded": Columns(
            {"p": Coded(np.where(codes >= 0, codes, len(levels)), np.append(levels, None))}
        ),
    }
    for kind, frame in frames.items():
        got = map_column(frame, "p", table, 7.0)
        assert got.dtype == np.float64 and np.array_equal(got, want), kind


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


def test_a_coded_column_reads_as_its_values_and_codes_through_its_levels() -> None:
    levels = np.asarray(["h100", "a100", None], object)
    c = Columns({"hw": Coded(np.asarray([1, 0, 1, 2]), levels), "x": [1.0, 2.0, 3.0, 4.0]})
    assert c.columns == ["hw", "x"] and "hw" in c
    lut = {"a100": 7, "h100": 3}
    codes = category_codes(c, "hw", lut)
    assert codes is not None and codes.tolist() == [7, 3, 7, -1]
    assert column_codes(c, "hw", lut).tolist() == [7, 3, 7, -1]
    assert c["hw"].tolist() == ["a100", "h100", "a100", None]
    sub = c.take(np.asarray([3, 1]))
    assert sub.coded("hw") is not None and sub["hw"].tolist() == [None, "h100"]
    assert c.to_pandas()["hw"].tolist() == ["a100", "h100", "a100", None]
    ids = value_ids(c, "hw", np.asarray([0, 1, 2]))
    assert ids[0] == ids[2] != ids[1]
    twice = Columns({"t": Coded(np.asarray([0, 1, 2]), np.asarray(["a", "b", "a"], object))})
    dup = value_ids(twice, "t", np.arange(3))  # equal values under two codes: one id
    assert dup[0] == dup[2] != dup[1]
    c["hw"] = np.asarray(["t4"] * 4, object)  # plain values replace the codes
    assert c.coded("hw") is None and category_codes(c, "hw", lut) is None
    assert column_codes(c, "hw", {"t4": 1}).tolist() == [1, 1, 1, 1]
    plain = value_ids(c, "hw", np.arange(4))
    assert len(set(plain.tolist())) == 1
    with pytest.raises(ValueError, match="2 rows"):
        c["y"] = Coded(np.asarray([0, 1]), levels)
