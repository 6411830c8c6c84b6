"""`Columns`: a frame as named numpy arrays of one length, for the serving path.

A pandas DataFrame costs milliseconds per batch to build and to index (Series objects, index
alignment, block consolidation): at one event per batch that was ~14 ms, most of a ranking's
latency, against ~0.1 ms for the LightGBM call itself (docs/benchmarks.md). The core builds and
reads `Columns`; training and the backtest keep DataFrames (`to_pandas`, `Columns.of`).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from itertools import repeat
from typing import Any, NamedTuple

import numpy as np
import pandas as pd


class Coded(NamedTuple):
    """An object column given as ``levels[codes]``. A serving batch's strings (hardware type,
    vendor, the job's model type …) take a few dozen values over thousands of rows: kept this
    way, a model's level codes for them are one look-up per level, not one per row
    (`column_codes`), and the strings themselves are built only when read."""

    codes: np.ndarray  # int, one per row
    levels: np.ndarray  # object


class Columns:
    """Equal-length 1-d numpy arrays by name; ``len()`` is the number of rows. A column set as
    `Coded` keeps its codes and is turned into values when first read."""

    __slots__ = ("_coded", "_data", "_n")

    def __init__(self, data: Mapping[str, Any] | None = None, n: int | None = None) -> None:
        self._data: dict[str, np.ndarray | None] = {}  # None: coded, values not built yet
        self._coded: dict[str, Coded] = {}
        self._n = n
        for name, values in (data or {}).items():
            self[name] = values
        if self._n is None:
            self._n = 0

    @classmethod
    def of(cls, frame: pd.DataFrame | Columns) -> Columns:
        """The columns of a DataFrame as numpy arrays (no copy where pandas has none to make)."""
        if isinstance(frame, Columns):
            return frame
        return cls({str(c): frame[c].to_numpy() for c in frame.columns}, len(frame))

    @classmethod
    def of_rows(cls, rows: Sequence[Mapping[str, Any]], names: Iterable[str]) -> Columns:
        """Flat row dicts (stored submissions) as columns: a column of numbers (None as NaN)
        becomes float64, any other an object array. No DataFrame on the way: building one from
        dicts was most of a completions batch's CPU."""
        out = cls(n=len(rows))
        for name in names:
            values = [r.get(name) for r in rows]
            if all(v is None or type(v) in (int, float) for v in values):
                out[name] = np.array([np.nan if v is None else v for v in values], np.float64)
            else:
                out[name] = np.array(values, dtype=object)
        return out

    def __len__(self) -> int:
        return self._n or 0

    def __getitem__(self, name: str) -> np.ndarray:
        values = self._data[name]
        if values is None:
            coded = self._coded[name]
            values = self._data[name] = coded.levels[coded.codes]
        return values

    def __setitem__(self, name: str, values: Any) -> None:
        coded = values if isinstance(values, Coded) else None
        arr = np.asarray(values if coded is None else coded.codes)
        if arr.ndim != 1:
            raise ValueError(f"column {name!r} is not one-dimensional")
        if self._n is None:
            self._n = len(arr)
        elif len(arr) != self._n:
            raise ValueError(f"column {name!r} has {len(arr)} rows, the frame {self._n}")
        if coded is None:
            self._data[name] = arr
            self._coded.pop(name, None)
        else:
            self._data[name] = None
            self._coded[name] = Coded(arr, np.asarray(coded.levels, dtype=object))

    def coded(self, name: str) -> Coded | None:
        """The column's codes and levels when it was set as `Coded`."""
        return self._coded.get(name)

    def __contains__(self, name: object) -> bool:
        return name in self._data

    def __iter__(self) -> Iterator[str]:
        return iter(self._data)

    @property
    def columns(self) -> list[str]:
        return list(self._data)

    def take(self, rows: np.ndarray) -> Columns:
        """The rows at these positions (or where a boolean mask is true)."""
        rows = np.asarray(rows)
        n = int(rows.sum()) if rows.dtype == bool else len(rows)
        out = Columns(n=n)
        for name in self._data:
            coded = self._coded.get(name)
            out[name] = Coded(coded.codes[rows], coded.levels) if coded else self[name][rows]
        return out

    def to_pandas(self) -> pd.DataFrame:
        """String columns stay numpy object arrays: pandas 3 would otherwise convert each to an
        Arrow string column, and the predictor back to object."""
        index = pd.RangeIndex(len(self))
        cols = {
            c: pd.Series(v, index=index, dtype=object, copy=False) if v.dtype == object else v
            for c, v in ((c, self[c]) for c in self._data)
        }
        return pd.DataFrame(cols, index=index, copy=False)


# A frame as the core reads it: a DataFrame (training, backtest) or `Columns` (serving).
Frame = pd.DataFrame | Columns


def f64(frame: Frame, col: str) -> np.ndarray:
    """One column as float64, from either kind of frame."""
    return np.asarray(frame[col], np.float64)


def codes_of(values: np.ndarray, lut: Mapping[Any, int]) -> np.ndarray:
    """Integer code per value through a dict (-1 when absent): on the small arrays of a serving
    batch a Python look-up beats building a pandas Index; large arrays go through pandas."""
    n = len(values)
    if not lut:
        return np.full(n, -1, np.int64)
    if n > 20_000:
        index = pd.Index(list(lut), dtype=object)
        pos = index.get_indexer(pd.Index(values, dtype=object, copy=False))
        codes = np.asarray(list(lut.values()), np.int64)
        return np.where(pos >= 0, codes[pos], -1)
    # map() over a list with the default repeated: no Python frame per value (~1/3 faster)
    return np.fromiter(map(lut.get, values.tolist(), repeat(-1)), np.int64, count=n)


def category_codes(frame: Frame, col: str, lut: Mapping[Any, int]) -> np.ndarray | None:
    """``codes_of`` a column through the frame's own encoding of it: a DataFrame's categorical
    (a year of training rows has a few hundred distinct values: no object array of every row)
    or a `Coded` column of `Columns` (a serving batch); None for any other column."""
    if isinstance(frame, Columns):
        coded = frame.coded(col)
        if coded is None:
            return None
        return codes_of(coded.levels, lut)[coded.codes]
    values = frame[col]
    if not isinstance(values.dtype, pd.CategoricalDtype):
        return None
    per_category = codes_of(np.asarray(values.cat.categories, dtype=object), lut)
    codes = values.cat.codes.to_numpy()
    return np.where(codes >= 0, np.append(per_category, -1)[codes], -1)


def column_codes(frame: Frame, col: str, lut: Mapping[Any, int]) -> np.ndarray:
    """``codes_of`` one column, through the frame's encoding of it where it has one."""
    codes = category_codes(frame, col, lut)
    return codes if codes is not None else codes_of(np.asarray(frame[col], object), lut)


def value_ids(frame: Frame, col: str, rows: np.ndarray) -> np.ndarray:
    """Per row of ``rows``, a non-negative integer, equal exactly where the column's values are
    (through a `Coded` column's levels when it is one)."""
    coded = frame.coded(col) if isinstance(frame, Columns) else None
    if coded is not None:
        return _first_ids(coded.levels)[coded.codes[rows]]
    return _first_ids(np.asarray(frame[col], object)[rows])


def _first_ids(values: np.ndarray) -> np.ndarray:
    """Per value, the rank of its first occurrence among the distinct values."""
    return codes_of(values, {v: i for i, v in enumerate(dict.fromkeys(values.tolist()))})


def map_column(frame: Frame, col: str, table: Mapping[Any, float], default: float) -> np.ndarray:
    """`map_values` of one column, through the frame's encoding of it where it has one: a
    year's categorical column maps its few categories, not an object array of every row."""
    return _by_code(table, default)[column_codes(frame, col, _positions(table))]


def map_values(values: np.ndarray, table: Mapping[Any, float], default: float) -> np.ndarray:
    """``table[v]`` per value as float64, ``default`` when absent (``Series.map().fillna()``)."""
    return _by_code(table, default)[codes_of(values, _positions(table))]


def _positions(table: Mapping[Any, float]) -> dict[Any, int]:
    return {v: i for i, v in enumerate(table)}


def _by_code(table: Mapping[Any, float], default: float) -> np.ndarray:
    """The table's values by position, then ``default`` (at code -1: absent)."""
    return np.append(np.fromiter(table.values(), np.float64, count=len(table)), default)


__all__ = [
    "Coded",
    "Columns",
    "Frame",
    "category_codes",
    "codes_of",
    "column_codes",
    "f64",
    "map_column",
    "map_values",
    "value_ids",
]
