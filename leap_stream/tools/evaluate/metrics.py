"""The figures `evaluate` reports, shared by the protocol (scoring a method) and the model's
inner selection (scoring a choice on the training workloads); pure."""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np
import pandas as pd


def ape(pred: np.ndarray, truth: np.ndarray) -> np.ndarray:
    """Absolute percentage error of each predicted log ratio against the measured one."""
    return np.abs(np.expm1(np.asarray(pred, np.float64) - np.asarray(truth, np.float64)))


@functools.cache
def _upper_pairs(n: int) -> tuple[np.ndarray, np.ndarray]:
    """Every (i, j) with i < j < n (a job has few types: a handful of sizes, asked often)."""
    return np.triu_indices(n, 1)


@dataclass(frozen=True)
class OrderPairs:
    """Every (A; B, C) comparison of a pair frame: two pairs from the same measured row A,
    to other types B ≠ C whose measured ratios differ. Built once, it scores any number of
    predictions of the same pairs."""

    first: np.ndarray  # index of (A, B)
    second: np.ndarray  # index of (A, C)
    truth_sign: np.ndarray  # sign of the measured ratio B ÷ C

    @classmethod
    def of(cls, source: np.ndarray, truth: np.ndarray, types: np.ndarray) -> OrderPairs:
        """`source`: each pair's row A; `truth`: its measured log ratio; `types`: B's type."""
        order = np.argsort(source, kind="stable")
        bounds = np.flatnonzero(np.diff(source[order])) + 1
        firsts: list[np.ndarray] = []
        seconds: list[np.ndarray] = []
        for block in np.split(order, bounds):
            if len(block) < 2:
                continue
            i, j = _upper_pairs(len(block))
            use = (types[block[i]] != types[block[j]]) & (truth[block[i]] != truth[block[j]])
            firsts.append(block[i[use]])
            seconds.append(block[j[use]])
        first = np.concatenate(firsts) if firsts else np.zeros(0, np.int64)
        second = np.concatenate(seconds) if seconds else np.zeros(0, np.int64)
        return cls(first, second, np.sign(truth[first] - truth[second]))

    @classmethod
    def of_frame(cls, pairs: pd.DataFrame) -> OrderPairs:
        """Of a pair frame (`a`, `log_ratio`, `b_type`: protocol.pairs)."""
        return cls.of(
            pairs["a"].to_numpy(),
            pairs["log_ratio"].to_numpy(np.float64),
            pairs["b_type"].to_numpy(object),
        )

    def __len__(self) -> int:
        return len(self.first)

    def right(self, pred: np.ndarray) -> float:
        """Comparisons `pred` orders as measured; a predicted tie counts as half."""
        dq = np.sign(pred[self.first] - pred[self.second])
        return float(np.sum(dq == self.truth_sign) + 0.5 * np.sum(dq == 0))

    def accuracy(self, pred: np.ndarray) -> float:
        return self.right(pred) / len(self) if len(self) else float("nan")
