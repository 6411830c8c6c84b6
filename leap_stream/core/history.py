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
step with `leap_stream/store/lua/apply.lua`; `tests/` checks that both give the same state.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Literal

from leap_stream.contracts.timestamps import epoch_s

HISTORY_EWMA_ALPHA = 0.2
# Completions whose throughput counts as a measurement; failed attempts rarely report a steady state.
MEASURED_STATUSES = frozenset({"succeeded", "preempted"})

# What became of a measurement: taken into the history, taken together with the quarantined one
# it corroborates, or quarantined (by the rule that caught it, see `judge`).
Verdict = Literal["accepted", "corroborated", "devices", "lineage", "aggregate", "physics", "speed"]
QUARANTINE_RULES: tuple[Verdict, ...] = ("devices", "lineage", "aggregate", "physics", "speed")


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

    Speed: within one ``speed_period_s`` (a day) a lineage's prior may move at most
    ``speed_factor`` from where it stood when the period began, and a model type's aggregate at
    most ``aggregate_speed_factor``, whatever the sequence of measurements: a walk of values each
    within the lineage factor, or many new lineages agreeing, moves them that far a day and no
    further. An honest release (×1.25) passes; a real change larger than the bound is what
    corroboration is for. A corroboration counts only when it is independent: another job
    than the pending value's, at least ``corroboration_gap_s`` later, and at most one
    corroborated change per period (`independent`), of at most ``corroborated_factor`` from
    the reference. So a prior moves at most ×``corroborated_factor`` × ``speed_factor`` a day.
    The simulator's honest corroborated changes (44 days, seed 0) were ×3.1 at the median and
    ×13.3 at most; a ×1000 unit error agreed on by two jobs stays held.
    """

    recent: int = 5
    lineage_factor: float = 3.0
    aggregate_factor: float = 100.0
    aggregate_min_count: int = 5
    physics_factor: float = 100.0
    speed_factor: float = 2.0
    aggregate_speed_factor: float = 8.0
    corroborated_factor: float = 20.0
    speed_period_s: float = 86_400.0
    corroboration_gap_s: float = 3_600.0

    def __post_init__(self) -> None:
        factors = (
            self.lineage_factor,
            self.aggregate_factor,
            self.physics_factor,
            self.speed_factor,
            self.aggregate_speed_factor,
            self.corroborated_factor,
        )
        times = (self.speed_period_s, self.corroboration_gap_s)
        if self.recent < 1 or min(factors) <= 1 or min(times) < 0:
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

    @property
    def speed_limit(self) -> float:
        return math.log(self.speed_factor)

    @property
    def aggregate_speed_limit(self) -> float:
        return math.log(self.aggregate_speed_factor)

    @property
    def corroborated_limit(self) -> float:
        return math.log(self.corroborated_factor)


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


def window_median(recent: Sequence[Timed]) -> float:
    """The median of a window's values: the prior, in log per-device samples/s."""
    return median([x for _at, x in recent])


def window_with(recent: Sequence[Timed], this: Timed, rules: HistoryRules) -> tuple[Timed, ...]:
    """The window once ``this`` is added: the newest ``rules.recent`` by measured_at (ties by
    value), so the same set of accepted values gives the same window."""
    return tuple(sorted((*recent, this)))[-rules.recent :]


def prior_samples_per_s(recent: Sequence[Timed], num_devices: int) -> float:
    return math.exp(window_median(recent)) * num_devices


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


NEVER = -1e18  # a time long before any (the Lua script writes the same)


@dataclass(frozen=True, slots=True)
class Guard:
    """What the speed rule keeps for one (lineage, type), or one (model type, type), beside
    the prior: where it stood when the current period began and when that was, when a
    corroborated change last moved it, and where the pending value came from. Times are event
    times (`event_time`); `NEVER` is long before any."""

    reference: float | None  # log per-device value at `since`; None: nothing to hold to yet
    since: float = 0.0
    jumped_at: float = NEVER
    pending_t: float = NEVER
    pending_job: int = 0  # `job_key` of the pending value's job; 0: unknown


def event_time(ended_at: float, now: float = math.inf) -> float:
    """The time the speed rule counts in: the measurement's end, never later than the reader's
    clock. A producer cannot date a value ahead to open a new period, and a value dated back
    opens none (a period ends only at a later time)."""
    return min(ended_at, now)


def job_key(job_id: str) -> int:
    """A job's number for telling corroborating measurements apart (never 0)."""
    return zlib.crc32(job_id.encode()) + 1


def refreshed(
    guard: Guard | None, previous: Measurement | None, t: float, rules: HistoryRules
) -> Guard | None:
    """The guard a measurement at ``t`` is judged by: a new period starts from the prior as it
    stands once the last one is ``speed_period_s`` old (or where none was kept yet)."""
    if previous is None or not previous.recent:
        return guard
    prior = window_median(previous.recent)
    if guard is None:
        return Guard(prior, t)
    if guard.reference is None or t - guard.since >= rules.speed_period_s:
        return replace(guard, reference=prior, since=t)
    return guard


def independent(guard: Guard | None, t: float, job: int, rules: HistoryRules) -> bool:
    """Whether a value at ``t`` from job ``job`` may corroborate the pending one: another
    (known) job, at least the gap later, and no corroborated change in this period yet."""
    return (
        guard is not None
        and job != 0
        and guard.pending_job not in (0, job)
        and t - guard.pending_t >= rules.corroboration_gap_s
        and t - guard.jumped_at >= rules.speed_period_s
    )


def guard_after(
    guard: Guard | None, verdict: Verdict, entry: Measurement, t: float, job: int
) -> Guard | None:
    """The guard once a measurement got ``verdict`` and the entry became ``entry``."""
    if verdict in QUARANTINE_RULES:
        return replace(guard or Guard(None, t), pending_t=t, pending_job=job)
    prior = window_median(entry.recent)
    if verdict == "corroborated":
        return Guard(prior, t, jumped_at=t)
    if guard is None or guard.reference is None:
        return Guard(prior, t, NEVER if guard is None else guard.jumped_at)
    return guard


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


def slice_of(num_devices: int, submitted_devices: int) -> bool:
    """Whether a probe on ``num_devices`` is a slice of a job asked for ``submitted_devices``
    (`core.probe.slice_shape`: a whole number of its replicas divides it). A probe may run
    such a slice; the `devices` rule holds any other count."""
    return 0 < num_devices <= submitted_devices and submitted_devices % num_devices == 0


def judge(
    previous: Measurement | None,
    aggregate: TypeAggregate | None,
    x: float,
    num_devices: int,
    submitted_devices: int | None = None,
    rules: HistoryRules = DEFAULT_RULES,
    ceiling: float | None = None,
    guard: Guard | None = None,
    measured_at: float = 0.0,
    t: float = 0.0,
    job: int = 0,
) -> Verdict:
    """Whether log per-device throughput ``x`` measured on ``num_devices`` at ``measured_at``
    may enter the history (the Lua script's rule). Checked in order, the first that knows the
    value decides:

    - ``devices``: the job was submitted for another device count (``submitted_devices``, when
      known): a completion that says 1 device for a job on 8 reads 8× too fast per device;
    - ``lineage``: off its lineage's recent median on the type, at the same device count (per-
      device throughput moves with the count, so another count is judged as below);
    - ``aggregate``: off the model type's aggregate on the type, once that is established;
    - ``physics``: faster than the physics ``ceiling`` (`features.log_rate_ceiling`) allows,
      checked on every measurement the rules above let through: a lineage walked up in steps
      each within its limit, or a type's aggregate moved, still cannot pass what the
      hardware can do;
    - ``speed``: the prior, with this value in its window, would stand further than the speed
      factor from the ``guard``'s reference (`refreshed` for time ``t``).

    A suspicious value within the lineage factor of the pending one is ``corroborated`` when
    it is `independent` of it (job ``job`` at ``t``), unless it is past the physics ceiling
    (nothing corroborates the impossible) or the two would move the prior further than the
    corroborated factor from the reference (then ``speed``).
    """
    rule: Verdict | None = None
    if submitted_devices is not None and num_devices != submitted_devices:
        rule = "devices"
    elif previous is not None and previous.recent and num_devices == previous.num_devices:
        ref = window_median(previous.recent)
        rule = "lineage" if abs(x - ref) > rules.lineage_limit else None
    elif aggregate is not None and aggregate.count >= rules.aggregate_min_count:
        off = abs(x - aggregate.ewma_log_per_device)
        rule = "aggregate" if off > rules.aggregate_limit else None
    impossible = (
        ceiling is not None and math.isfinite(ceiling) and x - ceiling > rules.physics_limit
    )
    if rule is None and impossible:
        rule = "physics"
    if rule is None and _too_fast(previous, guard, x, measured_at, rules):
        rule = "speed"
    if rule is None:
        return "accepted"
    pending = None if previous is None else previous.pending
    if (
        not impossible
        and pending is not None
        and abs(x - pending[1]) <= rules.lineage_limit
        and independent(guard, t, job, rules)
    ):
        return "speed" if _jump_too_far(guard, pending[1], x, rules) else "corroborated"
    return rule


def _jump_too_far(guard: Guard | None, pending: float, x: float, rules: HistoryRules) -> bool:
    if guard is None or guard.reference is None:
        return False
    return abs(median([pending, x]) - guard.reference) > rules.corroborated_limit


def _too_fast(
    previous: Measurement | None,
    guard: Guard | None,
    x: float,
    measured_at: float,
    rules: HistoryRules,
) -> bool:
    if previous is None or not previous.recent or guard is None or guard.reference is None:
        return False
    window = window_with(previous.recent, (measured_at, x), rules)
    return abs(window_median(window) - guard.reference) > rules.speed_limit


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
    recent = window_with(previous.recent, this, rules)
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


def aggregate_step(
    previous: TypeAggregate | None,
    guard: Guard | None,
    x: float,
    measured_at: float,
    t: float,
    rules: HistoryRules = DEFAULT_RULES,
) -> tuple[TypeAggregate, Guard, bool]:
    """`apply_aggregate` within the speed bound: (the aggregate, its guard, whether the bound
    held it back). An established aggregate stays within ``aggregate_speed_factor`` of where
    it stood when the period began; one still forming follows its values."""
    agg = apply_aggregate(previous, x, measured_at)
    if previous is None:
        return agg, Guard(agg.ewma_log_per_device, t), False
    forming = previous.count < rules.aggregate_min_count
    if (
        guard is None
        or guard.reference is None
        or forming
        or t - guard.since >= rules.speed_period_s
    ):
        guard = Guard(previous.ewma_log_per_device, t)
    if forming:
        return agg, guard, False
    assert guard.reference is not None
    low = guard.reference - rules.aggregate_speed_limit
    high = guard.reference + rules.aggregate_speed_limit
    held = min(max(agg.ewma_log_per_device, low), high)
    if held == agg.ewma_log_per_device:
        return agg, guard, False
    return replace(agg, ewma_log_per_device=held), guard, True


# "none": the completion carries no measurement; "repeat": its job attempt completed before
Outcome = Verdict | Literal["none", "repeat"]


class HistoryBook:
    """In-memory history for training and backtests: replay completions in time order."""

    def __init__(self, rules: HistoryRules = DEFAULT_RULES) -> None:
        self.rules = rules
        self._lineages: dict[str, dict[str, Measurement]] = {}
        self._aggregates: dict[str, TypeAggregates] = {}
        self._guards: dict[tuple[str, str], Guard] = {}  # (lineage, type): the speed rule's
        self._aggregate_guards: dict[tuple[str, str], Guard] = {}  # (model type, type)
        self.aggregate_held = 0  # measurements the aggregate speed bound held back
        # lineages where a measurement was not simply accepted (quarantined or corroborated):
        # their state depends on the order the measurements came in
        self.disputed: set[str] = set()
        self.disputed_types: set[str] = set()  # their model types (the aggregates move too)
        # the event taken for each (job_id, attempt, probed type or ""): an attempt completes
        # once, and each of its probes once
        self._completed: dict[tuple[str, int, str], str] = {}

    def apply_completion(
        self,
        completion: Mapping[str, Any],
        submitted_devices: int | None = None,
        ceiling: float | None = None,
        now: float = math.inf,
    ) -> Outcome:
        """Apply one job-completed event (measured at its ``ended_at``) as the online store's
        Lua script does (``submitted_devices``, ``ceiling`` and ``now`` as in `apply`): a
        second completion of one job attempt (another event) is a ``repeat`` and changes
        nothing; a probe (``probe``) completes once per probed type, apart from the attempt."""
        probe = str(completion["hardware_type"]) if completion.get("probe") else ""
        attempt = (str(completion["job_id"]), int(completion["attempt"]), probe)
        taken = self._completed.setdefault(attempt, str(completion["event_id"]))
        if taken != completion["event_id"]:
            return "repeat"
        nd = int(completion["num_devices"])
        if probe and submitted_devices and slice_of(nd, submitted_devices):
            submitted_devices = nd
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
            job_key(str(completion["job_id"])),
            now,
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
        job: int = 0,
        now: float = math.inf,
    ) -> Outcome:
        """Apply one completion; what became of its measurement. ``submitted_devices``: the
        count its submission asked for (the online store reads it from the stored submission,
        the replay from the row's data × tensor × pipeline parallel); ``job``: its job's
        `job_key` (0: unknown, which never corroborates); ``now``: the reader's clock (a
        replay of accepted rows has none: their ``ended_at`` is the time)."""
        if not is_measurement(status, samples_per_s) or num_devices <= 0:
            return "none"
        assert samples_per_s is not None
        x = log_per_device(samples_per_s, num_devices)
        lin = self._lineages.setdefault(lineage_id, {})
        agg = self._aggregates.setdefault(model_type, {})
        previous = lin.get(hardware_type)
        t = event_time(measured_at, now)
        key = (lineage_id, hardware_type)
        guard = refreshed(self._guards.get(key), previous, t, self.rules)
        verdict = judge(
            previous,
            agg.get(hardware_type),
            x,
            num_devices,
            submitted_devices,
            self.rules,
            ceiling,
            guard,
            measured_at,
            t,
            job,
        )
        entry = apply_measurement(previous, x, num_devices, measured_at, verdict, self.rules)
        lin[hardware_type] = entry
        after = guard_after(guard, verdict, entry, t, job)
        if after is not None:
            self._guards[key] = after
        if verdict not in QUARANTINE_RULES:
            akey = (model_type, hardware_type)
            agg[hardware_type], self._aggregate_guards[akey], held = aggregate_step(
                agg.get(hardware_type),
                self._aggregate_guards.get(akey),
                x,
                measured_at,
                t,
                self.rules,
            )
            self.aggregate_held += held
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
