"""``RunOnce``: work several coroutines of a stream thread's loop wait for, run by the first there.

A Spark job shared by several tasks (``streamloop.tasks.bulk_jobs``) and each step of a group of
offset ranges (``streamloop.tasks.range_jobs``) run once, by whichever task's coroutine gets there
first, while the others wait for it. If the runner is cancelled (its task closed dirty), the work is
not done: the next waiter runs it instead, so no task waits for a runner that is gone.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import anyio


class RunOnce:
    """Done once ``run`` (given to ``settle``) has set ``done``; until then one waiter at a time runs it."""

    __slots__ = ("_changed", "done", "running")

    def __init__(self) -> None:
        self.done = False
        self.running = False
        self._changed = anyio.Event()  # set (and replaced) when a run ended, done or given up

    async def settle(self, run: Callable[[], Awaitable[object]]) -> None:
        """Until done: wait for the run under way, or run ``run`` (which sets ``done``) if none is."""
        while not self.done:
            if self.running:
                await self._changed.wait()
                continue
            self.running = True
            try:
                await run()
            finally:
                self.running = False
                changed, self._changed = self._changed, anyio.Event()
                changed.set()
