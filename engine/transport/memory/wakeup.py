"""Waking one consumer's ``poll`` on its own event loop, from any thread.

This is the memory transport's one crossing of a thread boundary: the broker runs
under a ``threading.Lock`` on whichever stream thread calls it, and when something
a consumer waits for happens (records appended, a rebalance step) it calls
:meth:`LoopWakeup.wake`, which schedules ``Event.set`` on the consumer's loop with
``call_soon_threadsafe``. The consumer's loop is never blocked and never touched
from another thread.
"""

from __future__ import annotations

import asyncio

from engine.errors import IllegalStateError


class LoopWakeup:
    """An ``asyncio.Event`` owned by one loop that any thread may set.

    The owner calls :meth:`bind` from its loop (``start``/``poll``), then
    :meth:`clear` before it looks at the broker's state and :meth:`wait` after, so
    a wake-up that races with the look is never lost (at worst it is spurious).
    Wake-ups before :meth:`bind`, or after the loop closed, are dropped: the owner
    looks at the broker's state again on its next call anyway.
    """

    __slots__ = ("_loop", "_event", "name")

    def __init__(self, name: str) -> None:
        self.name = name
        self._loop: asyncio.AbstractEventLoop | None = None
        self._event = asyncio.Event()

    def bind(self) -> None:
        """Tie this wake-up to the running loop; a client belongs to one loop only."""
        loop = asyncio.get_running_loop()
        if self._loop is None:
            self._loop = loop
        elif self._loop is not loop:
            raise IllegalStateError(
                f"{self.name} is used from a second event loop; a transport client belongs "
                "to the stream thread whose loop first used it."
            )

    def wake(self) -> None:
        """Safe from any thread, with or without the broker lock held."""
        loop = self._loop
        if loop is None:
            return
        try:
            loop.call_soon_threadsafe(self._event.set)
        except RuntimeError:
            # The owner's loop is closed: its consumer is gone and nothing waits.
            pass

    def clear(self) -> None:
        self._event.clear()

    async def wait(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds; True when woken, False on timeout."""
        if self._event.is_set():
            return True
        if timeout <= 0:
            return False
        try:
            async with asyncio.timeout(timeout):
                await self._event.wait()
        except TimeoutError:
            return False
        return True
