"""Eager delivery of each fetched message in Faust's drain loop (``LEAP_EAGER_DELIVERY=1``).

Faust's fetch loop hands every message to the streams with
``await self.wait_first(callback(message), self.suspend_flow.wait())`` (faust
``transport/consumer.py``, ``_drain_messages``): mode's ``wait_first`` wraps the callback, the
suspend-flow event and the consumer's stopped and crashed events in four new tasks, waits for
the first with ``asyncio.wait`` and cancels the other three. That is the point of it only when
the callback blocks (a full stream buffer) while a rebalance suspends the flow: the blocked
delivery is then abandoned. Nearly always the callback finishes without ever blocking, and the
tasks cost about as much event-loop time as ranking the event (docs/benchmarks.md).

Here the callback's first step runs at once, as Python 3.12's eager tasks would run it. If it
finishes, that is the result, with no task made. If it suspends, the started coroutine goes to
the original ``wait_first`` together with the suspend-flow wait: from there on, abandoning on a
suspended flow, stop or crash, and exceptions, are exactly Faust's. Any other call, or one made
while the flow is already suspended or the consumer stopping, takes the original path whole.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable, Generator
from typing import Any

_PATCHED = "_leap_original_wait_first"


class Resumed:
    """An awaitable that carries on a coroutine already run to its first suspension."""

    __slots__ = ("coro", "step")

    def __init__(self, coro: Any, step: Any) -> None:
        self.coro = coro
        self.step = step  # what the coroutine yielded: the future it waits on (or None)

    def __await__(self) -> Generator[Any, None, Any]:
        coro, step = self.coro, self.step
        while True:
            try:
                yield step
            except BaseException as exc:  # cancellation (or any throw) goes to the coroutine
                try:
                    step = coro.throw(exc)
                except StopIteration as done:
                    return done.value
                continue
            try:
                step = coro.send(None)
            except StopIteration as done:
                return done.value


def eager_wait_first(original: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
    """``wait_first`` for Faust's consumer with the drain loop's call made eager (see above)."""
    from mode.services import WaitResults

    async def wait_first(self: Any, *coros: Any, timeout: Any = None) -> Any:
        if (
            timeout is None
            and len(coros) == 2
            and inspect.iscoroutine(coros[0])
            and inspect.iscoroutine(coros[1])
            and coros[1].__qualname__.endswith("Event.wait")
            and not self.suspend_flow.is_set()
            and not self._stopped.is_set()
            and not self._crashed.is_set()
        ):
            callback, flow = coros
            try:
                step = callback.send(None)
            except StopIteration as done:
                flow.close()
                return WaitResults([callback], [done.value], False)
            except BaseException:
                flow.close()
                raise
            return await original(self, Resumed(callback, step), flow, timeout=timeout)
        return await original(self, *coros, timeout=timeout)

    return wait_first


def eager_message_delivery() -> None:
    """Install `eager_wait_first` on Faust's consumer class (idempotent)."""
    from faust.transport.consumer import Consumer

    cls: Any = Consumer
    original = getattr(cls, _PATCHED, None) or cls.wait_first
    setattr(cls, _PATCHED, original)
    cls.wait_first = eager_wait_first(original)


__all__ = ["Resumed", "eager_message_delivery", "eager_wait_first"]
