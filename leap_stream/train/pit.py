"""Point-in-time replay: the history each dataset row would have seen when it was submitted.

A row sees only completions that *ended before its submitted_at*, replayed through the same
`HistoryBook` rules the online store applies in Lua, so training rows carry exactly the history
serving will see.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import pandas as pd

from leap_stream.contracts.timestamps import epoch_seconds
from leap_stream.core.features import SpecArrays, log_rate_ceiling
from leap_stream.core.history import (
    MEASURED_STATUSES,
    QUARANTINE_RULES,
    AggregateLog,
    AggregatesAsOf,
    HistoryBook,
    LineageHistory,
    TypeAggregates,
)


@dataclass
class Snapshots:
    histories: list[LineageHistory]
    aggregates: list[TypeAggregates]  # empty with `aggregates_as_of`
    now: np.ndarray  # submitted_at, epoch s
    book: HistoryBook  # state after every completion that ended before the last query
    # per row of `completions` (its order): what the rules made of it; "none" also for rows
    # not replayed (ended after the last query, unless replay(finish=True))
    verdicts: np.ndarray
    aggregates_as_of: AggregatesAsOf | None = None  # replay_chunks(aggregate_log=True)


def replay(
    completions: pd.DataFrame,
    queries: pd.DataFrame,
    book: HistoryBook | None = None,
    finish: bool = False,
    specs: SpecArrays | None = None,
) -> Snapshots:
    """History snapshots for each row of `queries` (lineage_id, model_type, submitted_at),
    built from `completions` (dataset rows) ending strictly before the query's submitted_at.

    Snapshots are shared between rows while nothing changed (a lineage's dict, a model type's
    aggregates), which keeps memory linear in completions, not rows × types. Treat them as
    read-only. ``finish``: also apply the completions that ended after the last query, for
    their verdicts (the book then holds them too). ``specs``: the catalog, for the physics
    reference of the guard (as the worker applies it; without, that rule is not applied).
    """
    n = len(queries)
    histories: list[LineageHistory] = [{}] * n
    aggregates: list[TypeAggregates] = [{}] * n
    last: Snapshots | None = None
    for rows, part in replay_chunks(completions, queries, book, finish, specs, max(n, 1)):
        for j, i in enumerate(rows.tolist()):
            histories[i] = part.histories[j]
            aggregates[i] = part.aggregates[j]
        last = part
    assert last is not None
    return Snapshots(
        histories, aggregates, epoch_seconds(queries["submitted_at"]), last.book, last.verdicts
    )


def replay_chunks(
    completions: pd.DataFrame,
    queries: pd.DataFrame,
    book: HistoryBook | None = None,
    finish: bool = False,
    specs: SpecArrays | None = None,
    chunk_rows: int = 200_000,
    aggregate_log: bool = False,
) -> Iterator[tuple[np.ndarray, Snapshots]]:
    """`replay` in pieces of at most ``chunk_rows`` queries, in submission order: (the
    queries' positions, their snapshots). A caller that turns each piece into features and
    drops it holds one piece's snapshots at a time, not a year's. The verdicts array is
    shared by every piece and complete once the iteration ends. Always yields once.
    ``aggregate_log``: each piece's aggregates as an `AggregatesAsOf` over a log of changes
    instead of a dict per change (the same values, a fraction of the time and memory)."""
    book = book or HistoryBook()
    c_end = epoch_seconds(completions["ended_at"])
    c_order = np.argsort(c_end, kind="stable")
    c_end = c_end[c_order]
    c_lin = completions["lineage_id"].to_numpy(object)[c_order]
    c_mt = completions["model_type"].to_numpy(object)[c_order]
    c_hw = completions["hardware_type"].to_numpy(object)[c_order]
    c_st = completions["status"].to_numpy(object)[c_order]
    c_sps = completions["samples_per_s"].to_numpy(np.float64)[c_order]
    c_nd = completions["num_devices"].to_numpy(np.int64)[c_order]
    c_asked = submitted_devices(completions)[c_order]
    c_ceiling = ceilings(completions, specs)[c_order]

    q_now = epoch_seconds(queries["submitted_at"])
    q_order = np.argsort(q_now, kind="stable")
    q_lin = queries["lineage_id"].to_numpy(object)
    q_mt = queries["model_type"].to_numpy(object)
    lin_cache: dict[str, LineageHistory] = {}
    agg_cache: dict[str, TypeAggregates] = {}
    verdicts = np.full(len(c_end), "none", dtype=object)
    ptr, n_c = 0, len(c_end)
    log: AggregateLog | None = None

    def apply_until(t: float) -> None:
        nonlocal ptr
        while ptr < n_c and c_end[ptr] < t:
            sps = c_sps[ptr]
            outcome = book.apply(
                c_lin[ptr],
                c_mt[ptr],
                c_hw[ptr],
                c_st[ptr],
                None if np.isnan(sps) else float(sps),
                int(c_nd[ptr]),
                float(c_end[ptr]),
                None if c_asked[ptr] <= 0 else int(c_asked[ptr]),
                None if np.isnan(c_ceiling[ptr]) else float(c_ceiling[ptr]),
            )
            if outcome != "none":
                verdicts[c_order[ptr]] = outcome
                lin_cache.pop(c_lin[ptr], None)
                agg_cache.pop(c_mt[ptr], None)
                if log is not None and outcome not in QUARANTINE_RULES:
                    changed = book.aggregate(c_mt[ptr], c_hw[ptr])
                    assert changed is not None
                    log.record(c_mt[ptr], c_hw[ptr], changed)
            ptr += 1

    starts = range(0, max(len(q_order), 1), max(chunk_rows, 1))
    for k, start in enumerate(starts):
        rows = q_order[start : start + chunk_rows]
        histories: list[LineageHistory] = []
        aggregates: list[TypeAggregates] = []
        log = AggregateLog.starting_from(book) if aggregate_log else None
        marks = np.zeros(len(rows), np.int64)
        for j, i in enumerate(rows.tolist()):
            apply_until(q_now[i])
            lin = q_lin[i]
            h = lin_cache.get(lin)
            if h is None:
                h = lin_cache[lin] = book.lineage(lin)
            histories.append(h)
            if log is not None:
                marks[j] = log.mark()
                continue
            mt = q_mt[i]
            a = agg_cache.get(mt)
            if a is None:
                a = agg_cache[mt] = book.aggregates(mt)
            aggregates.append(a)
        if finish and k == len(starts) - 1:
            apply_until(np.inf)
        as_of = (
            AggregatesAsOf(log, log.model_type_codes(q_mt[rows].tolist()), marks)
            if log is not None
            else None
        )
        yield rows, Snapshots(histories, aggregates, q_now[rows], book, verdicts, as_of)


_PARALLEL = ("data_parallel", "tensor_parallel", "pipeline_parallel")


def submitted_devices(rows: pd.DataFrame) -> np.ndarray:
    """The device count each row's submission asked for (its data × tensor × pipeline
    parallel; a row's ``num_devices`` is the completion's); 0 where unknown."""
    if not all(c in rows.columns for c in _PARALLEL):
        return np.zeros(len(rows), np.int64)
    out = np.ones(len(rows), np.int64)
    for c in _PARALLEL:
        out *= rows[c].to_numpy(np.int64)
    return out


def ceilings(rows: pd.DataFrame, specs: SpecArrays | None) -> np.ndarray:
    """Each row's physics ceiling on the hardware it ran on (NaN without specs or columns)."""
    if specs is None or len(rows) == 0 or "parameters" not in rows.columns:
        return np.full(len(rows), np.nan)
    return log_rate_ceiling(rows, rows["hardware_type"].tolist(), specs)


def measured(dataset: pd.DataFrame) -> pd.DataFrame:
    """Rows that carry a throughput measurement (the training rows)."""
    sps = dataset["samples_per_s"].to_numpy(np.float64)
    ok = dataset["status"].isin(list(MEASURED_STATUSES)).to_numpy() & np.isfinite(sps) & (sps > 0)
    if ok.all() and dataset.index.equals(pd.RangeIndex(len(dataset))):
        return dataset  # no copy of a year of rows that are all measured already
    return dataset.loc[ok].reset_index(drop=True)


class Replayer:
    """Incremental `replay` for day-by-day backtests: completions may be added in any order
    (a job submitted today can end in three days); queries must come in time order."""

    def __init__(self) -> None:
        self.book = HistoryBook()
        self._pending: list[pd.DataFrame] = []
        self._last_query = -np.inf

    def add_completions(self, completions: pd.DataFrame) -> None:
        cols = ["lineage_id", "model_type", "hardware_type", "status", "samples_per_s"]
        cols += [c for c in _PARALLEL if c in completions.columns]
        part = completions[[*cols, "num_devices"]].copy()
        part["ended_s"] = epoch_seconds(completions["ended_at"])
        self._pending.append(part)

    def snapshot(self, queries: pd.DataFrame) -> Snapshots:
        """Histories as of each query's submitted_at (queries no earlier than the last ones)."""
        q_now = epoch_seconds(queries["submitted_at"])
        if len(q_now) and q_now.min() < self._last_query:
            raise ValueError("queries must come in time order")
        pending = pd.concat(self._pending, ignore_index=True) if self._pending else pd.DataFrame()
        if len(pending):
            pending = pending.sort_values("ended_s", kind="stable")
        horizon = q_now.max() if len(q_now) else -np.inf
        due = pending[pending["ended_s"] < horizon] if len(pending) else pending
        rest = pending[pending["ended_s"] >= horizon] if len(pending) else pending
        self._pending = [rest] if len(rest) else []
        frame = (
            due.assign(ended_at=pd.to_datetime(due["ended_s"], unit="s", utc=True))
            if len(due)
            else _EMPTY
        )
        snap = replay(frame, queries, self.book)
        if len(q_now):
            self._last_query = float(q_now.max())
        return snap


_EMPTY = pd.DataFrame(
    {
        "lineage_id": pd.Series([], dtype=object),
        "model_type": pd.Series([], dtype=object),
        "hardware_type": pd.Series([], dtype=object),
        "status": pd.Series([], dtype=object),
        "samples_per_s": pd.Series([], dtype=np.float64),
        "num_devices": pd.Series([], dtype=np.int64),
        "ended_at": pd.Series([], dtype="datetime64[ns, UTC]"),
    }
)
