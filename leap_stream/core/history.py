"""What a lineage measured before: the feature that moves accuracy most.

The same rules run online (the Redis store applies them in a Lua script) and offline (the
trainer and the backtest replay the dataset with `HistoryBook`), so a model is trained on exactly
the history it will see when serving. Keep `apply_measurement` and `apply_aggregate` in step with
`leap_stream/store/online.py`'s script; `tests/` checks that both give the same state.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from leap_stream.contracts.timestamps import epoch_s

HISTORY_EWMA_ALPHA = 0.2
# Completions whose throughput counts as a measurement; failed attempts rarely report a steady state.
MEASURED_STATUSES = frozenset({"succeeded", "preempted"})


@dataclass(frozen=True, slots=True)
class Measurement:
    """Last measured throughput of one lineage on one hardware type."""

    samples_per_s: float  # whole job, all devices
    num_devices: int
    measured_at: float  # epoch seconds (ended_at of the completion)
    count: int  # measurements of this lineage on this type so far


@dataclass(frozen=True, slots=True)
class TypeAggregate:
    """Smoothed per-device throughput of one model type on one hardware type."""

    ewma_log_per_device: float  # EWMA of log(samples_per_s / num_devices)
    count: int
    last_at: float


LineageHistory = dict[str, Measurement]  # hardware_type -> last measurement
TypeAggregates = dict[str, TypeAggregate]  # hardware_type -> aggregate, for one model type


def is_measurement(status: str, samples_per_s: float | None) -> bool:
    return (
        status in MEASURED_STATUSES
        and samples_per_s is not None
        and math.isfinite(samples_per_s)
        and samples_per_s > 0
    )


def apply_measurement(
    previous: Measurement | None, samples_per_s: float, num_devices: int, measured_at: float
) -> Measurement:
    """Keep the newest measurement (by measured_at); out-of-order arrivals only bump the count."""
    if previous is None:
        return Measurement(samples_per_s, num_devices, measured_at, 1)
    if measured_at >= previous.measured_at:
        return Measurement(samples_per_s, num_devices, measured_at, previous.count + 1)
    return Measurement(
        previous.samples_per_s, previous.num_devices, previous.measured_at, previous.count + 1
    )


def apply_aggregate(
    previous: TypeAggregate | None, samples_per_s: float, num_devices: int, measured_at: float
) -> TypeAggregate:
    """EWMA in log space, in arrival order (order-dependent by design: recent data weighs more)."""
    x = math.log(samples_per_s / num_devices)
    if previous is None:
        return TypeAggregate(x, 1, measured_at)
    ewma = previous.ewma_log_per_device + HISTORY_EWMA_ALPHA * (x - previous.ewma_log_per_device)
    return TypeAggregate(ewma, previous.count + 1, max(previous.last_at, measured_at))


class HistoryBook:
    """In-memory history for training and backtests: replay completions in time order."""

    def __init__(self) -> None:
        self._lineages: dict[str, LineageHistory] = {}
        self._aggregates: dict[str, TypeAggregates] = {}

    def apply_completion(self, completion: Mapping[str, Any]) -> bool:
        """Apply one job-completed event (measured at its ``ended_at``) as the online store's
        Lua script does; False when it carries no measurement."""
        return self.apply(
            completion["lineage_id"],
            completion["model_type"],
            completion["hardware_type"],
            completion["status"],
            (completion.get("throughput") or {}).get("samples_per_s"),
            completion["num_devices"],
            epoch_s(completion["ended_at"]),
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
    ) -> bool:
        """Apply one completion; False when it carries no measurement."""
        if not is_measurement(status, samples_per_s):
            return False
        assert samples_per_s is not None
        lin = self._lineages.setdefault(lineage_id, {})
        lin[hardware_type] = apply_measurement(
            lin.get(hardware_type), samples_per_s, num_devices, measured_at
        )
        agg = self._aggregates.setdefault(model_type, {})
        agg[hardware_type] = apply_aggregate(
            agg.get(hardware_type), samples_per_s, num_devices, measured_at
        )
        return True

    def lineage(self, lineage_id: str) -> LineageHistory:
        return dict(self._lineages.get(lineage_id, {}))

    def aggregates(self, model_type: str) -> TypeAggregates:
        return dict(self._aggregates.get(model_type, {}))

    @property
    def lineage_ids(self) -> list[str]:
        return list(self._lineages)

    @property
    def model_types(self) -> list[str]:
        return list(self._aggregates)
