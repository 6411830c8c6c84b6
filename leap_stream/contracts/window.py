"""Time bounds: an event's timestamps must be plausible against the reader's clock (pure).

The schemas accept any RFC 3339 time, and a producer's clock can be wrong or hostile: a
completion dated next year would stay a lineage's "newest" measurement for a year, a submission
from 1977 would put decades into the latency histogram, and a year outside pandas' range
(1677–2262) cannot become a dataset row. `TimeWindow.check` rejects such events up front as the
dead-letter kind ``time_out_of_bounds``, so history, dataset, trainer and metrics never see them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from leap_stream.contracts.codec import DecodeError
from leap_stream.contracts.timestamps import format_ts, parse_ts

# Always enforced, whatever the window: the range every store of the project can hold.
EARLIEST_S = 0.0  # 1970-01-01
LATEST_S = 7_258_118_400.0  # 2200-01-01

# Per schema: (field, bounded by the window's age too). A completion's started_at may be older
# than the window (long jobs); its ended_at may not.
_FIELDS: dict[str, tuple[tuple[str, bool], ...]] = {
    "job-submitted": (("submitted_at", True),),
    "job-completed": (("started_at", False), ("ended_at", True)),
}


@dataclass(frozen=True, slots=True)
class TimeWindow:
    """Accepted event times: no older than ``max_age_s`` and no later than ``max_lead_s`` past
    the reader's clock (0 switches that bound off; the fixed range above always applies)."""

    max_age_s: float = 30 * 86_400.0
    max_lead_s: float = 3_600.0

    def check(self, event: Mapping[str, Any], schema: str, now: float) -> DecodeError | None:
        """The first timestamp of ``event`` outside the window, as a dead-letter error."""
        for name, aged in _FIELDS.get(schema, ()):
            t = parse_ts(event[name])
            low = EARLIEST_S
            if aged and self.max_age_s > 0:
                low = max(low, now - self.max_age_s)
            high = LATEST_S if self.max_lead_s <= 0 else min(LATEST_S, now + self.max_lead_s)
            if not low <= t <= high:
                return DecodeError(
                    "time_out_of_bounds",
                    f"{name} {event[name]} is outside the accepted window "
                    f"[{format_ts(low)}, {format_ts(high)}] of the reader's clock",
                    f"data.{name}",
                    schema,
                )
        return None


__all__ = ["EARLIEST_S", "LATEST_S", "TimeWindow"]
