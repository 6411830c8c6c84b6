"""Completions waiting for their submission to be joined: bounded, and retried with backoff.

A completion can arrive before the submissions loop has remembered its submission (that loop is
behind); it waits, unacked, and its join is retried until the grace period ends, then it is an
orphan. A flood of completions whose submission never comes must not stall the honest ones:
each partition holds at most `capacity` waiting completions (the rest are dead-lettered as
``waiting_overflow`` at once), and a waiting completion is looked up again after a delay that
doubles from `first_retry_s` up to `max_retry_s`, so a retry round touches the completions that
are due, not every one that waits. Pure: times are the caller's monotonic seconds.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from leap_stream.stream.batch import Record


@dataclass
class Waiting:
    """One waiting completion: its Faust event (acked once decided), record and event."""

    event: Any
    record: Record
    completion: dict[str, Any]
    since: float  # first seen
    next_try: float
    delay: float


class WaitingCompletions:
    def __init__(
        self, capacity: int, grace_s: float, first_retry_s: float = 0.25, max_retry_s: float = 1.0
    ) -> None:
        self.capacity, self.grace_s = capacity, grace_s
        self.first_retry_s, self.max_retry_s = first_retry_s, max_retry_s
        self._items: list[Waiting] = []
        self._per_partition: dict[int, int] = {}

    def __len__(self) -> int:
        return len(self._items)

    def add(
        self, items: list[tuple[Any, Record, dict[str, Any]]], now: float
    ) -> list[tuple[Any, Record, dict[str, Any]]]:
        """Start waiting; returns those over their partition's capacity (not added)."""
        over = []
        for event, record, completion in items:
            held = self._per_partition.get(record.partition, 0)
            if held >= self.capacity:
                over.append((event, record, completion))
                continue
            self._per_partition[record.partition] = held + 1
            delay = self.first_retry_s
            self._items.append(Waiting(event, record, completion, now, now + delay, delay))
        return over

    def due(self, now: float) -> list[Waiting]:
        """Those whose next try has come, or whose grace has ended (to be given up)."""
        return [w for w in self._items if w.next_try <= now or self.expired(w, now)]

    def expired(self, w: Waiting, now: float) -> bool:
        return now - w.since >= self.grace_s

    def retry_later(self, w: Waiting, now: float) -> None:
        """Still not joinable: the next try after twice the last delay (at most the cap)."""
        w.delay = min(self.max_retry_s, 2.0 * w.delay)
        w.next_try = now + w.delay

    def remove(self, done: list[Waiting]) -> None:
        gone = {id(w) for w in done}
        self._items = [w for w in self._items if id(w) not in gone]
        for w in done:
            self._per_partition[w.record.partition] -= 1

    def clear(self) -> None:
        self._items, self._per_partition = [], {}


__all__ = ["Waiting", "WaitingCompletions"]
