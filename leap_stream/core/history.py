"""What a lineage measured before: the feature that moves accuracy most, and the rules that
decide which telemetry may become it.

A completion is a claim made by a telemetry producer. Each (lineage, hardware type) keeps its
last few accepted per-device measurements; the prior is their median, so one noisy run moves
it little and one wrong one not at all. "Last" is by ``ended_at``, not arrival, so honest
telemetry gives the same priors in whatever order it arrives (a completion that waited for its
submission is applied late). A measurement far from that lineage's own recent values,
or (for a lineage new to the type) from the model type's aggregate, is quarantined: kept out of
the prior and the aggregate, flagged in the dataset, counted by rule. It is accepted once a
later measurement corroborates it (the lineage really changed: a new code version, another
interconnect), and the window restarts from the two.

The same rules run online (the Redis store applies them in a Lua script) and offline (the
trainer and the backtest replay the dataset with `HistoryBook`), so a model is trained on exactly
the history it will see when serving. Keep `judge`, `apply_measurement` and `apply_aggregate` in
step with `leap_stream/store/online.py`'s script; `tests/` checks that both give the same state.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from leap_stream.contracts.timestamps import epoch_s

HISTORY_EWMA_ALPHA = 0.2
# Completions whose throughput counts as a measurement; failed attempts rarely report a steady state.
MEASURED_STATUSES = frozenset({"succeeded", "preempted"})

# What became of a measurement: taken into the history, taken together with the quarantined one
# it corroborates, or quarantined (by the rule that caught it, see `judge`).
Verdict = Literal["accepted", "corroborated", "devices", "lineage", "aggregate", "physics"]
QUARANTINE_RULES: tuple[Verdict, ...] = ("devices", "lineage", "aggregate", "physics")


@dataclass(frozen=True, slots=True)
class HistoryRules:
    """How many measurements the prior keeps and how far a new one may stray (docs/model.md).

    The factors bound |log(new / reference)|. A lineage repeats itself within a few per cent on
    one type (a ×3 jump is a wrong device count, unit or software regression); lineages of one
    model type differ more (batch sizes, parallelism), hence the wider aggregate factor, which
    only applies once the aggregate has ``aggregate_min_count`` measurements. On four simulated
    days (1,302 measurements judged by an aggregate) the honest ones were at most ×27 from it
    (99th percentile ×13): ×100 leaves a margin, and a ×1000 or ×1e-6 error is far beyond.
    The physics reference judges what nothing else knows yet: a value more than
    ``physics_factor`` above the device's full matrix peak for the job's FLOPs per sample. The
    FLOPs estimate is rough (honest simulated jobs reached up to ×50 of it), so only an
    impossible speed is caught there, such as a ×1000 unit error.
    """

    recent: int = 5
    lineage_factor: float = 3.0
    aggregate_factor: float = 100.0
    aggregate_min_count: int = 5
    physics_factor: float = 100.0

    def __post_init__(self) -> None:
        factors = (self.lineage_factor, self.aggregate_factor, self.physics_factor)
        if self.recent < 1 or min(factors) <= 1:
            raise ValueError(f"invalid history rules {self}")

    @property
    def lineage_limit(self) -> float:
        return math.log(self.lineage_factor)

    @property
    def aggregate_limit(self) -> float:
        return math.log(self.aggregate_factor)

    @property
    def physics_limit(self) -> float:
        return math.log(self.physics_factor)


DEFAULT_RULES = HistoryRules()


def median(values: Sequence[float]) -> float:
    """The median as the Lua script computes it: sorted, the middle value or the mean of two."""
    s = sorted(values)
    n = len(s)
    mid = n // 2
    return s[mid] if n % 2 else (s[mid - 1] + s[mid]) / 2


Timed = tuple[float, float]  # (measured_at, log per-device throughput)


@dataclass(frozen=True, slots=True)
class Measurement:
    """What one lineage measured on one hardware type: the prior and the values behind it."""

    samples_per_s: float  # the prior, whole job: exp(median of recent) × num_devices
    num_devices: int  # of the newest accepted measurement
    measured_at: float  # epoch seconds, newest accepted ended_at
    count: int  # accepted measurements of this lineage on this type so far
    recent: tuple[Timed, ...] = ()  # the newest accepted (by measured_at), oldest first
    pending: Timed | None = None  # quarantined, awaiting corroboration (no prior while alone)


def prior_samples_per_s(recent: Sequence[Timed], num_devices: int) -> float:
    return math.exp(median([x for _at, x in recent])) * num_devices


def measurement(
    recent: tuple[Timed, ...],
    num_devices: int,
    measured_at: float,
    count: int,
    pending: Timed | None,
) -> Measurement:
    """A measurement entry with its prior computed from ``recent`` (online and offline alike)."""
    sps = prior_samples_per_s(recent, num_devices) if recent else 0.0
    return Measurement(sps, num_devices, measured_at, count, recent, pending)


@dataclass(frozen=True, slots=True)
class TypeAggregate:
    """Smoothed per-device throughput of one model type on one hardware type."""

    ewma_log_per_device: float  # EWMA of log(samples_per_s / num_devices)
    count: int
    last_at: float


LineageHistory = dict[str, Measurement]  # hardware_type -> measurement (with a prior)
TypeAggregates = dict[str, TypeAggregate]  # hardware_type -> aggregate, for one model type


def is_measurement(status: str, samples_per_s: float | None) -> bool:
    return (
        status in MEASURED_STATUSES
        and samples_per_s is not None
        and math.isfinite(samples_per_s)
        and samples_per_s > 0
    )


def log_per_device(samples_per_s: float, num_devices: int) -> float:
    """The value the rules compare, computed in Python for both sides (one libm)."""
    return math.log(samples_per_s / num_devices)


def judge(
    previous: Measurement | None,
    aggregate: TypeAggregate | None,
    x: float,
    num_devices: int,
    submitted_devices: int | None = None,
    rules: HistoryRules = DEFAULT_RULES,
    ceiling: float | None = None,
) -> Verdict:
    """Whether log per-device throughput ``x`` measured on ``num_devices`` may enter the history
    (the Lua script's rule). Checked in order, the first that knows the value decides:

    - ``devices``: the job was submitted for another device count (``submitted_devices``, when
      known): a completion that says 1 device for a job on 8 reads 8× too fast per device;
    - ``lineage``: off its lineage's recent median on the type, at the same device count (per-
      device throughput moves with the count, so another count is judged as below);
    - ``aggregate``: off the model type's aggregate on the type, once that is established;
    - ``physics``: faster than the physics ``ceiling`` (`features.log_rate_ceiling`) allows,
      checked on every measurement the rules above let through: a lineage walked up in steps
      each within its limit, or a type's aggregate moved, still cannot pass what the
      hardware can do.

    A suspicious value within the lineage factor of the pending one is ``corroborated``,
    unless it is past the physics ceiling: nothing corroborates the impossible.
    """
    rule: Verdict | None = None
    if submitted_devices is not None and num_devices != submitted_devices:
        rule = "devices"
    elif previous is not None and previous.recent and num_devices == previous.num_devices:
        ref = median([v for _at, v in previous.recent])
        rule = "lineage" if abs(x - ref) > rules.lineage_limit else None
    elif aggregate is not None and aggregate.count >= rules.aggregate_min_count:
        off = abs(x - aggregate.ewma_log_per_device)
        rule = "aggregate" if off > rules.aggregate_limit else None
    impossible = (
        ceiling is not None and math.isfinite(ceiling) and x - ceiling > rules.physics_limit
    )
    if rule is None and impossible:
        rule = "physics"
    if rule is None:
        return "accepted"
    pending = None if previous is None else previous.pending
    if not impossible and pending is not None and abs(x - pending[1]) <= rules.lineage_limit:
        return "corroborated"
    return rule


def apply_measurement(
    previous: Measurement | None,
    x: float,
    num_devices: int,
    measured_at: float,
    verdict: Verdict,
    rules: HistoryRules = DEFAULT_RULES,
) -> Measurement:
    """The entry after a measurement judged ``verdict``. The window keeps the newest by
    measured_at (ties by value): the same set of accepted values gives the same entry."""
    this = (measured_at, x)
    if verdict in QUARANTINE_RULES:
        if previous is None:
            return measurement((), num_devices, measured_at, 0, this)
        return measurement(
            previous.recent, previous.num_devices, previous.measured_at, previous.count, this
        )
    if verdict == "corroborated":
        assert previous is not None and previous.pending is not None
        pair = tuple(sorted((previous.pending, this)))
        return measurement(pair, num_devices, pair[-1][0], previous.count + 2, None)
    if previous is None or not previous.recent:
        count = 0 if previous is None else previous.count
        return measurement((this,), num_devices, measured_at, count + 1, None)
    recent = tuple(sorted((*previous.recent, this)))[-rules.recent :]
    if measured_at < previous.measured_at:  # a late arrival: the newest keeps its device count
        nd, at = previous.num_devices, previous.measured_at
        return measurement(recent, nd, at, previous.count + 1, None)
    return measurement(recent, num_devices, measured_at, previous.count + 1, None)


def apply_aggregate(previous: TypeAggregate | None, x: float, measured_at: float) -> TypeAggregate:
    """EWMA in log space, in arrival order (order-dependent by design: recent data weighs more)."""
    if previous is None:
        return TypeAggregate(x, 1, measured_at)
    ewma = previous.ewma_log_per_device + HISTORY_EWMA_ALPHA * (x - previous.ewma_log_per_device)
    return TypeAggregate(ewma, previous.count + 1, max(previous.last_at, measured_at))


# "none": the completion carries no measurement; "repeat": its job attempt completed before
Outcome = Verdict | Literal["none", "repeat"]


class HistoryBook:
    """In-memory history for training and backtests: replay completions in time order."""

    def __init__(self, rules: HistoryRules = DEFAULT_RULES) -> None:
        self.rules = rules
        self._lineages: dict[str, dict[str, Measurement]] = {}
        self._aggregates: dict[str, TypeAggregates] = {}
        # lineages where a measurement was not simply accepted (quarantined or corroborated):
        # their state depends on the order the measurements came in
        self.disputed: set[str] = set()
        self.disputed_types: set[str] = set()  # their model types (the aggregates move too)
        # the event taken for each (job_id, attempt): an attempt completes once
        self._completed: dict[tuple[str, int], str] = {}

    def apply_completion(
        self,
        completion: Mapping[str, Any],
        submitted_devices: int | None = None,
        ceiling: float | None = None,
    ) -> Outcome:
        """Apply one job-completed event (measured at its ``ended_at``) as the online store's
        Lua script does (``submitted_devices`` and ``ceiling`` as in `apply`): a second
        completion of one job attempt (another event) is a ``repeat`` and changes nothing."""
        attempt = (str(completion["job_id"]), int(completion["attempt"]))
        taken = self._completed.setdefault(attempt, str(completion["event_id"]))
        if taken != completion["event_id"]:
            return "repeat"
        return self.apply(
            completion["lineage_id"],
            completion["model_type"],
            completion["hardware_type"],
            completion["status"],
            (completion.get("throughput") or {}).get("samples_per_s"),
            completion["num_devices"],
            epoch_s(completion["ended_at"]),
            submitted_devices,
            ceiling,
        )

    def apply(
        self,
        lineage_id: str,
        model_type: str,
        hardware_type: str,
        status: str,
        samples_per_s: float | None,
        num_devices: int,
        measured_at: float,
        submitted_devices: int | None = None,
        ceiling: float | None = None,
    ) -> Outcome:
        """Apply one completion; what became of its measurement. ``submitted_devices``: the
        count its submission asked for (the online store reads it from the stored submission,
        the replay from the row's data × tensor × pipeline parallel)."""
        if not is_measurement(status, samples_per_s) or num_devices <= 0:
            return "none"
        assert samples_per_s is not None
        x = log_per_device(samples_per_s, num_devices)
        lin = self._lineages.setdefault(lineage_id, {})
        agg = self._aggregates.setdefault(model_type, {})
        previous = lin.get(hardware_type)
        verdict = judge(
            previous,
            agg.get(hardware_type),
            x,
            num_devices,
            submitted_devices,
            self.rules,
            ceiling,
        )
        lin[hardware_type] = apply_measurement(
            previous, x, num_devices, measured_at, verdict, self.rules
        )
        if verdict not in QUARANTINE_RULES:
            agg[hardware_type] = apply_aggregate(agg.get(hardware_type), x, measured_at)
        if verdict != "accepted":
            self.disputed.add(lineage_id)
            self.disputed_types.add(model_type)
        return verdict

    def lineage(self, lineage_id: str) -> LineageHistory:
        """The types this lineage has a prior on (quarantine-only entries are not history)."""
        return {t: m for t, m in self._lineages.get(lineage_id, {}).items() if m.recent}

    def entries(self, lineage_id: str) -> dict[str, Measurement]:
        """Every entry, quarantine-only ones included (what the online store holds)."""
        return dict(self._lineages.get(lineage_id, {}))

    def aggregates(self, model_type: str) -> TypeAggregates:
        return dict(self._aggregates.get(model_type, {}))

    def aggregate(self, model_type: str, hardware_type: str) -> TypeAggregate | None:
        return self._aggregates.get(model_type, {}).get(hardware_type)

    @property
    def lineage_ids(self) -> list[str]:
        return list(self._lineages)

    @property
    def model_types(self) -> list[str]:
        return list(self._aggregates)


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
            for hw, agg in book._aggregates[model_type].items():
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
