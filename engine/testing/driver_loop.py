"""How the test driver runs a call: to completion, on its own virtual-time loop, within a budget.

Each driver call runs a coroutine on the driver's ``VirtualTimeLoop``, so a back-off or a
``task.timeout.ms`` deadline takes no real time. A call that does not finish within
``task.timeout.ms + max.poll.interval.ms`` of that time fails with ``DriverTimeoutError``,
naming the task (and its processor and record) that was running when time ran out.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Coroutine
from typing import TYPE_CHECKING, Any, TypeVar

import anyio

from streamloop.errors import IllegalStateError
from streamloop.testing.driver_errors import DriverTimeoutError
from streamloop.testing.virtual_time import VirtualTimeLoop

if TYPE_CHECKING:
    from streamloop.tasks.task import StreamTask

T = TypeVar("T")


class DriverLoop:
    def __init__(self, budget_ms: int) -> None:
        self.loop = VirtualTimeLoop()
        self.budget_ms = budget_ms
        # The task the driver is running now: the one to name if the call never finishes.
        self.current: StreamTask | None = None

    @staticmethod
    def refuse_running_loop() -> None:
        try:
            asyncio.get_running_loop()  # any running loop at all, anyio or not, is the caller's
        except RuntimeError:
            return
        raise IllegalStateError(
            "TopologyTestDriver calls run the driver's own event loop and cannot be made from a "
            "coroutine on a running loop; call them from a plain test function, or from a worker "
            "thread (await anyio.to_thread.run_sync(driver.pipe_input, ...))")

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        try:
            self.refuse_running_loop()
        except IllegalStateError:
            coro.close()
            raise
        return self.loop.run_until_complete(self._bounded(coro))

    def close(self) -> None:
        self.loop.close()

    async def _bounded(self, work: Awaitable[T]) -> T:
        budget_s = self.budget_ms / 1000.0
        self.loop.deadline = self.loop.time() + budget_s
        try:
            # The scope's deadline is on the loop's clock, which is virtual here: it passes when
            # the driver's time does. A TimeoutError from the work itself goes through unchanged.
            with anyio.move_on_after(budget_s):
                return await work
            raise self._stuck()
        finally:
            self.current = None
            self.loop.deadline = None

    def _stuck(self) -> DriverTimeoutError:
        task = self.current
        if task is None:
            return DriverTimeoutError(None, "<unknown>", None, None, None, self.budget_ms)
        ctx = task.context
        node = ctx.forwarder.node
        return DriverTimeoutError(task.id, node.name if node is not None else "<unknown>", ctx.topic,
                                  ctx.partition, ctx.offset, self.budget_ms)
