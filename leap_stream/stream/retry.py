"""The one retry loop of the worker: an infrastructure step (Redis, the broker, the dataset) is
retried with capped exponential backoff until it succeeds, and given up only when the worker is
asked to stop meanwhile. Giving up raises `Unfinished`: what the step was for stays uncommitted
and is redone after a restart (the delivery guarantees in docs/worker.md).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, TypeVar

log = logging.getLogger(__name__)
T = TypeVar("T")

FIRST_DELAY_S = 0.2


class Unfinished(RuntimeError):
    """The worker was asked to stop while a step could not be made durable."""


def store_failed(exc: BaseException) -> bool:
    """Whether an exception is Redis (or the online store over it) failing: counted per step in
    `leap_redis_errors_total`."""
    name = type(exc).__name__
    return "Redis" in name or "OnlineStore" in name


class Retry:
    """``run(what, fn, *args)`` until it succeeds.

    ``stopping()`` says whether the worker is asked to stop; ``wait(seconds)`` sleeps and
    returns True when woken early by a stop (a `threading.Event.wait`); ``on_store_error(what)``
    counts a Redis failure. The loop runs in the thread that does the work.
    """

    def __init__(
        self,
        stopping: Callable[[], bool],
        wait: Callable[[float], bool],
        on_store_error: Callable[[str], object] = lambda _what: None,
        cap_s: float = 10.0,
    ) -> None:
        self.stopping = stopping
        self.wait = wait
        self.on_store_error = on_store_error
        self.cap_s = cap_s

    def run(self, what: str, fn: Callable[..., T], *args: Any) -> T:
        delay = FIRST_DELAY_S
        while True:
            try:
                return fn(*args)
            except Exception as exc:
                if store_failed(exc):
                    self.on_store_error(what)
                if self.stopping():
                    # nothing more is committed: a commit or a close could block on the very
                    # outage that stops this step, and what is uncommitted is redone at worst
                    log.error(
                        "stopping while %s fails (%r): exiting without committing it", what, exc
                    )
                    raise Unfinished(what) from exc
                log.warning("%s failed (%r); retrying in %.1fs", what, exc, delay)
                if self.wait(delay):
                    continue  # asked to stop while waiting: the next failure gives up
                delay = min(self.cap_s, delay * 2)


__all__ = ["Retry", "Unfinished", "store_failed"]
