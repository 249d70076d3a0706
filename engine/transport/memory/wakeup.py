"""Waking one consumer's ``poll`` on its own event loop, from any thread.

This is the memory transport's one crossing of a thread boundary: the broker runs
under a ``threading.Lock`` on whichever stream thread calls it, and when something
a consumer waits for happens (records appended, a rebalance step) it calls
:meth:`LoopWakeup.wake`, which only enqueues the wake-up on the consumer's loop
(``streamloop.loop_signal``). The consumer's loop is never blocked and never touched
from another thread.
"""

from __future__ import annotations

from streamloop.loop_signal import LoopSignal


class LoopWakeup(LoopSignal):
    """A consumer's wake-up (a ``LoopSignal``): the owner binds it in ``start``/``poll``, clears it
    before it looks at the broker's state and waits after; wake-ups before ``bind``, or after
    the loop closed, are dropped: the owner looks at the broker's state again on its next call."""

    __slots__ = ()

    def wake(self) -> None:
        """Safe from any thread, with or without the broker lock held."""
        self.set()
