"""Whether a consumer's group membership has settled, read from librdkafka's statistics.

Why: after a broker restart a librdkafka consumer can stay out of its group for good. In CI
the submissions consumer's session timed out as the broker came back, and its rejoin request
then sat unsent in the coordinator's queue, timing out every 60 s, for five minutes: no error
reached the application, the loop simply got no more messages. librdkafka reports the group
state (``cgrp.state``, ``cgrp.join_state``) in the statistics it emits anyway; a consumer that
has not been ``up``/``steady`` for ``LEAP_CONSUMER_STALL_S`` is replaced by a new one
(`SubmissionLoop`). A settled member with no partitions (more workers than partitions) is
healthy.
"""

from __future__ import annotations

from dataclasses import dataclass

import orjson

SETTLED = ("up", "steady")


def group_state(stats_json: str | bytes) -> tuple[str, str] | None:
    """(state, join_state) of the consumer group in a librdkafka statistics document."""
    try:
        cgrp = orjson.loads(stats_json).get("cgrp")
    except (orjson.JSONDecodeError, AttributeError):
        return None
    if not isinstance(cgrp, dict):
        return None
    return str(cgrp.get("state")), str(cgrp.get("join_state"))


@dataclass
class GroupHealth:
    """How long a consumer has been outside a settled group, on the caller's clock."""

    limit_s: float
    unsettled_since: float | None = None
    last: tuple[str, str] | None = None

    def restart(self, now: float) -> None:
        """A new consumer: outside its group until its statistics say otherwise."""
        self.unsettled_since = now
        self.last = None

    def observe(self, state: tuple[str, str], now: float) -> None:
        self.last = state
        if state == SETTLED:
            self.unsettled_since = None
        elif self.unsettled_since is None:
            self.unsettled_since = now

    def unsettled_for(self, now: float) -> float:
        return 0.0 if self.unsettled_since is None else max(0.0, now - self.unsettled_since)

    @property
    def watching(self) -> bool:
        """A limit of 0 turns the watch off (``LEAP_CONSUMER_STALL_S=0``)."""
        return self.limit_s > 0

    def stalled(self, now: float) -> bool:
        return (
            self.watching
            and self.unsettled_since is not None
            and self.unsettled_for(now) >= self.limit_s
        )


def stats_interval_ms(limit_s: float) -> int:
    """Statistics often enough to see a stall within a quarter of the limit, at most every 5 s."""
    return int(min(5.0, max(0.5, limit_s / 4)) * 1000)


__all__ = ["SETTLED", "GroupHealth", "group_state", "stats_interval_ms"]
