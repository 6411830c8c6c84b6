"""A model type's aggregates in the forms the feature build reads them: a log of changes for
point-in-time look-ups over a replay (`AggregateLog`, `AggregatesAsOf`) and a flat table for
a serving batch (`AggregateTable`). The values are those of `core.history.apply_aggregate`."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from leap_stream.core.history import HistoryBook, TypeAggregate, TypeAggregates

_SortedLog = tuple[np.ndarray, np.ndarray, np.ndarray, int, tuple[np.ndarray, np.ndarray]]


class AggregateLog:
    """The aggregates as a log of changes in replay order, for point-in-time look-ups.

    A training replay asks for a model type's aggregates as of every submission; a snapshot
    dict per change was a year's worth of dicts (and most of the feature build's time). Here a
    row keeps only the log's length when it was submitted (`mark`), and `at` finds, for many
    rows at once, the last change of (its model type, a hardware type) before that mark. The
    log starts from the book's state (`starting_from`), so it need only span a piece of a
    replay."""

    def __init__(self) -> None:
        self._model_types: dict[str, int] = {}
        self._hardware: dict[str, int] = {}
        self._mt: list[int] = []
        self._hw: list[int] = []
        self._ewma: list[float] = []
        self._count: list[int] = []
        self._sorted_cache: tuple[int, Mapping[str, int], _SortedLog] | None = None

    @classmethod
    def starting_from(cls, book: HistoryBook) -> AggregateLog:
        log = cls()
        for model_type in book.model_types:
            for hw, agg in book.aggregates(model_type).items():
                log.record(model_type, hw, agg)
        return log

    def record(self, model_type: str, hardware_type: str, aggregate: TypeAggregate) -> None:
        self._mt.append(self._model_types.setdefault(model_type, len(self._model_types)))
        self._hw.append(self._hardware.setdefault(hardware_type, len(self._hardware)))
        self._ewma.append(aggregate.ewma_log_per_device)
        self._count.append(aggregate.count)

    @classmethod
    def of_codes(
        cls,
        model_types: Sequence[str],
        hardware: Sequence[str],
        model_type: np.ndarray,
        hardware_code: np.ndarray,
        ewma: np.ndarray,
        count: np.ndarray,
    ) -> AggregateLog:
        """A log of entries given as codes into ``model_types`` and ``hardware``."""
        log = cls()
        log._model_types = {m: i for i, m in enumerate(model_types)}
        log._hardware = {h: i for i, h in enumerate(hardware)}
        log._mt = np.asarray(model_type, np.int64).tolist()
        log._hw = np.asarray(hardware_code, np.int64).tolist()
        log._ewma = np.asarray(ewma, np.float64).tolist()
        log._count = np.asarray(count, np.int64).tolist()
        return log

    def mark(self) -> int:
        return len(self._mt)

    def model_type_codes(self, model_types: Sequence[str]) -> np.ndarray:
        """-1 for a model type the log has never seen."""
        return np.fromiter(
            (self._model_types.get(m, -1) for m in model_types), np.int64, count=len(model_types)
        )

    def at(
        self,
        model_type: np.ndarray,
        hardware: np.ndarray,
        marks: np.ndarray,
        hardware_codes: Mapping[str, int],
    ) -> tuple[np.ndarray, np.ndarray]:
        """(EWMA, count) per row of (model type code, hardware code, mark); NaN where that
        pair had no aggregate before the mark. ``hardware_codes`` numbers hardware names as
        ``hardware`` does (the catalog's codes)."""
        n = len(model_type)
        ewma, count = np.full(n, np.nan), np.full(n, np.nan)
        if not self._mt or n == 0:
            return ewma, count
        key, order, sorted_full, span, values = self._sorted(hardware_codes)
        size = len(self._mt) + 1
        want = np.asarray(model_type, np.int64) * span + np.asarray(hardware, np.int64) + 1
        valid = (np.asarray(model_type) >= 0) & (np.asarray(hardware) >= 0)
        pos = np.searchsorted(sorted_full, want * size + np.asarray(marks, np.int64)) - 1
        posc = np.clip(pos, 0, len(order) - 1)
        hit = valid & (pos >= 0) & (key[order[posc]] == want)
        src = order[posc[hit]]
        ewma[hit] = values[0][src]
        count[hit] = values[1][src]
        return ewma, count

    def _sorted(self, hardware_codes: Mapping[str, int]) -> _SortedLog:
        """(key per change, the changes' order by key then position, the sorted keys with
        positions, the key's hardware span, the changes' EWMA and count as arrays), kept while
        the log and the codes stay the same: the feature build asks twice per piece (the
        candidate's type and the prior's)."""
        cached = self._sorted_cache
        if cached is not None and cached[0] == len(self._mt) and cached[1] is hardware_codes:
            return cached[2]
        names = list(self._hardware)
        to_code = np.asarray([hardware_codes.get(h, -1) for h in names], np.int64)
        span = int(max(hardware_codes.values(), default=0)) + 3  # codes -1 … max + 1
        size = len(self._mt) + 1
        key = np.asarray(self._mt, np.int64) * span + to_code[np.asarray(self._hw, np.int64)] + 1
        full = key * size + np.arange(len(key))  # unique: the key, then the log's position
        order = np.argsort(full, kind="stable")
        values = (np.asarray(self._ewma, np.float64), np.asarray(self._count, np.float64))
        got = (key, order, full[order], span, values)
        self._sorted_cache = (len(self._mt), hardware_codes, got)
        return got


@dataclass(frozen=True)
class AggregatesAsOf:
    """Per job, its model type's aggregates as of its submission: its model type's code in
    ``log`` and the log's `mark` then (what `features.build_columns` takes in place of one
    aggregates dict per job)."""

    log: AggregateLog
    model_type: np.ndarray
    marks: np.ndarray

    def __len__(self) -> int:
        return len(self.marks)


class AggregateTable(Mapping[str, TypeAggregates]):
    """Several model types' aggregates as flat entries, what the online store reads for a batch.

    A batch of 500 submissions reads some 250 model types' aggregates, 2,500 entries: one
    object per entry, flattened back into arrays by the feature build, was a tenth of the
    ranking's CPU. Read as a mapping it gives the usual dicts (built on demand); the ranker
    takes `as_of` instead."""

    def __init__(
        self,
        model_types: Sequence[str],
        hardware: Sequence[str],
        model_type: np.ndarray,
        hardware_code: np.ndarray,
        values: np.ndarray,
    ) -> None:
        """``values``: one row per entry, (EWMA of log per-device samples/s, count, last_at);
        ``model_type`` / ``hardware_code``: the entry's index in ``model_types`` / ``hardware``."""
        self._model_types = list(model_types)
        self._index = {m: i for i, m in enumerate(self._model_types)}
        self._hardware = list(hardware)
        self._owner = np.asarray(model_type, np.int64)
        self._hw = np.asarray(hardware_code, np.int64)
        self._values = np.asarray(values, np.float64).reshape(-1, 3)

    @classmethod
    def of(cls, aggregates: Mapping[str, TypeAggregates]) -> AggregateTable:
        """The table of aggregates given as dicts."""
        hardware: dict[str, int] = {}
        owner, codes, values = [], [], []
        for i, per_type in enumerate(aggregates.values()):
            for hw, agg in per_type.items():
                owner.append(i)
                codes.append(hardware.setdefault(hw, len(hardware)))
                values.append((agg.ewma_log_per_device, agg.count, agg.last_at))
        return cls(
            list(aggregates),
            list(hardware),
            np.asarray(owner, np.int64),
            np.asarray(codes, np.int64),
            np.asarray(values, np.float64).reshape(-1, 3),
        )

    def __getitem__(self, model_type: str) -> TypeAggregates:
        i = self._index[model_type]
        rows = np.flatnonzero(self._owner == i).tolist()
        return {
            self._hardware[int(self._hw[r])]: TypeAggregate(
                float(self._values[r, 0]), int(self._values[r, 1]), float(self._values[r, 2])
            )
            for r in rows
        }

    def __iter__(self) -> Iterator[str]:
        return iter(self._model_types)

    def __len__(self) -> int:
        return len(self._model_types)

    def as_of(self, model_types: Sequence[str]) -> AggregatesAsOf:
        """Per job (its model type), every entry of its model type: `features.build_columns`
        reads them through the vectorised look-up of `AggregateLog.at`."""
        log = AggregateLog.of_codes(
            self._model_types,
            self._hardware,
            self._owner,
            self._hw,
            self._values[:, 0],
            self._values[:, 1],
        )
        marks = np.full(len(model_types), log.mark(), np.int64)
        return AggregatesAsOf(log, log.model_type_codes(model_types), marks)
