"""An asyncio event loop whose clock jumps to the next timer instead of waiting for it.

The ``TopologyTestDriver`` runs tasks on one of these, so a back-off of
``retry.backoff.ms``, a ``task.timeout.ms`` deadline or a sleep (``anyio.sleep``) in an
``async def`` processor takes no real time, and the same inputs always give the same
timings. When nothing is ready to run, the loop looks for I/O without waiting and, if
there is none, moves its clock to the next timer. While a socket is registered (a
processor talking to a real service), time runs at real speed instead, so a real
network call is not cut short by a timer that jumped. When the next timer is the
caller's ``deadline``, the loop first waits up to ``real_grace_s`` of real time for work
on other threads to wake it, and only then jumps to the deadline.
"""

from __future__ import annotations

import asyncio
import selectors
import time
from collections.abc import Mapping
from typing import Any


class _JumpingSelector(selectors.BaseSelector):
    """Wraps the default selector; ``select(t)`` with nothing to read moves the loop's clock by ``t``.

    Caller: the event loop's ``_run_once`` asks it to wait ``t`` seconds, the time to its next timer.
    """

    def __init__(self) -> None:
        self._inner = selectors.DefaultSelector()
        self.loop: VirtualTimeLoop | None = None
        # Registrations the loop makes for itself (its self-pipe); more than that means real I/O.
        self.baseline = 0

    def register(self, fileobj: Any, events: int, data: Any = None) -> selectors.SelectorKey:
        return self._inner.register(fileobj, events, data)

    def unregister(self, fileobj: Any) -> selectors.SelectorKey:
        return self._inner.unregister(fileobj)

    def modify(self, fileobj: Any, events: int, data: Any = None) -> selectors.SelectorKey:
        return self._inner.modify(fileobj, events, data)

    def get_map(self) -> Mapping[Any, selectors.SelectorKey]:
        return self._inner.get_map()

    def close(self) -> None:
        self._inner.close()

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        loop = self.loop
        if loop is None or timeout == 0:
            return self._inner.select(timeout)
        if len(self._inner.get_map()) > self.baseline or timeout is None:
            # Real I/O may be under way (or nothing is scheduled at all): wait for real.
            started = time.monotonic()
            events = self._inner.select(timeout)
            loop.advance(time.monotonic() - started)
            return events
        deadline = loop.deadline
        if deadline is not None and loop.time() + timeout >= deadline - 1e-6:
            # Only the caller's deadline is left: nothing on this loop can move on by itself, but
            # work on another thread (an executor, anyio.to_thread) may still wake it up.
            started = time.monotonic()
            events = self._inner.select(min(timeout, loop.real_grace_s))
            if events:
                loop.advance(time.monotonic() - started)
                return events
            loop.advance(timeout)
            return events
        events = self._inner.select(0)
        if not events:
            loop.advance(timeout)
        return events


class VirtualTimeLoop(asyncio.SelectorEventLoop):  # a loop whose clock jumps is a loop class: no anyio API
    """``time()`` is virtual: it starts at 0 and moves only when the loop would otherwise sleep."""

    def __init__(self, real_grace_s: float = 1.0) -> None:
        self._virtual_now = 0.0
        # Set by the caller around a bounded call: the loop time at which it gives up.
        self.deadline: float | None = None
        self.real_grace_s = real_grace_s
        selector = _JumpingSelector()
        super().__init__(selector)
        selector.baseline = len(selector.get_map())
        selector.loop = self

    def time(self) -> float:
        return self._virtual_now

    def advance(self, seconds: float) -> None:
        if seconds > 0:
            self._virtual_now += seconds

    def time_ms(self) -> int:
        """The virtual clock in whole milliseconds (the engine's timers count in ms)."""
        return int(self._virtual_now * 1000)
