"""The worker's one retry loop: backoff until success, give up only at a stop, count Redis."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from leap_stream.stream.retry import Retry, Unfinished


class RedisDown(Exception):
    """Named like a Redis failure, as store_failed recognises them."""


class Clock:
    def __init__(self) -> None:
        self.waits: list[float] = []
        self.stop_after: int | None = None  # stop once this many waits happened

    def wait(self, seconds: float) -> bool:
        self.waits.append(seconds)
        return False

    def stopping(self) -> bool:
        return self.stop_after is not None and len(self.waits) >= self.stop_after


def _failing(times: int, exc: Exception) -> tuple[list[int], Callable[[int], int]]:
    calls: list[int] = []

    def fn(x: int) -> int:
        calls.append(x)
        if len(calls) <= times:
            raise exc
        return x * 2

    return calls, fn


def test_retries_with_capped_backoff_until_it_succeeds() -> None:
    clock, counted = Clock(), []
    retry = Retry(clock.stopping, clock.wait, counted.append, cap_s=1.0)
    calls, fn = _failing(5, RedisDown("down"))
    assert retry.run("rank", fn, 21) == 42
    assert len(calls) == 6
    assert clock.waits == [0.2, 0.4, 0.8, 1.0, 1.0]
    assert counted == ["rank"] * 5


def test_a_failure_that_is_not_redis_is_retried_but_not_counted() -> None:
    clock, counted = Clock(), []
    calls, fn = _failing(2, RuntimeError("broker"))
    assert Retry(clock.stopping, clock.wait, counted.append).run("produce", fn, 1) == 2
    assert counted == [] and len(calls) == 3


def test_a_stop_gives_up_with_unfinished() -> None:
    clock = Clock()
    clock.stop_after = 2
    _calls, fn = _failing(100, RedisDown("still down"))
    with pytest.raises(Unfinished, match="apply"):
        Retry(clock.stopping, clock.wait).run("apply", fn, 1)
    assert len(clock.waits) == 2


def test_woken_by_a_stop_the_next_failure_gives_up_at_once() -> None:
    waits: list[float] = []
    stopped = {"now": False}

    def wait(seconds: float) -> bool:  # a stop arrives during the first wait
        waits.append(seconds)
        stopped["now"] = True
        return True

    _calls, fn = _failing(100, RedisDown("down"))
    with pytest.raises(Unfinished):
        Retry(lambda: stopped["now"], wait).run("rank", fn, 1)
    assert waits == [0.2]
