"""``LoopSignal``: wake a waiter on one event loop from any thread, never waiting for that loop.

anyio's way into another thread's loop, ``anyio.from_thread.run_sync(..., token=...)``,
blocks the caller until that loop has run the call. The callers here cannot wait: a
state machine's listener runs under the machine's lock, and the memory broker wakes
consumers under its own lock, while the loop to be woken may itself be waiting for
that lock. So ``set`` only enqueues the wake-up on the owner's loop (its thread-safe
callback queue) and returns at once; the waiter uses an ``anyio.Event`` on its loop.
"""

from __future__ import annotations

import contextlib

import anyio
import anyio.lowlevel

from streamloop.errors import IllegalStateError


class LoopSignal:
    """A settable, clearable signal owned by the loop that first ``bind``s it.

    The owner calls ``bind`` from its loop, then ``clear`` before it looks at what it waits
    for and ``wait`` after, so a ``set`` that races with the look is never lost (at worst
    the wake-up is spurious). A ``set`` before ``bind``, or after the owner's loop closed,
    is dropped: the owner looks again on its next call anyway.
    """

    __slots__ = ("_event", "_loop", "name")

    def __init__(self, name: str) -> None:
        self.name = name
        # The owner's native loop (the asyncio loop under anyio's token): the one object with
        # a thread-safe, non-blocking way in (``call_soon_threadsafe``).
        self._loop: object | None = None
        self._event = anyio.Event()

    def bind(self) -> None:
        """Tie this signal to the running loop; it belongs to one loop only."""
        loop = anyio.lowlevel.current_token().native_token
        if self._loop is None:
            self._loop = loop
        elif self._loop is not loop:
            raise IllegalStateError(
                f"{self.name} is used from a second event loop; it belongs to the loop that first used it.")

    def set(self) -> None:
        """Safe from any thread, with any lock held: only enqueues the wake-up on the owner's loop."""
        loop = self._loop
        if loop is None:
            return
        with contextlib.suppress(RuntimeError):  # the owner's loop is closed: nothing waits any more
            # Not anyio.from_thread.run_sync: it would block until the owner's loop runs the call.
            loop.call_soon_threadsafe(self._set_on_loop)  # type: ignore[attr-defined]  # the asyncio loop

    def _set_on_loop(self) -> None:
        self._event.set()

    def clear(self) -> None:
        """On the owner's loop. (An anyio.Event cannot be cleared: a set one is replaced.)"""
        if self._event.is_set():
            self._event = anyio.Event()

    def is_set(self) -> bool:
        return self._event.is_set()

    async def wait(self) -> None:
        """Until set (bound it with ``anyio.move_on_after`` / ``fail_after``)."""
        await self._event.wait()
