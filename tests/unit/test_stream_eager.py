"""Eager delivery (stream/eager.py): same outcome as mode's wait_first, fewer tasks."""

from __future__ import annotations

import asyncio
import warnings
from typing import Any

import pytest
from mode import Service
from mode.utils.locks import Event

from leap_stream.stream.eager import Resumed, eager_message_delivery, eager_wait_first


class FakeConsumer(Service):
    """The parts of Faust's consumer the drain loop's wait_first touches."""

    def __init__(self) -> None:
        super().__init__()
        self.suspend_flow = Event()
        self.calls = 0


FakeConsumer.wait_first = eager_wait_first(Service.wait_first)  # type: ignore[method-assign]


def _run(coro: Any) -> Any:
    return asyncio.run(coro)


def test_a_callback_that_does_not_block_runs_without_any_task() -> None:
    made: list[Any] = []
    delivered: list[int] = []

    def counting_factory(loop: Any, coro: Any, **kw: Any) -> asyncio.Task[Any]:
        made.append(coro)
        return asyncio.Task(coro, loop=loop, **kw)

    async def main() -> Any:
        c = FakeConsumer()
        asyncio.get_running_loop().set_task_factory(counting_factory)

        async def callback() -> str:
            delivered.append(1)
            return "ok"

        with warnings.catch_warnings():
            warnings.simplefilter("error")  # the unused suspend-flow wait is closed, not leaked
            res = await c.wait_first(callback(), c.suspend_flow.wait())
        return res, len(made)

    res, tasks = _run(main())
    assert res.results == ["ok"] and not res.stopped
    assert delivered == [1] and tasks == 0


def test_a_callback_that_blocks_finishes_through_the_original_path() -> None:
    async def main() -> list[str]:
        c = FakeConsumer()
        gate: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        seen: list[str] = []

        async def callback() -> str:
            seen.append("started")
            await gate  # a full stream buffer
            seen.append("delivered")
            return "ok"

        asyncio.get_running_loop().call_later(0.01, gate.set_result, None)
        res = await c.wait_first(callback(), c.suspend_flow.wait())
        assert res.results == ["ok"]
        return seen

    assert _run(main()) == ["started", "delivered"]


def test_a_blocked_callback_is_abandoned_when_the_flow_is_suspended() -> None:
    async def main() -> tuple[list[str], bool]:
        c = FakeConsumer()
        never: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        seen: list[str] = []

        async def callback() -> None:
            seen.append("started")
            try:
                await never
            except asyncio.CancelledError:
                seen.append("cancelled")
                raise
            seen.append("delivered")

        asyncio.get_running_loop().call_later(0.01, c.suspend_flow.set)
        await c.wait_first(callback(), c.suspend_flow.wait())
        await asyncio.sleep(0.01)  # let the loser's cancellation run
        return seen, never.cancelled()

    seen, cancelled = _run(main())
    assert seen == ["started", "cancelled"] and cancelled


def test_an_error_in_the_first_step_propagates() -> None:
    async def main() -> None:
        c = FakeConsumer()

        async def callback() -> None:
            raise ValueError("bad message")

        await c.wait_first(callback(), c.suspend_flow.wait())

    with pytest.raises(ValueError, match="bad message"):
        _run(main())


def test_a_suspended_flow_takes_the_original_path_whole() -> None:
    made: list[Any] = []

    def counting_factory(loop: Any, coro: Any, **kw: Any) -> asyncio.Task[Any]:
        made.append(coro)
        return asyncio.Task(coro, loop=loop, **kw)

    async def main() -> tuple[Any, int]:
        c = FakeConsumer()
        c.suspend_flow.set()
        asyncio.get_running_loop().set_task_factory(counting_factory)

        async def callback() -> str:
            return "ok"

        res = await c.wait_first(callback(), c.suspend_flow.wait())
        return res, len(made)

    res, tasks = _run(main())
    assert tasks == 4  # mode's own wait_first: callback, flow, stopped, crashed
    assert True in res.results  # the suspended flow is among the winners


def test_resumed_carries_on_through_several_suspensions_and_bare_yields() -> None:
    async def main() -> int:
        loop = asyncio.get_running_loop()
        futs = [loop.create_future() for _ in range(3)]

        async def work() -> int:
            total = 0
            for f in futs:
                total += await f
                await asyncio.sleep(0)  # a bare yield to the loop
            return total

        coro = work()
        first = coro.send(None)
        for i, f in enumerate(futs):
            loop.call_later(0.001 * (i + 1), f.set_result, i + 1)
        return await Resumed(coro, first)

    assert _run(main()) == 6


def test_installing_twice_wraps_faust_once() -> None:
    from faust.transport.consumer import Consumer

    eager_message_delivery()
    first = Consumer.wait_first
    eager_message_delivery()
    assert Consumer.wait_first is not first  # rebuilt, but around the same original
    assert Consumer._leap_original_wait_first is Service.wait_first  # type: ignore[attr-defined]
