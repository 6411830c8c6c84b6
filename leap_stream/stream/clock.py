"""The worker's time against the broker's: a host clock running behind is caught and corrected.

Every record the worker reads carries a Kafka timestamp: the broker's append time on a topic
with ``message.timestamp.type=LogAppendTime``, else the producer client's create time. A record
cannot be read before it was written, so ``host − record time`` is at least the host's offset
from that clock (it adds the record's wait in the topic). `BrokerClock` keeps, per batch, the
smallest such gap over a recent horizon: the host's skew. Where it is negative by more than a
tolerance the host is behind for certain (no wait makes a gap negative), and the worker judges
events on the host's time plus the skew: the time window (`contracts.window`) and the rankings'
timestamps follow the broker, not a clock that would reject every current event as from the
future. A positive gap is the host ahead or records waiting in the topic, which a record alone
cannot tell apart; a batch read *caught up* (its partitions' ends within a batch of it, so its
records waited no longer than the read takes) can: where the smallest gap of such batches over
the horizon is above the tolerance, the host is ahead by it, and that is corrected too (else a
host two hours ahead reports every ranking two hours late). A consumer lagging the whole
horizon reads no caught-up batch and corrects nothing.

Create times come from many producers: a batch's gap is taken at its median record, so a few
producers with wrong or hostile clocks do not move it. `host()` reads the host's clock; the
rest takes the caller's host time. Each horizon's minimum is kept as a sliding-window minimum
(`WindowMin`), so a batch costs the same whether the horizon holds ten batches or a million.
"""

from __future__ import annotations

import statistics
import threading
import time
from collections import deque
from collections.abc import Sequence
from datetime import UTC, datetime

from leap_stream.stream.batch import Record

TOLERANCE_S = 60.0  # skew below which the host's own time stands
HORIZON_S = 600.0  # how far back a batch's gap still counts


class WindowMin:
    """The smallest value pushed over the last `horizon_s` (by the pushes' own times): a deque
    of the values that can still become the minimum, in increasing order, so a push and a read
    cost O(1) amortised. The push times are taken not to decrease: after a host clock jumps
    back, a value pushed then displaces larger ones pushed before it, and they are forgotten
    even where it expires first."""

    def __init__(self, horizon_s: float) -> None:
        self.horizon_s = horizon_s
        self._candidates: deque[tuple[float, float]] = deque()  # (time, value), values rising

    def push(self, at: float, value: float) -> None:
        c = self._candidates
        while c and c[-1][1] >= value:  # never the minimum again while `value` is in the window
            c.pop()
        c.append((at, value))
        self.expire(at)

    def expire(self, now: float) -> None:
        c = self._candidates
        while c and c[0][0] < now - self.horizon_s:
            c.popleft()

    def min(self) -> float | None:
        return self._candidates[0][1] if self._candidates else None


class BrokerClock:
    def __init__(
        self,
        tolerance_s: float = TOLERANCE_S,
        horizon_s: float = HORIZON_S,
        offset_s: float = 0.0,
    ) -> None:
        self.tolerance_s = tolerance_s
        self.offset_s = offset_s  # LEAP_FAULT_CLOCK_OFFSET_S: a host off by this much (tests)
        self._gaps = WindowMin(horizon_s)  # host − record time, over the horizon
        self._settled = WindowMin(horizon_s)  # the same, of caught-up batches only
        self._lock = threading.Lock()  # the submissions loop observes, both agents read

    def host(self) -> float:
        """The host's wall clock (epoch seconds), as the worker reads it."""
        return time.time() + self.offset_s

    def observe(self, host_now: float, records: Sequence[Record], caught_up: bool = False) -> None:
        """One batch's records as they are read at `host_now` (epoch seconds); ``caught_up``:
        the reader knows the batch reached (within a batch) its partitions' ends."""
        appended = [r.timestamp for r in records if r.timestamp is not None and r.log_append]
        created = [r.timestamp for r in records if r.timestamp is not None and not r.log_append]
        if appended:
            gap = host_now - max(appended)  # the broker's own clock: the freshest record
        elif created:
            gap = host_now - statistics.median(created)  # producers' clocks: their majority
        else:
            return
        with self._lock:
            self._gaps.push(host_now, gap)
            if caught_up:
                self._settled.push(host_now, gap)
            else:
                self._settled.expire(host_now)

    def skew(self) -> float | None:
        """The host's offset from the records' clock (s, negative: behind); None before any
        record with a timestamp."""
        with self._lock:
            return self._gaps.min()

    def ahead(self) -> float | None:
        """The smallest gap of the caught-up batches over the horizon: the host's lead at
        most; None without one."""
        with self._lock:
            return self._settled.min()

    def read(self, records: Sequence[Record], caught_up: bool = False) -> datetime:
        """Observe `records` as read now; the time to judge them by (UTC)."""
        host = self.host()
        self.observe(host, records, caught_up)
        return datetime.fromtimestamp(self.now(host), UTC)

    def current(self) -> datetime:
        """The time to judge events by now (UTC), observing nothing."""
        return datetime.fromtimestamp(self.now(self.host()), UTC)

    def now(self, host_now: float) -> float:
        """The time to judge events by: the host's, or the broker's where the host is behind
        or (seen on caught-up batches) ahead."""
        skew = self.skew()
        if skew is not None and skew < -self.tolerance_s:
            return host_now - skew
        ahead = self.ahead()
        if ahead is not None and ahead > self.tolerance_s:
            return host_now - ahead
        return host_now


__all__ = ["HORIZON_S", "TOLERANCE_S", "BrokerClock", "WindowMin"]
